"""``node trace flow``: each flow's final decision, streamed from the node agent (``/v1/flows``).

The agent is the ring buffer's only reader; this command asks it for its history (``--last N``)
or follows the stream (``--follow``, NDJSON over the agent's unix socket).  Filters run in the
agent.  Without the agent there is no flow stream: the error names the node and the socket.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import lace.store
from lace.cli import render
from lace.cli.errors import UnavailableError, UsageError
from lace.cli.invocation import Invocation
from lace.cli.node.agent_http import UnixHTTPConnection
from lace.cli.node.env import NodeEnv
from lace.cli.node.resolve import NumericResolver, for_node
from lace.cli.status import ExitStatus


def register(sub: Any, add_common: Callable[..., None]) -> None:
    tr = sub.add_parser("trace", help="flow decisions as the data plane makes them",
                        description="Flow decisions as the data plane makes them.")
    add_common(tr)
    tsub = tr.add_subparsers(dest="trace_command", metavar="SUBCOMMAND", parser_class=type(tr))
    p = tsub.add_parser("flow", help="each flow's final decision: tuple, verdict, reason, NAT, delivery",
                        description="Each flow's final accept/deny decision: time, node, tuple, networks, "
                                    "source and destination, verdict, drop reason, NAT result, delivery.")
    p.add_argument("--verdict", choices=("forward", "drop", "audit"))
    p.add_argument("--pod", metavar="NS/NAME", help="flows from or to this pod (needs the store)")
    p.add_argument("--ip", metavar="IP|CIDR", help="flows from or to this address or prefix")
    p.add_argument("--port", type=int, metavar="N", help="flows from or to this port")
    p.add_argument("--proto", choices=("tcp", "udp", "icmp", "sctp"))
    p.add_argument("--follow", "-f", action="store_true", help="keep streaming new flows")
    p.add_argument("--last", type=int, metavar="N", default=0, help="the last N flows (default: all kept)")
    add_common(p)
    p.set_defaults(handler=run_flow)
    tr.set_defaults(handler=lambda a, inv: (_ for _ in ()).throw(UsageError("say what to trace: node trace flow")))


def query_string(args: argparse.Namespace, pod_ips: list[str] | None) -> str:
    q: dict[str, str] = {}
    if args.verdict:
        q["verdict"] = args.verdict
    if args.ip:
        try:
            ipaddress.ip_network(args.ip, strict=False)
        except ValueError:
            raise UsageError(f'--ip "{args.ip}" is not an address or CIDR') from None
        q["ip"] = args.ip
    if args.port is not None:
        q["port"] = str(args.port)
    if args.proto:
        q["proto"] = args.proto
    if pod_ips:
        q["pod_ip"] = ",".join(pod_ips)
    if args.last:
        q["last"] = str(args.last)
    if args.follow:
        q["follow"] = "1"
    return "&".join(f"{k}={quote(v, safe='')}" for k, v in q.items())


def _agent_down(node_env: NodeEnv, sock: str, exc: BaseException) -> UnavailableError:
    return UnavailableError(
        f"the agent of {node_env.node_name} is not answering on {sock}: {exc}",
        hint="flow traces come from the agent; maps are still readable (node bpf show, node ct list). "
             + (f"Restart it: lace lab restart-agent {node_env.node}" if node_env.node else "Restart the node's agent"))


def fetch(node_env: NodeEnv, url: str, follow: bool) -> Iterator[dict[str, Any]]:
    """Flow documents from the agent (a finite list, or the followed stream)."""
    sock = node_env.require_agent_socket()
    conn = UnixHTTPConnection(sock, None if follow else 30.0)
    try:
        try:
            conn.request("GET", url)
            resp = conn.getresponse()
        except OSError as exc:
            raise _agent_down(node_env, sock, exc) from None
        if resp.status != 200:
            body = resp.read()
            try:
                msg = json.loads(body).get("error", body.decode(errors="replace"))
            except ValueError:
                msg = body.decode(errors="replace")
            if resp.status == 404:
                raise UnavailableError(f"the agent of {node_env.node_name} does not serve flows ({msg})",
                                       hint="it predates the flow stream: restart it with this version")
            raise UsageError(f"the agent refused the request: {msg}")
        if not follow:
            doc = json.loads(resp.read() or b"{}")
            yield from doc.get("flows", [])
            return
        while True:
            line = resp.readline()
            if not line:
                return
            line = line.strip()
            if line:
                yield json.loads(line)
    finally:
        conn.close()


def _ep(addr: str | None, port: int | None, proto: str) -> str:
    a = addr or "?"
    a = f"[{a}]" if ":" in a else a
    return a if proto in ("icmp", "icmpv6") or not port else f"{a}:{port}"


def describe(ev: dict[str, Any], res: NumericResolver) -> dict[str, Any]:
    """The event with the names an operator reads (pod or prefix, segment, network, delivery)."""
    out = dict(ev)
    proto = str(ev.get("proto"))
    for side, addr, net, seg in (("src", "saddr", "src_network", "src_segment"),
                                 ("dst", "daddr", "dst_network", "dst_segment")):
        pod = res.pod_for_ip(ev.get(net, 0), ev.get(addr) or "") if not res.numeric else None
        out[f"{side}_pod"] = pod
        if not res.numeric:
            # 0 in an event means "not decided yet" (the packet was dropped before routing or
            # segment resolution), which is no ID to resolve
            out[f"{side}_network_name"] = res.network(ev[net]) if ev.get(net) else "-"
            out[f"{side}_segment_name"] = res.segment(ev[seg]) if ev.get(seg) else "-"
    kind = ev.get("delivery")
    if kind == "local":
        target = f"local pod via ifindex {ev.get('delivery_ifindex')}"
        if not res.numeric:
            pod = out.get("dst_pod")
            target = f"local pod {pod or '?'} (ifindex {ev.get('delivery_ifindex')})"
    elif kind == "remote":
        target = f"remote node {ev.get('node_id')} sid {ev.get('sid')}"
    elif kind in ("host", "outside"):
        target = str(kind)
    else:
        target = "-"
    out["delivery_text"] = target
    nat = ev.get("nat_kind")
    out["nat_text"] = f"{nat} {_ep(ev.get('nat_addr'), ev.get('nat_port'), proto)}" if nat and nat != "none" else "-"
    return out


def line(d: dict[str, Any], res: NumericResolver) -> str:
    t = d.get("time")
    ts = datetime.datetime.fromtimestamp(t).strftime("%H:%M:%S.%f")[:-3] if isinstance(t, (int, float)) else "?"
    proto = str(d.get("proto"))
    src = _ep(d.get("saddr"), d.get("sport"), proto)
    dst = _ep(d.get("daddr"), d.get("dport"), proto)

    def who(side: str) -> str:
        seg = d.get(f"{side}_segment")
        segname = d.get(f"{side}_segment_name") if not res.numeric else f"segment {seg}"
        pod = d.get(f"{side}_pod")
        return f"{pod} [{segname}]" if pod else f"[{segname}]"

    nets = (f"{d.get('src_network_name')} → {d.get('dst_network_name')}" if not res.numeric
            else f"{d.get('src_network')} → {d.get('dst_network')}")
    verdict = str(d.get("verdict")).upper()
    reason = d.get("reason")
    why = f" ({reason})" if reason and reason != "none" else ""
    return (f"{ts} {d.get('node')} {proto} {src} → {dst}  net {nets}  {who('src')} → {who('dst')}  "
            f"{verdict}{why}  nat {d['nat_text']}  delivery {d['delivery_text']}  at {d.get('point')}")


def pod_ips(node_env: NodeEnv, pod: str) -> list[str]:
    ns, sep, name = pod.partition("/")
    if not sep or not ns or not name:
        raise UsageError(f'--pod "{pod}" is not NAMESPACE/NAME')
    path = node_env.require_store()
    try:
        st = lace.store.open_store(path)  # loads the store's backend now, on first use
    except lace.store.StoreError as exc:
        raise UnavailableError(f"cannot open the store {path}: {exc.message}",
                               hint="with -n use --ip instead of --pod") from None
    try:
        ips = [str(le["spec"]["ip"]) for le in st.list("ipleases").items if le["spec"].get("pod") == pod]
        try:
            p = st.get("pods", name, ns)
            ips += [e.get("ip") for e in (p.get("status") or {}).get("podIPs") or [] if e.get("ip")]
        except lace.store.StoreError:
            pass
    finally:
        st.close()
    if not ips:
        raise UsageError(f"pod {pod} has no addresses in the store", hint="check `lace get pods -n " + ns + "`")
    return sorted({str(ipaddress.ip_address(i)) for i in ips})


def run_flow(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    node_env = NodeEnv.from_env(inv.env)
    if args.pod and args.numeric:
        raise UsageError("--pod needs the store, which -n never opens", hint="use --ip with -n")
    ips = pod_ips(node_env, args.pod) if args.pod else None
    url = "/v1/flows" + ("?" + query_string(args, ips) if query_string(args, ips) else "")
    res = for_node(args.numeric, node_env.require_store)
    limit = args.limit
    out = inv.stdout
    shown = 0
    if args.output == "json" and not args.follow:
        flows = [describe(e, res) for e in fetch(node_env, url, False)]
        total = len(flows)
        flows = flows if limit is None else flows[-limit:] if limit else []
        render.write_json(out, {"node": node_env.node, "count": total, "shown": len(flows), "flows": flows})
        return ExitStatus.OK
    if args.output == "json":
        out.write("[\n")
    try:
        for ev in fetch(node_env, url, args.follow):
            if "keepalive" in ev:
                continue
            if "lost" in ev:
                if args.output != "json":
                    inv.stderr.write(f"warning: {ev['lost']} flows lost (this client is too slow)\n")
                continue
            d = describe(ev, res)
            if args.output == "json":
                out.write(("" if shown == 0 else ",\n") + json.dumps(d))
            else:
                out.write(line(d, res) + "\n")
            out.flush()
            shown += 1
            if limit is not None and shown >= limit:
                break
    except KeyboardInterrupt:
        pass
    finally:
        if args.output == "json":
            out.write("\n]\n")
            out.flush()
    if args.output != "json" and not args.follow:
        out.write(f"{render.plural(shown, 'flows')} from {node_env.node_name}\n")
    return ExitStatus.OK
