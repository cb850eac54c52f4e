"""``node status [--verbose]``: this node's health as its agent reports it (``GET /v1/status``).

The agent assembles the document (``lace.agent.status``): each subsystem OK or failing with the
reason (store watch, reconcile, IPAM, segments, policy, services, probes, datapath attach, flow
collector, MTU, maps, endpoints). This command draws it; ``--verbose`` adds each controller loop
(last success, last error, failures), every map's fill and every failing endpoint.
:func:`render` is shared with the cluster-wide ``lace status``.

Exit status: 0 healthy, 1 something is failing, 2 bad command line, 5 the agent is not answering.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lace.cli import render as cli_render
from lace.cli.errors import CliError
from lace.cli.invocation import Invocation
from lace.cli.status import ExitStatus

if TYPE_CHECKING:   # lace.bpf (and numpy) load when a node command runs, not with `lace --help`
    from lace.cli.node.env import NodeEnv

AGENT_TIMEOUT = 30.0


def register(sub: Any, add_common: Callable[..., None]) -> None:
    p = sub.add_parser("status", help="this node's health: every agent subsystem OK or failing with the reason",
                       description="Ask the node's agent for its status: store watch, reconcile, IPAM, segments, "
                                   "policy, services, probes, datapath attach (uplink, host device, socket hooks, "
                                   "every local pod's program), flow collector, MTU, map pressure (over 90%% "
                                   "flagged) and endpoints ready/total. Exit 0: healthy; 1: something is failing; "
                                   "5: the agent does not answer.")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also each loop's last success, last error and failures, and every map's fill")
    add_common(p)
    p.set_defaults(handler=run_status)


def ask_agent(node_env: NodeEnv, timeout: float = AGENT_TIMEOUT) -> dict[str, Any]:
    code, doc = node_env.get_agent("/v1/status", timeout)
    if code != 200 or not isinstance(doc, dict) or "subsystems" not in doc:
        err = doc.get("error") if isinstance(doc, dict) else str(doc)[:200]
        raise CliError(f"the agent of {node_env.node_name} gave no status ({code}): {err}",
                       hint="an agent older than `node status`? restart it")
    return doc


# ---- drawing (pure) --------------------------------------------------------------------------------

def _ago(age: float | None) -> str:
    return "never" if age is None else f"{cli_render.human_duration(age)} ago"


def headline(doc: dict[str, Any]) -> str:
    """``worker-1: healthy (agent 0.1.0, pid 812, up 5m2s, endpoints 3/3 ready)``."""
    eps = doc.get("endpoints") or {}
    up = cli_render.human_duration(doc["uptime"]) if doc.get("uptime") is not None else "?"
    warned = len(doc.get("warnings") or [])
    state = ("healthy" + (f", {warned} warning{'' if warned == 1 else 's'}" if warned else "")
             if doc.get("healthy") else f"UNHEALTHY ({len(doc.get('problems') or [])} problems)")
    return (f"{doc['node']}: {state} (agent {doc.get('version')}, pid {doc.get('pid')}, up {up}, "
            f"endpoints {eps.get('ready', 0)}/{eps.get('total', 0)} ready)")


def render(doc: dict[str, Any], verbose: bool = False) -> str:
    """One node's status as text: the headline, one line per subsystem, and with ``verbose`` the
    loops, the maps and the endpoints."""
    lines = [headline(doc)]
    rows = []
    for s in doc["subsystems"]:
        if not s["ok"]:
            rows.append([s["name"], "FAILING", s["reason"]])
        elif s.get("warning"):   # not a fault of the node, but to be seen while it lasts
            rows.append([s["name"], "WARNING", s["warning"]])
        else:
            rows.append([s["name"], "OK", s["summary"]])
    width = max(len(r[0]) for r in rows)
    lines += [f"  {n.ljust(width)}  {st.ljust(7)}  {text}" for n, st, text in rows]
    if not verbose:
        return "\n".join(lines) + "\n"
    loops = doc.get("loops") or []
    if loops:
        lines.append("  loops:")
        w = max(len(lp["name"]) for lp in loops)
        for lp in loops:
            err = f", last error {_ago(lp.get('lastErrorTimeAge'))}: {lp['lastError']}" if lp.get("lastError") else ""
            lines.append(f"    {lp['name'].ljust(w)}  {'OK' if lp.get('ok') else 'FAILING'}  "
                         f"{cli_render.plural(lp.get('runs', 0), 'runs')}, last success {_ago(lp.get('lastSuccessAge'))}, "
                         f"{lp.get('failures', 0)} failures in a row, {lp.get('totalFailures', 0)} in all{err}")
    subs = {s["name"]: s for s in doc["subsystems"]}
    maps = (subs.get("maps") or {}).get("maps") or []
    if maps:
        lines.append("  maps:")
        w = max(len(m["map"]) for m in maps)
        for m in maps:
            fill = ("array" if m["type"] in ("array", "percpu_array") else
                    f"{m['entries']}/{m['capacity']} {'tables' if m['type'] == 'tables' else 'entries'} "
                    f"({100.0 * m['entries'] / m['capacity'] if m['capacity'] else 0.0:.1f}%)")
            lines.append(f"    {m['map'].ljust(w)}  {fill}{'' if m['ok'] else '  OVER 90%'}")
    lines += _conntrack_lines(subs.get("conntrack"))
    mtu = subs.get("mtu")
    if mtu:
        lines.append(f"  mtu: pod {mtu['podMTU']}, underlay {mtu['underlayMTU']} ({mtu.get('ifname', 'uplink')}), "
                     f"encapsulation {mtu['overhead']}")
    eps = (subs.get("endpoints") or {}).get("endpoints") or []
    if eps:
        lines.append("  endpoints:")
        w = max(len(e["pod"]) for e in eps)
        for e in eps:
            lines.append(f"    {e['pod'].ljust(w)}  {e['state']}" + (f": {e['reason']}" if e.get("reason") else "")
                         + (f"  ({e['ifname']})" if e.get("ifname") else ""))
    if doc.get("metrics"):
        lines.append("  metrics: " + ", ".join(f"http://{a}/metrics" for a in doc["metrics"]))
    return "\n".join(lines) + "\n"


#: ``--verbose`` lists this many pods, those nearest their conntrack limit first
NEAREST_LIMIT_SHOWN = 5


def _conntrack_lines(ct: dict[str, Any] | None) -> list[str]:
    """The last conntrack GC pass for ``--verbose``: live entries per table, the pods nearest their
    limit, the fullest masquerade destinations."""
    if not ct or ct.get("lastRunAge") is None:
        return []
    out = [f"  conntrack: gc {_ago(ct['lastRunAge'])} ({1000 * (ct.get('duration') or 0):.0f} ms), "
           f"{ct.get('deleted', 0)} expired entries deleted"]
    tables = ct.get("tables") or []
    w = max((len(t["table"]) for t in tables), default=0)
    for t in tables:
        out.append(f"    {t['table'].ljust(w)}  {t['entries']}/{t['capacity']} live entries ({100 * t['ratio']:.1f}%)")
    use = sorted(((n / e["limit"], e["pod"], table, n, e["limit"]) for e in ct.get("endpoints") or ()
                  if e.get("limit") for table, n in (e.get("flows") or {}).items()), reverse=True)
    if use:
        out.append("    nearest their limit: " + ", ".join(f"{pod} {table} {n}/{limit}"
                                                         for _, pod, table, n, limit in use[:NEAREST_LIMIT_SHOWN]))
    for d in ct.get("masquerade") or ():
        out.append(f"    masquerade to {d['remote']}:{d['port']}/{d['proto']}: {d['used']}/{d['capacity']} ports")
    return out


def run_status(args: Any, inv: Invocation) -> ExitStatus:
    from lace.cli.node.env import NodeEnv
    node_env = NodeEnv.from_env(inv.env)
    doc = ask_agent(node_env)
    doc.setdefault("askedAt", time.time())
    if args.output == "json":
        cli_render.write_json(inv.stdout, doc)
    else:
        inv.stdout.write(render(doc, args.verbose))
    return ExitStatus.OK if doc.get("healthy") else ExitStatus.ERROR
