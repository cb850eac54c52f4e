"""``lace endpoint list`` / ``lace endpoint get NS/POD``: every pod's endpoint as the cluster and its
node see it — what ``cilium-dbg endpoint list`` shows, with names.

Two sources, merged per pod:

- the store (cluster facts): the pod (node, phase, Ready condition), its network, its IPLeases
  (addresses, the veth the agent made, the pod's MAC), its segment (ID and labels), and the
  NetworkPolicies that select that segment per direction, from lace.policy's own resolution
  (enforcement ``enabled``; ``audit`` when every selecting policy is in audit mode; ``disabled``);
- each node (data-plane facts): ``node endpoint list -n -o json`` run where ``lace exec --node N``
  runs node commands, on every node involved at once: the veth's ifindex (the endpoint ID), its
  ``veth`` map entry, the ``delivery`` entries to it, the program on its tcx ingress hook.

State: ``ready`` (pod Running and Ready, the node's entries match the store, program attached);
``regenerating`` (the store gives the pod addresses on a node whose maps do not match yet: what
differs is named); ``not-ready`` (pod not Ready, with the condition's reason and the failing
readiness probe; Pending with its reason; no program on the veth); ``unknown`` (its node did not
answer). A node that did not answer is named with the reason and the other endpoints are still
shown (exit status 1). Bad input (an unknown namespace or pod, a malformed NS/POD) is one
``error:`` line with a hint, exit status 2.
"""

from __future__ import annotations

import argparse
import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lace.cli import args as cli_args
from lace.cli import fanout, render
from lace.cli.errors import UsageError
from lace.cli.invocation import Invocation
from lace.cli.status import ExitStatus
from lace.store import kinds as K

DEFAULT_TIMEOUT = 30.0
NODE_ARGV = ["endpoint", "list", "-n", "-o", "json"]

READY, NOT_READY, REGENERATING, UNKNOWN = "ready", "not-ready", "regenerating", "unknown"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "endpoint", aliases=["ep", "endpoints"],
        help="pods' endpoints: ID, node, network, segment, policy enforcement, addresses, state",
        description="Every pod's endpoint as the store and its node's data plane hold it (cilium-dbg endpoint "
                    "list, with names). Exit 0: every node involved answered; 1: a node did not answer (its "
                    "endpoints show state unknown, the others are shown); 2: bad input.")
    sub = p.add_subparsers(dest="endpoint_command", metavar="SUBCOMMAND", parser_class=type(p))
    ls = sub.add_parser("list", help="every endpoint of a namespace (-n) or of all (-A)",
                        description="ENDPOINT ID, POD, NODE, NETWORK, SEGMENT (ID and labels), INGRESS and EGRESS "
                                    "enforcement, IPV4, IPV6, STATE; -o wide adds POLICIES and VETH.")
    cli_args.add_namespace_options(ls)
    ls.add_argument("--node", dest="nodes", action="append", metavar="NODE", help="only endpoints on NODE (repeatable)")
    _common(ls, ("json", "wide"))
    ls.set_defaults(handler=run_list)
    g = sub.add_parser("get", help="one pod's endpoint, everything known about it",
                       description="One pod's endpoint as a key/value block: the list's columns plus the veth, "
                                   "MAC, probe addresses, the policies with their rule counts, the node's veth "
                                   "and delivery entries and program, the pod's conditions.")
    g.add_argument("pod", metavar="NS/POD", help="the pod (or POD with -n NS)")
    g.add_argument("-n", "--namespace", metavar="NS", default=None, help="the namespace when POD has none")
    _common(g, ("json",))
    g.set_defaults(handler=run_get)
    p.set_defaults(handler=lambda a, inv: (_ for _ in ()).throw(
        UsageError("say what to do: lace endpoint list | lace endpoint get NS/POD")))


def _common(p: argparse.ArgumentParser, outputs: tuple[str, ...]) -> None:
    p.add_argument("--timeout", type=float, metavar="SECONDS", default=DEFAULT_TIMEOUT,
                   help=f"how long to wait for a node (default {DEFAULT_TIMEOUT:g})")
    cli_args.add_output_option(p, outputs)
    cli_args.add_lab_option(p)


# ---- what the store expects ---------------------------------------------------------------------------

@dataclass
class Expected:
    """One pod as the store describes its endpoint."""

    namespace: str
    name: str
    node: str | None                  # where its addresses are leased, else spec.nodeName
    phase: str
    ready: bool
    network: str
    network_id: int | None
    segment_id: int | None = None
    segment: dict[str, Any] | None = None     # the Segment's spec: network, namespace, labels
    ipv4: str | None = None
    ipv6: str | None = None
    ifname: str | None = None
    mac: str | None = None
    probe_ips: list[str] = field(default_factory=list)
    enforcement: dict[str, str | None] = field(default_factory=lambda: {"ingress": None, "egress": None})
    policies: dict[str, list[str]] = field(default_factory=lambda: {"ingress": [], "egress": []})
    policy_details: list[dict[str, Any]] = field(default_factory=list)
    pod: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def ips(self) -> list[str]:
        return [ip for ip in (self.ipv4, self.ipv6) if ip]


def _norm(ip: Any) -> str | None:
    try:
        return str(ipaddress.ip_address(str(ip)))
    except ValueError:
        return None


def pod_ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def expected_endpoints(store: Any, pods: list[dict[str, Any]]) -> list[Expected]:
    """What the store says about each of ``pods``: leases, segment, selecting policies."""
    from lace.agent.model import ANN_HOST_IFNAME, ANN_POD_MAC, is_host_lease, is_probe_lease
    from lace.policy.parse import EGRESS, INGRESS
    from lace.policy.resolve import DIR, resolve
    from lace.policy.sources import inputs_from_store, segment_index

    net_ids = {o["metadata"]["name"]: int(o["status"]["id"]) for o in store.list("networks").items
               if "id" in (o.get("status") or {})}
    segs = segment_index(store)
    seg_specs = {int(o["status"]["id"]): o["spec"] for o in store.list("segments").items
                 if "id" in (o.get("status") or {})}
    wanted = {f'{p["metadata"]["namespace"]}/{p["metadata"]["name"]}' for p in pods}
    leases: dict[str, list[dict[str, Any]]] = {}
    for lease in store.list("ipleases").items:
        s = lease.get("spec") or {}
        if is_host_lease(s) or is_probe_lease(s) or s.get("pod") not in wanted:
            continue   # node/<n> and probe/<ns>/<pod> hold no pod's own address
        leases.setdefault(s["pod"], []).append(lease)
    resolution = resolve(inputs_from_store(store, allocate=False))
    parsed = {pp.key: pp for pp in resolution.world.inputs.policies}
    out = []
    for pod in pods:
        meta = pod["metadata"]
        key = f'{meta["namespace"]}/{meta["name"]}'
        net = K.pod_network(pod)
        st = pod.get("status") or {}
        e = Expected(meta["namespace"], meta["name"], (pod.get("spec") or {}).get("nodeName"),
                     st.get("phase") or "Pending", pod_ready(pod), net, net_ids.get(net), pod=pod)
        e.probe_ips = [a["ip"] for a in st.get("probeIPs") or [] if isinstance(a, dict) and a.get("ip")]
        mine = [le for le in leases.get(key, []) if le["spec"].get("network") == net] or leases.get(key, [])
        for le in mine:
            ip = _norm(le["spec"].get("ip"))
            if ip is None:
                continue
            setattr(e, "ipv4" if ":" not in ip else "ipv6", ip)
            e.node = le["spec"].get("node") or e.node
            ann = (le.get("metadata") or {}).get("annotations") or {}
            e.ifname = e.ifname or ann.get(ANN_HOST_IFNAME)
            e.mac = e.mac or ann.get(ANN_POD_MAC)
        seg = segs.get((net, meta["namespace"], tuple(sorted((meta.get("labels") or {}).items()))))
        if seg is not None:
            e.segment_id, e.segment = seg, seg_specs.get(seg)
            details: dict[str, dict[str, Any]] = {}
            for direction in (INGRESS, EGRESS):
                enf, aud = resolution.groups.get((seg, DIR[direction]), ([], []))
                e.enforcement[direction] = "enabled" if enf else "audit" if aud else "disabled"
                for r in enf + aud:
                    e.policies[direction].append(r.key)
                    d = details.setdefault(r.key, {"name": r.key, "directions": [], "rules": {},
                                                   "map_entries": 0, "audit": r.audit})
                    d["directions"].append(direction)
                    pp = parsed.get(r.key)
                    d["rules"][direction] = sum(1 for rule in pp.rules if rule.direction == direction) if pp else None
                    d["map_entries"] += len(r.allows.get((seg, DIR[direction]), ()))
            e.policy_details = sorted(details.values(), key=lambda d: d["name"])
        out.append(e)
    return out


# ---- what the nodes say ---------------------------------------------------------------------------------

@dataclass
class NodeAnswer(fanout.NodeDoc):
    """One node's ``node endpoint list -o json`` document, or why it did not answer."""

    @property
    def endpoints(self) -> list[dict[str, Any]]:
        return list((self.doc or {}).get("endpoints") or [])


def parse_answer(node: str, rc: int | None, stdout: str, stderr: str) -> NodeAnswer:
    """Exit 0 with one JSON document, else the ``error:``/``hint:`` lines it printed."""
    return _answer(fanout.NodeOutput(node, rc, stdout, stderr))


def _answer(o: fanout.NodeOutput) -> NodeAnswer:
    return fanout.parse_doc(o, "endpoints", what="node endpoint list", ok=(0,), cls=NodeAnswer)


Runner = Callable[[list[str], float], dict[str, NodeAnswer]]


def lab_runner(args: argparse.Namespace, inv: Invocation) -> tuple[list[str], Runner]:
    """The lab's nodes, and a runner of ``node endpoint list`` on some of them at once, each where
    ``lace exec --node`` runs it (``lace.cli.fanout``: the node's namespace and host cgroup, its
    LACE_* environment)."""
    ctx, lab = fanout.lab_nodes(args, inv)

    def run(nodes: list[str], timeout: float) -> dict[str, NodeAnswer]:
        outs = fanout.run_lab_nodes(inv, ctx, lab, nodes, NODE_ARGV, what="the node command", timeout=timeout,
                                    timeout_hint=None)
        return {o.node: _answer(o) for o in outs}

    return [n.name for n in lab.nodes], run


# ---- merging: the state of each endpoint (pure) ----------------------------------------------------------

def _host_prefix(ip: str) -> str:
    a = ipaddress.ip_address(ip)
    return f"{a}/{a.max_prefixlen}"


def find_node_endpoint(e: Expected, eps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The node's endpoint for ``e``: by the veth the agent recorded, else by an address in its network."""
    if e.ifname:
        hit = next((ep for ep in eps if ep.get("ifname") == e.ifname), None)
        if hit is not None:
            return hit
    for ep in eps:
        v = ep.get("veth") or {}
        if v and v.get("network") == e.network_id and any(ip in (v.get("ipv4"), v.get("ipv6")) for ip in e.ips):
            return ep
    return None


def _seg_text(seg_id: int | None, spec: Mapping[str, Any] | None) -> str | None:
    if seg_id is None:
        return None
    if spec is None:
        return str(seg_id)
    labels = ",".join(f"{k}={v}" for k, v in sorted((spec.get("labels") or {}).items())) or "<no labels>"
    return f"{seg_id} {labels}"


def mismatches(e: Expected, ep: dict[str, Any] | None, seg_specs: Mapping[int, Any] | None = None,
               net_names: Mapping[int, str] | None = None) -> list[str]:
    """Where the node's maps differ from what the store gives the pod (empty: they match)."""
    node = e.node or "its node"
    if ep is None:
        if e.ifname:
            return [f"no interface {e.ifname} on {node}"]
        return [f"no endpoint on {node} holds {', '.join(e.ips)}"]
    ifname = ep.get("ifname") or f'ifindex {ep["ifindex"]}'
    if ep.get("link_state") == "gone":
        return [f"{ifname} (ifindex {ep['ifindex']}) is gone from {node} but still in its maps"]
    v = ep.get("veth")
    if v is None:
        return [f"veth map: no entry for {ifname} (ifindex {ep['ifindex']})"]
    out = []
    names = net_names or {}
    if e.network_id is not None and v.get("network") != e.network_id:
        got = v.get("network")
        out.append(f"veth map: network {got} ({names.get(got, '?')}), expected {e.network_id} ({e.network})")
    if e.segment_id is None:
        out.append("segment: none allocated in the store yet")
    elif v.get("segment") != e.segment_id:
        got = v.get("segment")
        spec = (seg_specs or {}).get(got)
        got_text = _seg_text(got, spec) if spec is not None else f"{got} (unknown to the store)"
        out.append(f"veth map: segment {got_text}, expected {_seg_text(e.segment_id, e.segment)}")
    for fam, want in (("ipv4", e.ipv4), ("ipv6", e.ipv6)):
        got = v.get(fam)
        if (_norm(got) if got else None) != want:
            out.append(f"veth map: {fam} {got or 'none'}, expected {want or 'none'}")
    if e.mac and v.get("mac") and str(v["mac"]).lower() != e.mac.lower():
        out.append(f'veth map: mac {v["mac"]}, expected {e.mac}')
    have = {(d.get("network"), d.get("prefix")) for d in ep.get("delivery") or []}
    for ip in e.ips:
        if (e.network_id, _host_prefix(ip)) not in have:
            out.append(f"delivery: no local entry for {ip} to {ifname}")
    return out


def _probe_text(probe: Mapping[str, Any]) -> str:
    if "httpGet" in probe:
        h = probe["httpGet"] or {}
        return f'httpGet :{h.get("port")}{h.get("path") or "/"}'
    if "tcpSocket" in probe:
        return f'tcpSocket :{(probe["tcpSocket"] or {}).get("port")}'
    if "grpc" in probe:
        return f'grpc :{(probe["grpc"] or {}).get("port")}'
    if "exec" in probe:
        return "exec " + " ".join((probe["exec"] or {}).get("command") or [])
    return "probe"


def not_ready_reason(pod: Mapping[str, Any]) -> str:
    """Why a pod is not Ready, from its status: phase, the Ready condition's reason and message,
    the container that is terminated or whose readiness probe fails."""
    st = pod.get("status") or {}
    phase = st.get("phase") or "Pending"
    cond = next((c for c in st.get("conditions") or [] if c.get("type") == "Ready"), None)
    cond_text = ""
    if cond is not None:
        cond_text = ": ".join(x for x in (cond.get("reason"), cond.get("message")) if x)
    if phase != "Running":
        return f"{phase}" + (f" ({cond_text})" if cond_text else "")
    parts: list[str] = []
    probes = {c.get("name"): c.get("readinessProbe") for c in (pod.get("spec") or {}).get("containers") or []}
    for cs in st.get("containerStatuses") or []:
        if cs.get("ready"):
            continue
        state = cs.get("state") or {}
        if "terminated" in state:
            t = state["terminated"] or {}
            parts.append(f'container {cs.get("name")} terminated: {t.get("message") or t.get("reason") or "?"}')
        elif "waiting" in state:
            w = state["waiting"] or {}
            parts.append(f'container {cs.get("name")} waiting: {w.get("reason") or "?"}')
        elif probes.get(cs.get("name")):
            parts.append(f'readiness probe {_probe_text(probes[cs.get("name")])} of container '
                         f'{cs.get("name")} failing')
    if parts:
        return "pod not Ready: " + "; ".join(parts) + (f' ({cond["reason"]})' if cond and cond.get("reason") else "")
    return "pod not Ready" + (f": {cond_text}" if cond_text else "")


def endpoint_state(e: Expected, answer: NodeAnswer | None, ep: dict[str, Any] | None,
                   seg_specs: Mapping[int, Any] | None = None,
                   net_names: Mapping[int, str] | None = None) -> tuple[str, str | None, list[str]]:
    """(state, reason, problems) of one endpoint; ``answer`` is its node's (None: not a node asked)."""
    if e.node is None:
        return NOT_READY, not_ready_reason(e.pod) + "; not scheduled to a node", []
    if answer is None:
        if e.phase != "Running" and not e.ips:
            return NOT_READY, not_ready_reason(e.pod) + f"; node {e.node} is not a node of this cluster", []
        return UNKNOWN, f"node {e.node} is not a node of this cluster", []
    if answer.doc is None:
        return UNKNOWN, f"node {e.node} did not answer: {answer.error}", []
    problems = mismatches(e, ep, seg_specs, net_names) if e.ips else []
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return REGENERATING, problems[0] + more, problems
    if e.phase != "Running" or not e.ready:
        return NOT_READY, not_ready_reason(e.pod), []
    if not e.ips:
        return NOT_READY, "no addresses leased in the store", []
    assert ep is not None
    if not ep.get("program_attached"):
        problem = f'no lace program on {ep.get("ifname")} (tcx ingress)'
        return NOT_READY, problem, [problem]
    return READY, None, []


def merge(expected: list[Expected], answers: Mapping[str, NodeAnswer], *, orphans: bool = False,
          seg_specs: Mapping[int, Any] | None = None, net_names: Mapping[int, str] | None = None
          ) -> list[dict[str, Any]]:
    """One row document per pod (and, with ``orphans``, per node endpoint no pod holds)."""
    rows = []
    claimed: dict[str, set[int]] = {}
    for e in expected:
        answer = answers.get(e.node) if e.node else None
        ep = find_node_endpoint(e, answer.endpoints) if answer is not None and answer.doc is not None else None
        if ep is not None:
            claimed.setdefault(e.node or "", set()).add(int(ep["ifindex"]))
        state, reason, problems = endpoint_state(e, answer, ep, seg_specs, net_names)
        seg = None
        if e.segment_id is not None:
            spec = e.segment or {}
            seg = {"id": e.segment_id, "namespace": spec.get("namespace"), "network": spec.get("network"),
                   "labels": dict(spec.get("labels") or {})}
        rows.append({
            "endpoint_id": ep["endpoint_id"] if ep else None, "pod": e.key, "namespace": e.namespace,
            "name": e.name, "node": e.node, "network": e.network, "network_id": e.network_id, "segment": seg,
            "enforcement": dict(e.enforcement), "policies": {k: list(v) for k, v in e.policies.items()},
            "ipv4": e.ipv4, "ipv6": e.ipv6, "veth": (ep or {}).get("ifname") or e.ifname, "mac": e.mac,
            "phase": e.phase, "ready": e.ready, "state": state, "reason": reason, "problems": problems,
            "_expected": e, "_node_endpoint": ep})
    if orphans:
        for node, answer in sorted(answers.items()):
            for ep in answer.endpoints:
                if int(ep["ifindex"]) in claimed.get(node, set()):
                    continue
                v = ep.get("veth") or {}
                net = (net_names or {}).get(v.get("network")) if v else None
                seg_id = v.get("segment") if v else None
                spec = (seg_specs or {}).get(seg_id) if seg_id is not None else None
                reason = "no pod in the store holds this endpoint"
                rows.append({
                    "endpoint_id": ep["endpoint_id"], "pod": None, "namespace": None, "name": None, "node": node,
                    "network": net, "network_id": v.get("network"),
                    "segment": None if seg_id is None else {
                        "id": seg_id, "namespace": (spec or {}).get("namespace"),
                        "network": (spec or {}).get("network"), "labels": dict((spec or {}).get("labels") or {})},
                    "enforcement": {"ingress": None, "egress": None}, "policies": {"ingress": [], "egress": []},
                    "ipv4": v.get("ipv4"), "ipv6": v.get("ipv6"), "veth": ep.get("ifname"), "mac": v.get("mac"),
                    "phase": None, "ready": False, "state": REGENERATING, "reason": reason, "problems": [reason],
                    "_expected": None, "_node_endpoint": ep})
    return rows


def public(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not k.startswith("_")}


def state_text(row: Mapping[str, Any]) -> str:
    return row["state"] + (f': {row["reason"]}' if row.get("reason") else "")


def segment_text(row: Mapping[str, Any]) -> str | None:
    seg = row.get("segment")
    if not seg:
        return None
    return _seg_text(seg["id"], seg if seg.get("namespace") is not None or seg.get("labels") else None)


# ---- the commands ---------------------------------------------------------------------------------------

@dataclass
class Gathered:
    rows: list[dict[str, Any]]
    answers: dict[str, NodeAnswer]
    asked: list[str]
    net_names: dict[int, str] = field(default_factory=dict)


def gather(args: argparse.Namespace, inv: Invocation, pods: list[dict[str, Any]], *, all_nodes: bool,
           runner: tuple[list[str], Runner] | None = None) -> Gathered:
    store = inv.store(args)
    expected = expected_endpoints(store, pods)
    known, run = runner or lab_runner(args, inv)
    involved = {e.node for e in expected if e.node}
    asked = [n for n in known if all_nodes or n in involved]
    answers = run(asked, args.timeout) if asked else {}
    seg_specs = {int(o["status"]["id"]): o["spec"] for o in store.list("segments").items
                 if "id" in (o.get("status") or {})}
    net_names = {int(o["status"]["id"]): o["metadata"]["name"] for o in store.list("networks").items
                 if "id" in (o.get("status") or {})}
    rows = merge(expected, answers, orphans=all_nodes, seg_specs=seg_specs, net_names=net_names)
    return Gathered(rows, answers, asked, net_names)


def _check_timeout(args: argparse.Namespace) -> None:
    if args.timeout <= 0:
        raise UsageError("--timeout must be more than 0 seconds", hint="e.g. --timeout 10")


def _namespaces(store: Any) -> list[str]:
    return [o["metadata"]["name"] for o in store.list("namespaces").items]


def unanswered(g: Gathered) -> list[NodeAnswer]:
    return [g.answers[n] for n in g.asked if g.answers.get(n) is None or g.answers[n].doc is None]


def _report_unanswered(inv: Invocation, g: Gathered) -> None:
    for a in unanswered(g):
        inv.stderr.write(f"node {a.node} did not answer: {a.error}\n")
        if a.hint:
            inv.stderr.write(f"  hint: {a.hint}\n")


def run_list(args: argparse.Namespace, inv: Invocation, runner: tuple[list[str], Runner] | None = None
             ) -> ExitStatus:
    _check_timeout(args)
    if args.all_namespaces and args.namespace:
        raise UsageError("-A and -n exclude each other", hint="pass one of them")
    store = inv.store(args)
    namespace = None if args.all_namespaces else (args.namespace or "default")
    if namespace is not None and namespace not in _namespaces(store):
        raise UsageError(f'no namespace "{namespace}"',
                         hint="namespaces: " + ", ".join(_namespaces(store)) + " (or -A for all)")
    pods = store.list("pods", namespace).items
    g = gather(args, inv, pods, all_nodes=namespace is None, runner=runner)
    rows = g.rows
    if args.nodes:
        rows = [r for r in rows if r["node"] in args.nodes]
    rows.sort(key=lambda r: (r["pod"] is None, r["namespace"] or "", r["name"] or "", r["node"] or "",
                             r["endpoint_id"] or 0))
    missing = unanswered(g)
    status = ExitStatus.ERROR if missing else ExitStatus.OK
    if args.output == "json":
        render.write_json(inv.stdout, {
            "endpoints": [public(r) for r in rows],
            "nodes": {n: ("answered" if g.answers.get(n) and g.answers[n].doc is not None else "did not answer")
                      for n in g.asked},
            "unanswered": {a.node: {"error": a.error, "hint": a.hint} for a in missing}})
        return status
    _report_unanswered(inv, g)
    if not rows:
        inv.stderr.write("No endpoints found" + (f" in {namespace} namespace" if namespace else "") + ".\n")
        return status
    wide = args.output == "wide"
    headers = ["ENDPOINT ID", "POD", "NODE", "NETWORK", "SEGMENT", "INGRESS", "EGRESS", "IPV4", "IPV6", "STATE"]
    if wide:
        headers += ["POLICIES", "VETH"]
    table = []
    for r in rows:
        cells = [r["endpoint_id"], r["pod"], r["node"], r["network"], segment_text(r),
                 r["enforcement"]["ingress"], r["enforcement"]["egress"], r["ipv4"], r["ipv6"], state_text(r)]
        if wide:
            pols = sorted(set(r["policies"]["ingress"]) | set(r["policies"]["egress"]))
            cells += [",".join(pols), r["veth"]]
        table.append([render.cell(c) for c in cells])
    render.render_table(inv.console(), headers, table)
    return status


def split_pod(text: str, namespace: str | None) -> tuple[str, str]:
    """``NS/POD`` (or ``POD`` with ``-n NS``) -> (namespace, name); anything else is a usage error."""
    parts = text.split("/")
    if len(parts) == 2 and all(parts) and not namespace:
        return parts[0], parts[1]
    if len(parts) == 1 and parts[0] and namespace:
        return namespace, parts[0]
    if len(parts) == 2 and all(parts) and namespace:
        raise UsageError(f'"{text}" names its namespace already; do not add -n', hint="lace endpoint get NS/POD")
    raise UsageError(f'"{text}" is not NS/POD', hint="lace endpoint get NS/POD, e.g. lace endpoint get alpha/web-1"
                     + ("" if namespace else " (or POD -n NS)"))


def run_get(args: argparse.Namespace, inv: Invocation, runner: tuple[list[str], Runner] | None = None
            ) -> ExitStatus:
    from lace.store import NotFound
    _check_timeout(args)
    ns, name = split_pod(args.pod, args.namespace)
    store = inv.store(args)
    if ns not in _namespaces(store):
        raise UsageError(f'no namespace "{ns}"', hint="namespaces: " + ", ".join(_namespaces(store)))
    try:
        pod = store.get("pods", name, ns)
    except NotFound:
        names = [p["metadata"]["name"] for p in store.list("pods", ns).items]
        raise UsageError(f'no pod "{name}" in namespace {ns}',
                         hint=("pods there: " + ", ".join(names[:10]) + (" …" if len(names) > 10 else ""))
                         if names else f"namespace {ns} has no pods: lace endpoint list -A") from None
    g = gather(args, inv, [pod], all_nodes=False, runner=runner)
    row = g.rows[0]
    e: Expected = row["_expected"]
    ep = row["_node_endpoint"] or {}
    missing = unanswered(g)
    status = ExitStatus.ERROR if missing else ExitStatus.OK
    st = pod.get("status") or {}
    doc = {**public(row), "probe_ips": e.probe_ips, "policy_details": e.policy_details,
           "conditions": st.get("conditions") or [],
           "node_endpoint": ep or None,
           "unanswered": {a.node: {"error": a.error, "hint": a.hint} for a in missing}}
    if args.output == "json":
        render.write_json(inv.stdout, doc)
        return status
    _report_unanswered(inv, g)
    render_get(inv, doc, g.net_names)
    return status


def _programs(ep: Mapping[str, Any]) -> str | None:
    progs = [f'{h["hook"]} {h["name"]} (prog {h["id"]}' + (f', link {h["link_id"]})' if h.get("link_id") else ")")
             for h in ep.get("programs") or []]
    return "; ".join(progs) or ("none" if ep else None)


def get_lines(doc: Mapping[str, Any], net_names: Mapping[int, str] | None = None) -> list[tuple[str, str]]:
    """The key/value pairs ``lace endpoint get`` shows, in order."""
    ep = doc.get("node_endpoint") or {}
    v = ep.get("veth")

    def enforcement(direction: str) -> str | None:
        mode = doc["enforcement"][direction]
        pols = doc["policies"][direction]
        return None if mode is None else mode + (f' ({", ".join(pols)})' if pols else "")

    seg = doc.get("segment")
    pairs: list[tuple[str, Any]] = [
        ("Endpoint ID", doc["endpoint_id"]),
        ("Pod", doc["pod"]),
        ("Node", doc["node"]),
        ("State", state_text(doc)),
        ("Phase", f'{doc["phase"]}, ' + ("Ready" if doc["ready"] else "not Ready")),
        ("Network", f'{doc["network"]} (id {doc["network_id"]})' if doc["network_id"] is not None else doc["network"]),
        ("Segment", None if not seg else f'{seg["id"]}: namespace {seg.get("namespace")} labels '
                                          + (",".join(f"{k}={v}" for k, v in sorted(seg["labels"].items()))
                                             or "<no labels>")),
        ("Ingress", enforcement("ingress")),
        ("Egress", enforcement("egress")),
        ("IPv4", doc["ipv4"]),
        ("IPv6", doc["ipv6"]),
        ("Probe IPs", ", ".join(doc.get("probe_ips") or []) or None),
        ("MAC", doc.get("mac")),
        ("Veth", f'{doc["veth"]}' + (f' (ifindex {ep["ifindex"]}, {ep.get("link_state")})' if ep else "")
         if doc.get("veth") else None),
        ("Program", _programs(ep) if ep else None),
    ]
    for i, d in enumerate(doc.get("policy_details") or []):
        rules = ", ".join(f'{n if n is not None else "?"} {k} rule{"" if n == 1 else "s"}'
                          for k, n in d["rules"].items())
        pairs.append(("Policies" if i == 0 else "", f'{d["name"]}: {rules}; {d["map_entries"]} policy map '
                      f'entr{"y" if d["map_entries"] == 1 else "ies"} for this segment'
                      + (" (audit)" if d.get("audit") else "")))
    if not doc.get("policy_details"):
        pairs.append(("Policies", "none select it"))
    if ep:
        names = net_names or {}

        def net(i: Any) -> str:
            return f"{i} ({names[i]})" if i in names else str(i)
        if v:
            pairs.append(("Veth map", f'endpoint {v["endpoint_id"]} network {net(v["network"])} segment '
                          f'{v["segment"]} mac {v["mac"]} {v.get("ipv4") or "-"} {v.get("ipv6") or "-"}'))
        else:
            pairs.append(("Veth map", "no entry"))
        dl = [f'{d["prefix"]} in network {net(d["network"])}' for d in ep.get("delivery") or []]
        pairs.append(("Delivery", ", ".join(dl) or "no entry leads here"))
    for i, p in enumerate(doc.get("problems") or []):
        pairs.append(("Problems" if i == 0 else "", p))
    for i, c in enumerate(doc.get("conditions") or []):
        text = f'{c.get("type")}={c.get("status")}' + "".join(
            f" {x}" for x in (c.get("reason"), c.get("message")) if x) + (
            f' since {c["lastTransitionTime"]}' if c.get("lastTransitionTime") else "")
        pairs.append(("Conditions" if i == 0 else "", text))
    return [(k, render.cell(val)) for k, val in pairs]


def render_get(inv: Invocation, doc: Mapping[str, Any], net_names: Mapping[int, str] | None = None) -> None:
    import io

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text
    con = inv.console()
    table = Table(box=None, show_header=False, pad_edge=False, show_edge=False, padding=(0, 3, 0, 0))
    table.add_column(style="bold" if con.is_terminal else None, no_wrap=True)
    table.add_column(overflow="fold")
    for k, val in get_lines(doc, net_names):
        table.add_row(Text(k + ":" if k else ""), Text(val))
    buf = io.StringIO()
    Console(file=buf, width=con.width, force_terminal=con.is_terminal, color_system=con.color_system and "auto",
            no_color=con.no_color, highlight=False, emoji=False).print(table)
    con.file.write("\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n")
    con.file.flush()
