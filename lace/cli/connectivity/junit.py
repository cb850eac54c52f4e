"""JUnit XML for a connectivity run (xml.etree, stdlib): one testsuite, one testcase per scenario
(classname = the scenario's group, name = its full name), ``<failure>`` with the reason and the
flows seen, ``<skipped>`` with what the cluster lacks."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from typing import Any

from .judge import FAIL, SKIP, Result

SUITE = "lace connectivity test"


def to_xml(results: Sequence[Result], *, duration: float, timestamp: str = "", hostname: str = "",
           properties: dict[str, str] | None = None,
           flow_text: Callable[[dict[str, Any]], str] = lambda f: str(f)) -> bytes:
    failures = sum(r.status == FAIL for r in results)
    skipped = sum(r.status == SKIP for r in results)
    suites = ET.Element("testsuites", name=SUITE, tests=str(len(results)), failures=str(failures),
                        errors="0", skipped=str(skipped), time=f"{duration:.3f}")
    suite = ET.SubElement(suites, "testsuite", name=SUITE, tests=str(len(results)), failures=str(failures),
                          errors="0", skipped=str(skipped), time=f"{duration:.3f}")
    if timestamp:
        suite.set("timestamp", timestamp)
    if hostname:
        suite.set("hostname", hostname)
    if properties:
        props = ET.SubElement(suite, "properties")
        for k, v in properties.items():
            ET.SubElement(props, "property", name=k, value=v)
    for r in results:
        case = ET.SubElement(suite, "testcase", classname=r.scenario.group, name=r.scenario.name,
                             time=f"{r.duration:.3f}")
        if r.status == FAIL:
            f = ET.SubElement(case, "failure", message=r.message, type="ConnectivityFailure")
            body = [r.scenario.description, r.message]
            if r.output.strip():
                body += ["output:", r.output.rstrip()]
            body += ["flows seen:"] + ([flow_text(x) for x in r.flows] or ["(none)"])
            f.text = "\n".join(body)
        elif r.status == SKIP:
            ET.SubElement(case, "skipped", message=r.message)
        elif r.output.strip():
            ET.SubElement(case, "system-out").text = r.output.rstrip()
    ET.indent(suites)
    return ET.tostring(suites, encoding="utf-8", xml_declaration=True) + b"\n"


def write(path: str, data: bytes) -> None:
    """Write atomically (a reader never sees half a report)."""
    from lace.lab.files import replacing
    with replacing(path, prefix=".junit.", suffix="") as tmp, open(tmp, "wb") as f:
        f.write(data)
