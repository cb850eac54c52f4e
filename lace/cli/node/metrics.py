"""``node metrics``: this node's Prometheus metrics, as its agent serves them (``GET /metrics`` on its
socket; the same text it serves over TCP with ``--metrics-port``). ``-o json`` parses the text
exposition (prometheus_client's parser) into ``{metric: {type, help, samples: [{name, labels,
value}]}}``; :func:`parse` is shared with the cluster-wide ``lace metrics``.

Exit status: 0, 2 bad command line, 5 the agent is not answering.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lace.cli import render
from lace.cli.errors import CliError
from lace.cli.invocation import Invocation
from lace.cli.status import ExitStatus

if TYPE_CHECKING:   # lace.bpf (and numpy) load when a node command runs, not with `lace --help`
    from lace.cli.node.env import NodeEnv


def register(sub: Any, add_common: Callable[..., None]) -> None:
    p = sub.add_parser("metrics", help="this node's Prometheus metrics (text exposition, or parsed with -o json)",
                       description="Print the metrics the node's agent exports: datapath packets and bytes by "
                                   "verdict, point and reason, map entries/capacity/pressure, conntrack entries, "
                                   "policy entries, endpoints by state, reconcile duration and errors, store watch "
                                   "lag, flow collector events, losses and backlog.")
    add_common(p)
    p.set_defaults(handler=run_metrics)


def parse(text: str) -> dict[str, Any]:
    """A text exposition as ``{family: {"type", "help", "samples": [{"name", "labels", "value"}]}}``."""
    from prometheus_client.parser import text_string_to_metric_families
    out: dict[str, Any] = {}
    for fam in text_string_to_metric_families(text):
        out[fam.name] = {"type": fam.type, "help": fam.documentation,
                         "samples": [{"name": s.name, "labels": dict(s.labels), "value": s.value}
                                     for s in fam.samples]}
    return out


def fetch(node_env: NodeEnv, timeout: float = 30.0) -> str:
    code, body = node_env.get_agent("/metrics", timeout)
    if code != 200:
        raise CliError(f"the agent of {node_env.node_name} gave no metrics ({code}): {body!r:.200}")
    return body.decode() if isinstance(body, bytes) else str(body)


def run_metrics(args: Any, inv: Invocation) -> ExitStatus:
    from lace.cli.node.env import NodeEnv
    text = fetch(NodeEnv.from_env(inv.env))
    if args.output == "json":
        render.write_json(inv.stdout, parse(text))
    else:
        inv.stdout.write(text)
    return ExitStatus.OK
