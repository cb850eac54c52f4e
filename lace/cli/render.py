"""Rendering: kubectl-style tables (rich), ``-o json`` (one document), ``-o yaml``, ``-o name``, errors.

Each kind's columns are declared once in ``COLUMNS``; ``wide`` columns appear with ``-o wide``.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TextIO

import orjson
import yaml
from rich.console import Console
from rich.table import Table

from lace.store import kinds as K
from lace.store.selectors import format_selector

NONE = "<none>"


def print_error(stream: TextIO, message: str, hint: str | None = None) -> None:
    """``error: <message>`` and, when there is one, ``hint: <hint>`` — never a traceback."""
    stream.write(f"error: {message}\n")
    if hint:
        stream.write(f"hint: {hint}\n")
    stream.flush()


def print_unexpected(stream: TextIO, err: BaseException, env: Any) -> None:
    """The last line of defence of ``lace`` and ``node``: one line naming the exception, and the
    traceback only when LACE_DEBUG asks for it."""
    debug = bool(env.get("LACE_DEBUG"))
    if debug:
        import traceback
        traceback.print_exception(err, file=stream)
    print_error(stream, f"unexpected {type(err).__name__}: {err}",
                None if debug else "this is a bug in lace; set LACE_DEBUG=1 to see the traceback")


def dump_json(doc: Any) -> str:
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"


class _Dumper(yaml.SafeDumper):
    pass


def dump_yaml(doc: Any) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)


def list_document(items: list[dict], resource_version: str = "") -> dict:
    """A Kubernetes ``List`` of objects, as ``kubectl get -o json`` prints one."""
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": resource_version},
            "items": items}


def write_document(stream: TextIO, doc: Any, fmt: str) -> None:
    stream.write(dump_json(doc) if fmt == "json" else dump_yaml(doc))


def object_name(obj: Mapping[str, Any]) -> str:
    """``pod/web``, ``network.lace.dev/blue``: ``-o name`` and apply's output."""
    info = K.kind_info(obj["kind"])
    return f"{info.qualified_singular}/{obj['metadata']['name']}"


# ---- cell helpers ------------------------------------------------------------------------------

def age(timestamp: str | None, now: datetime.datetime | None = None) -> str:
    """kubectl's AGE: 45s, 12m, 3h, 5d, 2y (with a second unit while short: 3m20s, 5h4m, 3d4h)."""
    if not timestamp:
        return NONE
    try:
        then = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    except ValueError:
        return NONE
    now = now or datetime.datetime.now(datetime.UTC)
    secs = max(0, int((now - then).total_seconds()))
    if secs < 120:
        return f"{secs}s"
    mins = secs // 60
    if mins < 10:
        return f"{mins}m{secs % 60}s" if secs % 60 else f"{mins}m"
    if mins < 180:
        return f"{mins}m"
    hours = mins // 60
    if hours < 8:
        return f"{hours}h{mins % 60}m" if mins % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if days < 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    return f"{days // 365}y"


def _get(obj: Mapping[str, Any], *path: str) -> Any:
    cur: Any = obj
    for part in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    return cur


def _join(values: Iterable[Any]) -> str:
    text = ",".join(str(v) for v in values if v not in (None, ""))
    return text or NONE


def _labels(obj: Mapping[str, Any]) -> str:
    labels = _get(obj, "metadata", "labels") or {}
    return _join(f"{k}={v}" for k, v in labels.items())


def _pod_ips(pod: Mapping[str, Any]) -> str:
    ips = [e.get("ip") for e in (_get(pod, "status", "podIPs") or []) if isinstance(e, Mapping)]
    if not ips and _get(pod, "status", "podIP"):
        ips = [_get(pod, "status", "podIP")]
    return _join(ips)


def _routes(net: Mapping[str, Any]) -> str:
    out = []
    for r in _get(net, "spec", "routes") or []:
        text = r.get("to", "?")
        if r.get("cidrs"):
            text += "[" + " ".join(r["cidrs"]) + "]"
        if r.get("masquerade"):
            text += "(masq)"
        out.append(text)
    return _join(out)


def _node_status(node: Mapping[str, Any]) -> str:
    for cond in _get(node, "status", "conditions") or []:
        if cond.get("type") == "Ready":
            return "Ready" if cond.get("status") == "True" else "NotReady"
    return "Unknown"


def _node_ip(node: Mapping[str, Any]) -> str:
    return _join(a.get("address") for a in _get(node, "status", "addresses") or []
                 if a.get("type") == "InternalIP")


def _service_ports(svc: Mapping[str, Any]) -> str:
    out = []
    for p in _get(svc, "spec", "ports") or []:
        text = str(p.get("port"))
        if p.get("nodePort"):
            text += f":{p['nodePort']}"
        out.append(f"{text}/{p.get('protocol', 'TCP')}")
    return _join(out)


def _service_network(svc: Mapping[str, Any]) -> str:
    return (_get(svc, "metadata", "annotations") or {}).get(K.NETWORK_ANNOTATION) or K.DEFAULT_NETWORK


def _selector_map(sel: Mapping[str, Any] | None) -> str:
    return _join(f"{k}={v}" for k, v in (sel or {}).items())


@dataclasses.dataclass(frozen=True)
class Column:
    """One table column: its header, how to compute a cell, and whether only ``-o wide`` shows it."""

    header: str
    cell: Callable[[Mapping[str, Any]], Any]
    wide: bool = False


_NAME = Column("NAME", lambda o: o["metadata"]["name"])
_AGE = Column("AGE", lambda o: age(_get(o, "metadata", "creationTimestamp")))
_LABELS = Column("LABELS", _labels, wide=True)

COLUMNS: dict[str, list[Column]] = {
    "Pod": [_NAME,
            Column("NODE", lambda o: _get(o, "spec", "nodeName") or NONE),
            Column("NETWORK", K.pod_network),
            Column("IPS", _pod_ips),
            Column("PHASE", lambda o: _get(o, "status", "phase") or "Pending"),
            _AGE, _LABELS],
    "Namespace": [_NAME, Column("STATUS", lambda o: _get(o, "status", "phase") or "Active"), _AGE, _LABELS],
    "Node": [_NAME, Column("STATUS", _node_status), Column("INTERNAL-IP", _node_ip),
             Column("POD-CIDRS", lambda o: _join(_get(o, "spec", "podCIDRs") or [])), _AGE, _LABELS],
    "Network": [_NAME, Column("ID", lambda o: _get(o, "status", "id") or NONE),
                Column("CIDRS", lambda o: _join(_get(o, "spec", "cidrs") or [])),
                Column("ROUTES", _routes), _AGE, _LABELS],
    "NetworkPolicy": [_NAME, Column("POD-SELECTOR", lambda o: format_selector(_get(o, "spec", "podSelector"))
                                    if _get(o, "spec", "podSelector") else "<all>"),
                      Column("POLICY-TYPES", lambda o: _join(_get(o, "spec", "policyTypes") or []), wide=True),
                      _AGE, _LABELS],
    "Service": [_NAME, Column("TYPE", lambda o: _get(o, "spec", "type") or "ClusterIP"),
                Column("CLUSTER-IP", lambda o: _get(o, "spec", "clusterIP") or NONE),
                Column("PORT(S)", _service_ports), Column("NETWORK", _service_network), _AGE,
                Column("SELECTOR", lambda o: _selector_map(_get(o, "spec", "selector")), wide=True), _LABELS],
    "Segment": [_NAME, Column("ID", lambda o: _get(o, "status", "id") or NONE),
                Column("NETWORK", lambda o: _get(o, "spec", "network")),
                Column("NAMESPACE", lambda o: _get(o, "spec", "namespace") or NONE),
                Column("LABELS", lambda o: _selector_map(_get(o, "spec", "labels"))), _AGE],
    "IPBlock": [_NAME, Column("NETWORK", lambda o: _get(o, "spec", "network")),
                Column("NODE", lambda o: _get(o, "spec", "node")),
                Column("CIDR", lambda o: _get(o, "spec", "cidr")), _AGE],
    "IPLease": [_NAME, Column("NETWORK", lambda o: _get(o, "spec", "network")),
                Column("NODE", lambda o: _get(o, "spec", "node")),
                Column("IP", lambda o: _get(o, "spec", "ip")),
                Column("POD", lambda o: _get(o, "spec", "pod")), _AGE,
                Column("BLOCK", lambda o: _get(o, "spec", "block") or NONE, wide=True),
                Column("CONTAINER-ID", lambda o: (_get(o, "spec", "containerID") or NONE)[:12], wide=True),
                Column("IFNAME", lambda o: _get(o, "spec", "ifname") or NONE, wide=True)],
}

_NAMESPACE = Column("NAMESPACE", lambda o: o["metadata"].get("namespace", ""))


def table_rows(kind: str, items: list[dict], *, wide: bool = False,
               all_namespaces: bool = False) -> tuple[list[str], list[list[str]]]:
    """Headers and cell strings of a kind's table (pure: the tests and other renderers use it)."""
    columns = [c for c in COLUMNS[kind] if wide or not c.wide]
    if all_namespaces and K.kind_info(kind).namespaced:
        columns.insert(0, _NAMESPACE)
    headers = [c.header for c in columns]
    rows = [[str(c.cell(obj)) for c in columns] for obj in items]
    return headers, rows


def render_table(console: Console, headers: list[str], rows: list[list[str]]) -> None:
    """A borderless kubectl-like table; trailing blanks are trimmed so output diffs cleanly."""
    table = Table(box=None, pad_edge=False, show_edge=False, expand=False,
                  header_style="bold" if console.is_terminal else None, padding=(0, 3, 0, 0))
    for h in headers:
        table.add_column(h, no_wrap=True, overflow="fold")
    for row in rows:
        table.add_row(*row)
    buf = io.StringIO()
    tmp = Console(file=buf, width=console.width, force_terminal=console.is_terminal,
                  color_system=console.color_system and "auto", no_color=console.no_color,
                  highlight=False, emoji=False)
    tmp.print(table)
    console.file.write("\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n")
    console.file.flush()


def render_objects(console: Console, kind: str, items: list[dict], *, wide: bool = False,
                   all_namespaces: bool = False) -> None:
    headers, rows = table_rows(kind, items, wide=wide, all_namespaces=all_namespaces)
    render_table(console, headers, rows)
