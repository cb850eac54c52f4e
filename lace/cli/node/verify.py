"""``node verify [--repair] [--map NAME ...]``: drift audit of this node's maps (docs/troubleshooting/drift-audit.md).

The node's agent knows the desired state exactly (backend IDs, Maglev table numbers, the policy
resolution), so it does the comparison (``GET /v1/verify``, ``lace.agent.verify``): every map it
owns against what the store implies, entry by entry, as missing (desired, not in the kernel),
stale (in the kernel, not desired) or different (desired vs actual value). ``--repair`` asks it to
reprogram (``POST /v1/verify/repair``: a resync reconcile) and shows what was fixed and what drift
remains. This command adds the names (pods, networks, segments, services, interfaces; ``-n``:
raw IDs) and draws the tables.

Not audited: the maps the datapath writes itself (conntrack, affinity, events, metrics,
probe-cookie, sock-revnat): they have no desired state.

Exit status: 0 no drift, 1 drift (after ``--repair``: drift left), 2 bad command line, 5 the
agent is not answering (``lace.cli.status``: the same status as ``node trace flow`` without its
agent). :func:`render_report` is shared with the cluster-wide ``lace verify``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from lace.cli import render
from lace.cli.errors import CliError, UnavailableError, UsageError
from lace.cli.invocation import Invocation
from lace.cli.status import ExitStatus

if TYPE_CHECKING:   # lace.bpf, numpy and http.client load when a node command runs, not with `lace --help`
    from lace.cli.node.env import NodeEnv
    from lace.cli.node.resolve import NumericResolver

#: the maps the agent owns and the audit compares (lace.agent.desired.OWNED_MAPS), in its order
AUDITED = ("config", "devices", "routing", "delivery", "delivery-exact", "veth", "segment", "prefix-segment",
           "policy", "policy-exact", "backends", "maglev", "revnat", "services", "probes")
#: written by the datapath itself, besides conntrack (ct-*): no desired state to compare with
DATAPATH_OWNED = ("affinity", "endpoint-ct", "events", "metrics", "nexthops", "probe-cookie", "sock-revnat")
NOT_AUDITED_TEXT = f"conntrack (ct-*), {', '.join(DATAPATH_OWNED[:-1])} and {DATAPATH_OWNED[-1]}"
#: the two maps policy entries are split into (lace.datapath.policy.POLICY_MAPS), shown alike
POLICY_MAPS = ("policy", "policy-exact")
KINDS = ("missing", "stale", "different")
AGENT_TIMEOUT = 60.0


def register(sub: Any, add_common: Callable[..., None]) -> None:
    p = sub.add_parser(
        "verify", help="drift audit: this node's maps against the desired state from the store",
        description="Compare every map the agent owns with what the store's desired state implies and list "
                    "missing (desired, not in the kernel), stale (in the kernel, not desired) and different "
                    "entries by map, with names. Exit 0: no drift; 1: drift. Not audited (written by the "
                    f"datapath itself): {NOT_AUDITED_TEXT}.")
    p.add_argument("--repair", action="store_true",
                   help="ask the agent to reprogram (a resync reconcile), then verify again")
    p.add_argument("--map", dest="maps", action="append", metavar="NAME",
                   help="audit only this map (repeatable): " + ", ".join(AUDITED))
    add_common(p)
    p.set_defaults(handler=run_verify)


def check_maps(names: Sequence[str] | None) -> list[str]:
    """The ``--map`` names, checked; empty: every audited map."""
    out: list[str] = []
    for n in names or ():
        if n in AUDITED:
            if n not in out:
                out.append(n)
            continue
        if n.startswith("ct-") or n in DATAPATH_OWNED:
            raise UsageError(f'map "{n}" is not audited: the datapath writes it itself, there is no desired '
                             "state to compare with", hint="audited maps: " + ", ".join(AUDITED))
        raise UsageError(f'unknown map "{n}"', hint="audited maps: " + ", ".join(AUDITED))
    return out


# ---- the agent -------------------------------------------------------------------------------------

def ask_agent(node_env: NodeEnv, repair: bool, maps: list[str], timeout: float = AGENT_TIMEOUT) -> dict[str, Any]:
    """The agent's audit document (``lace.agent.verify``)."""
    sock = node_env.require_agent_socket()
    method, path = ("POST", "/v1/verify/repair") if repair else ("GET", "/v1/verify")
    if maps:
        path += "?maps=" + quote(",".join(maps), safe=",")
    from lace.cli.node.agent_http import UnixHTTPConnection
    conn = UnixHTTPConnection(sock, timeout)
    try:
        try:
            conn.request(method, path)
            resp = conn.getresponse()
            body = resp.read()
        except OSError as exc:
            raise UnavailableError(f"the agent of {node_env.node_name} is not answering on {sock}: "
                                   f"{exc.strerror or exc}",
                                   hint="the audit needs the agent (it knows the desired state); "
                                        + node_env.restart_hint()) from None
    finally:
        conn.close()
    try:
        doc = json.loads(body or b"{}")
    except ValueError:
        doc = {"error": body.decode(errors="replace")[:200]}
    if resp.status == 404:
        raise UnavailableError(f"the agent of {node_env.node_name} does not serve the drift audit",
                               hint="it predates `node verify`: " + node_env.restart_hint())
    if resp.status == 400:
        raise UsageError(f"the agent refused the request: {doc.get('error')}")
    if resp.status != 200:
        raise CliError(f"the agent of {node_env.node_name} failed to "
                       f"{'repair' if repair else 'verify'}: {doc.get('error')}",
                       hint="see its log (lace lab status shows where)")
    return doc


# ---- names -----------------------------------------------------------------------------------------

class Namer:
    """One line of text per key and value of every audited map, with names unless ``-n``."""

    def __init__(self, res: NumericResolver) -> None:
        from lace.cli.node.bpf import Names
        self.res = res
        self.names = Names(res)

    # helpers
    def net(self, net_id: int) -> str:
        return f"network {net_id}" if self.res.numeric else self.res.network(net_id)

    def seg(self, seg: int) -> str:
        """``259 alpha app=web (default)``, ``4242 (unresolved)``; the number alone with -n."""
        name = None if self.res.numeric else self.res.segment_name(seg)
        return f"{seg} {name}" if name else str(seg) if self.res.numeric else f"{seg} (unresolved)"

    def ifindex(self, idx: int) -> str:
        """``7 (lx12ab, alpha/web-1)``: the index, its interface and pod when known."""
        name = self.names.ifname(idx) if not self.res.numeric else None
        pod = self.res.pod_for_ifname(name) if name else None
        extra = ", ".join(x for x in (name, pod) if x)
        return f"{idx} ({extra})" if extra else str(idx)

    def pod_at(self, net_id: int, addr: str) -> str:
        pod = self.res.pod_for_ip(net_id, addr.split("/")[0]) if not self.res.numeric else None
        return f" ({pod})" if pod else ""

    @staticmethod
    def hostport(addr: str, port: int) -> str:
        return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"

    # keys
    def key(self, name: str, k: dict[str, Any], value: dict[str, Any] | None) -> str:
        if name == "config":
            return "config"
        if name in ("devices", "veth"):
            return "ifindex " + self.ifindex(k["ifindex"])
        if name == "routing":
            return f'{self.net(k["src_network"])} {k["prefix"]}'
        if name in ("delivery", "delivery-exact", "prefix-segment"):
            return f'{self.net(k["network"])} {k["prefix"]}' + self.pod_at(k["network"], k["prefix"])
        if name == "segment":
            return f'{self.net(k["network"])} {k["addr"]}' + self.pod_at(k["network"], k["addr"])
        if name in POLICY_MAPS:
            head = f'segment {self.seg(k["segment"])} {k["direction"]}'
            if k.get("selected"):
                return head + " (selected marker)"
            proto = k["proto"] if k["proto"] is not None else "any"
            ports = ("any" if k["port"] is None else str(k["port"]) if k["port"] == k["end_port"]
                     else f'{k["port"]}-{k["end_port"]}')
            return f'{head} peer {self.res.peer(k["peer"])} {proto}/{ports}'
        if name == "services":
            svc = ""
            if value is not None and not self.res.numeric:
                svc = " " + self.res.service(value["service_id"], network=k["network"], vip=k["addr"],
                                             port=k["port"], proto=k["proto"])
            return (f'{self.net(k["network"])} {self.hostport(k["addr"], k["port"])}/{k["proto"]}'
                    f'{svc} slot {k["slot"]}')
        if name == "backends":
            return f'backend {k["backend_id"]}'
        if name == "maglev":
            return f'table {k["table"]}'
        if name == "probes":
            return f'{self.hostport(k["addr"], k["port"])}/{k["proto"]}' if k["port"] else f'{k["addr"]} (address marker)'
        return json.dumps(k, sort_keys=True)

    # values
    def value(self, name: str, k: dict[str, Any], v: dict[str, Any] | None) -> str:
        if v is None:
            return "-"
        if name == "config":
            return (f'locator {v["locator"]} underlay {v["underlay_addr"]} addr4 {v.get("addr4") or "-"} '
                    f'node-id {v["node_id"]} uplink {self.ifindex(v["uplink_ifindex"])} mtu {v["mtu"]}'
                    + (f' flags {",".join(v["flags"])}' if v.get("flags") else ""))
        if name == "devices":
            return f'{v["role"]} {v["mac"]}'
        if name == "routing":
            if v.get("service_map_full"):
                return render.SERVICE_MAP_FULL_ROUTE
            dst = "outside" if v.get("outside") else self.net(v["dst_network"])
            return f"to {dst}" + (" masquerade" if v.get("masquerade") else "")
        if name in ("delivery", "delivery-exact"):
            if v["kind"] == "local":
                return (f'local ifindex {self.ifindex(v["ifindex"])} mac {v["mac"]} '
                        f'endpoint {v["endpoint_id"]}')
            if v["kind"] == "remote":
                return f'remote node {v["node_id"]} sid {v["sid"]}'
            return "host stack" if v["kind"] == "host" else str(v["kind"])
        if name == "veth":
            addrs = " ".join(a for a in (v.get("ipv4"), v.get("ipv6")) if a)
            return (f'endpoint {v["endpoint_id"]} {self.net(v["network"])} segment {self.seg(v["segment"])} '
                    f'mac {v["mac"]} {addrs}').rstrip()
        if name in ("segment", "prefix-segment"):
            return f'segment {self.seg(v["segment"])}' + (" local" if v.get("local") else "")
        if name in POLICY_MAPS:
            pol = self.res.policy(v["policy_id"]) if v["policy_id"] else "-"
            return f'allow by {pol} rule {v["rule"]}' + (f' {",".join(v["flags"])}' if v.get("flags") else "")
        if name == "services":
            if k.get("slot"):
                return f'backend {v["backend_id"]}'
            flags = list(v.get("flags") or [])
            if v.get("maglev"):
                flags.append(f'maglev={v["maglev"]}')
            return (f'{self.res.service(v["service_id"], network=k["network"], vip=k["addr"], port=k["port"], proto=k["proto"])} '
                    f'backends {v["active_count"]}/{v["backend_count"]}' + (f' {",".join(flags)}' if flags else ""))
        if name == "backends":
            return (f'{self.hostport(v["addr"], v["port"])}/{v["proto"]} {self.net(v["network"])}'
                    f'{self.pod_at(v["network"], v["addr"])} {",".join(v.get("flags") or []) or "inactive"}')
        if name == "maglev":
            spread = ", ".join(f"{b}x{n}" for b, n in v.get("backends", {}).items())
            return f'{v.get("slots")} slots: backend {spread}'
        if name == "probes":
            target = "other ports denied" if k.get("port") == 0 else self.hostport(v["target_addr"], v["target_port"])
            return (f'{self.net(v["network"])} ifindex {self.ifindex(v["ifindex"])} endpoint {v["endpoint_id"]} '
                    f'-> {target}')
        return json.dumps(v, sort_keys=True)


def annotate(doc: dict[str, Any], res: NumericResolver) -> dict[str, Any]:
    """Add ``key_text``, ``desired_text`` and ``actual_text`` to every entry of the agent's report
    (and of its repair's ``fixed`` part)."""
    namer = Namer(res)
    parts = [doc.get("maps") or {}, ((doc.get("repair") or {}).get("fixed")) or {}]
    for maps in parts:
        for name, m in maps.items():
            for kind in KINDS:
                for e in m.get(kind) or []:
                    e["key_text"] = namer.key(name, e["key"], e.get("desired") or e.get("actual"))
                    e["desired_text"] = namer.value(name, e["key"], e.get("desired"))
                    e["actual_text"] = namer.value(name, e["key"], e.get("actual"))
                    if name == "maglev" and e.get("slots_differ") is not None:
                        e["actual_text"] += f" ({render.plural(e['slots_differ'], 'slots')} differ)"
    return doc


# ---- rendering -------------------------------------------------------------------------------------

def _counts(m: dict[str, Any]) -> str:
    """``1 missing, 1 different``: one map's drift by kind."""
    return ", ".join(f"{len(m.get(k) or [])} {k}" for k in KINDS if m.get(k))


def _by_map(maps: dict[str, Any]) -> list[str]:
    """``routing: 1 stale`` per map with drift."""
    return [f"{name}: {_counts(m)}" for name, m in maps.items() if _counts(m)]


def drift_count(maps: dict[str, Any]) -> int:
    return sum(len(m.get(k) or []) for m in maps.values() for k in KINDS)


def left_out_text(doc: dict[str, Any]) -> str:
    """``services: a/web:80, a/dns:53`` for what full maps left out (the agent's ``left_out``), or ''."""
    return "; ".join(f"{name}: {', '.join(items[:5])}{f' and {len(items) - 5} more' if len(items) > 5 else ''}"
                     for name, items in (doc.get("left_out") or {}).items() if items)


def clean(doc: dict[str, Any]) -> bool:
    """No drift and nothing a full map left out."""
    return drift_count(doc.get("maps") or {}) == 0 and not left_out_text(doc)


def summary(node: str, doc: dict[str, Any]) -> str:
    """``node worker-1: 3 entries drift in 2 maps (routing: 1 stale; …)`` or ``… no drift in N maps (M entries)``."""
    maps = doc.get("maps") or {}
    n = drift_count(maps)
    text = f"node {node}: "
    rep = doc.get("repair")
    if rep is not None:
        fixed = rep.get("fixed") or {}
        nf = drift_count(fixed)
        text += (f"repaired {render.plural(nf, 'entries')} in {render.plural(len(_by_map(fixed)), 'maps')} "
                 f"({'; '.join(_by_map(fixed))}); " if nf else "nothing to repair; ")
    full = left_out_text(doc)
    full = f"; full maps left out {full} (new flows to them drop as map-full)" if full else ""
    if n == 0:
        return text + (f"no drift in {render.plural(len(maps), 'maps')} "
                       f"({render.plural(int(doc.get('entries') or 0), 'entries')})") + full
    verb = "drifts" if n == 1 else "drift"
    left = " left" if rep is not None else ""
    return (text + f"{render.plural(n, 'entries')} {verb}{left} in {render.plural(len(_by_map(maps)), 'maps')} "
            f"({'; '.join(_by_map(maps))})") + full


def _rows(m: dict[str, Any], limit: int | None) -> tuple[list[list[Any]], int]:
    entries = [e for k in KINDS for e in m.get(k) or []]
    shown = entries if limit is None else entries[:limit]
    return [[e["kind"], e.get("key_text"), e.get("desired_text"), e.get("actual_text")] for e in shown], len(entries)


def _table(inv: Invocation, headers: list[str], rows: list[list[Any]]) -> None:
    if not render.plain_table(inv.stdout, inv.env, headers, rows):
        render.node_table(inv.console(), headers, rows)


def render_report(inv: Invocation, node: str, doc: dict[str, Any], limit: int | None = None) -> None:
    """One node's audit as text on ``inv.stdout``: what a repair fixed (KIND, KEY, WAS, NOW), a
    table per map that drifts (KIND, KEY, DESIRED, ACTUAL), and the summary line."""
    out = inv.stdout
    rep = doc.get("repair")
    sections = []
    if rep is not None:
        sections += [(name, m, True) for name, m in (rep.get("fixed") or {}).items()]
    sections += [(name, m, False) for name, m in (doc.get("maps") or {}).items()]
    for name, m, fixed in sections:
        if not drift_count({name: m}):
            continue
        rows, total = _rows(m, limit)
        if fixed:
            out.write(f"{name} on {node}, repaired: {_counts(m)}\n")
            _table(inv, ["KIND", "KEY", "WAS", "NOW"], [[r[0], r[1], r[3], r[2]] for r in rows])
        else:
            out.write(f"{name} on {node} ({m.get('desired')} desired, {m.get('actual')} in the kernel): "
                      f"{_counts(m)}\n")
            _table(inv, ["KIND", "KEY", "DESIRED", "ACTUAL"], rows)
        if total > len(rows):
            out.write(f"... {total - len(rows)} more (--limit)\n")
        out.write("\n")
    out.write(summary(node, doc) + "\n")


def status_of(doc: dict[str, Any]) -> ExitStatus:
    return ExitStatus.OK if clean(doc) else ExitStatus.ERROR


def run_verify(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    maps = check_maps(args.maps)
    from lace.cli.node.env import NodeEnv
    from lace.cli.node.resolve import for_node
    node_env = NodeEnv.from_env(inv.env)
    doc = ask_agent(node_env, args.repair, maps)
    res = for_node(args.numeric, node_env.require_store)
    annotate(doc, res)
    node = node_env.node or doc.get("node") or "this node"
    doc["node"] = node
    doc["numeric"] = bool(args.numeric)
    doc["clean"] = clean(doc)
    doc["summary"] = summary(node, doc)
    if args.output == "json":
        render.write_json(inv.stdout, doc)
    else:
        render_report(inv, node, doc, args.limit)
    return status_of(doc)
