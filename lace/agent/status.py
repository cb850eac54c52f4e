"""The agent's status document (``GET /v1/status``): every subsystem OK or failing with the reason.

Two halves. :func:`gather` does the I/O: it reads what the agent knows (its loops, the last
snapshot, the programmers' pressure), what the kernel holds (map fill, the pinned links and the
programs they carry, the uplink's MTU) and what the store says about this node (its IPAM blocks
and leases, its pods), into a plain *facts* dict. :func:`assemble` is pure: it turns facts into
the document ``node status`` and ``lace status`` render, so unit tests drive it with dicts.

Subsystems: ``store-watch`` (connected, last event age, lag), ``liveness`` (the node's liveness
record renewed in time; failing means the store is unavailable and the node is degraded: it
forwards on what is programmed and catches up once the store is back), ``reconcile``, ``ipam`` (this node's
blocks and leases), ``segments``, ``policy`` and ``services`` (a full map leaves entries out),
``probes``, ``datapath`` (uplink, host device, socket hooks, and every local pod's program: what
should be attached against the pinned links), ``flows`` (the flow collector), ``mtu``
(pod MTU + encapsulation must fit the underlay), ``maps`` (entries / capacity, > 90 % flagged) and
``endpoints`` (ready / total), ``conntrack`` (the last GC pass: live entries per table, each
local endpoint's flows against its conntrack limit, the fullest masquerade destinations). ``loops``
lists each controller loop's last success, last error and failure count.

A subsystem may also carry *warnings*: something an operator should see that is not a fault of
the node — a pod at its conntrack limit (the limit doing its job: its new flows drop as
ct-endpoint-limit, other pods are unharmed), a conntrack table or a masquerade destination's port
space nearly full. They show as WARNING while they last and leave the node healthy.
"""

from __future__ import annotations

import ipaddress
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from lace import __version__
from lace.datapath.config import ENCAP_OVERHEAD

#: a map fuller than this is flagged (entries / capacity)
PRESSURE_THRESHOLD = 0.90
#: a pod bound to this node gets this long to get its endpoint before it counts as failing
ENDPOINT_GRACE_SECONDS = 30.0
#: watch events not applied for this long mean the agent is behind the store
WATCH_LAG_LIMIT = 30.0
#: array maps are always "full" (every slot exists): their fill says nothing
ARRAY_TYPES = ("array", "percpu_array")
#: a conntrack table (live entries after GC) or a masquerade destination's ports fuller than this warn
CT_PRESSURE_THRESHOLD = 0.90


# ---- the loops' health (written by the agent's threads) -----------------------------------------

@dataclass
class Loop:
    """One controller loop: when it last went through, its last error, its failures."""

    name: str
    runs: int = 0
    last_success: float | None = None
    last_error: str | None = None
    last_error_time: float | None = None
    failures: int = 0            # consecutive: 0 once it goes through again
    total_failures: int = 0

    def ok(self) -> None:
        self.runs += 1
        self.last_success = time.time()
        self.failures = 0

    def failed(self, err: BaseException | str) -> None:
        self.runs += 1
        self.last_error = err if isinstance(err, str) else f"{type(err).__name__}: {err}"
        self.last_error_time = time.time()
        self.failures += 1
        self.total_failures += 1

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "runs": self.runs, "lastSuccess": self.last_success,
                "lastError": self.last_error, "lastErrorTime": self.last_error_time,
                "failures": self.failures, "totalFailures": self.total_failures,
                "ok": self.failures == 0}


class Loops:
    """The agent's loops by name, created on first mention."""

    def __init__(self, names: tuple[str, ...] = ("reconcile", "watch", "host-device")) -> None:
        self._loops: dict[str, Loop] = {n: Loop(n) for n in names}
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> Loop:
        with self._lock:
            return self._loops.setdefault(name, Loop(name))

    def as_list(self) -> list[dict[str, Any]]:
        with self._lock:
            return [self._loops[n].as_dict() for n in sorted(self._loops)]


class WatchState:
    """What the store watch loop saw: connected, the last event's revision and time, and since
    when events wait for a reconcile (the agent's lag behind the store)."""

    def __init__(self) -> None:
        self.connected = False
        self.revision: int | None = None
        self.last_event: float | None = None
        self.pending_since: float | None = None
        self.error: str | None = None

    def event(self, revision: int) -> None:
        now = time.time()
        self.revision = revision
        self.last_event = now
        if self.pending_since is None:
            self.pending_since = now

    def applied(self, started: float) -> None:
        """A reconcile pass that started at ``started`` went through: what it saw is applied."""
        if self.pending_since is not None and self.pending_since <= started:
            self.pending_since = None

    def lag(self, now: float | None = None) -> float:
        now = time.time() if now is None else now
        return max(0.0, now - self.pending_since) if self.pending_since is not None else 0.0


# ---- pure checks -----------------------------------------------------------------------------------

def mtu_check(pod_mtu: int, underlay_mtu: int | None, overhead: int = ENCAP_OVERHEAD) -> dict[str, Any]:
    """Whether a pod's full-size packet still fits the underlay once encapsulated."""
    doc: dict[str, Any] = {"podMTU": pod_mtu, "underlayMTU": underlay_mtu, "overhead": overhead}
    if underlay_mtu is None:
        return {**doc, "ok": False, "reason": "the uplink's MTU is unknown (no uplink)"}
    if pod_mtu + overhead > underlay_mtu:
        return {**doc, "ok": False,
                "reason": f"pod MTU {pod_mtu} + {overhead} encapsulation = {pod_mtu + overhead} > underlay MTU "
                          f"{underlay_mtu}: full-size packets between nodes cannot pass; set --mtu "
                          f"{underlay_mtu - overhead} or less"}
    return {**doc, "ok": True, "reason": None}


def map_pressure(name: str, entries: int, capacity: int, map_type: str = "hash",
                 threshold: float = PRESSURE_THRESHOLD) -> dict[str, Any]:
    """One map's fill; ``ok`` False above ``threshold`` (array maps are never flagged)."""
    ratio = entries / capacity if capacity else 0.0
    flagged = map_type not in ARRAY_TYPES and ratio > threshold
    return {"map": name, "type": map_type, "entries": entries, "capacity": capacity, "ratio": round(ratio, 4),
            "ok": not flagged,
            "reason": f"{name} {entries}/{capacity} entries ({ratio:.1%} full, over {threshold:.0%})"
            if flagged else None}


def _sub(name: str, problems: list[str], summary: str, warnings: list[str] | None = None,
         **facts: Any) -> dict[str, Any]:
    return {"name": name, "ok": not problems, "reason": "; ".join(problems) or None, "summary": summary,
            "warning": "; ".join(warnings or ()) or None, **facts}


def conntrack_check(ct: dict[str, Any] | None, now: float,
                    threshold: float = CT_PRESSURE_THRESHOLD) -> dict[str, Any]:
    """The ``conntrack`` subsystem from the last GC pass (``GcResult.as_dict``; None before the
    first): warnings for every endpoint at its limit in a table, every table whose live entries
    pass ``threshold`` of its capacity and every masquerade destination whose ports do."""
    if ct is None:
        return _sub("conntrack", [], "not walked yet", tables=[], endpoints=[], masquerade=[])
    warnings = []
    at_limit = []
    for ep in ct.get("endpoints") or ():
        for table, n in sorted((ep.get("flows") or {}).items()):
            if ep.get("limit") and n >= ep["limit"]:
                at_limit.append({"pod": ep["pod"], "table": table, "flows": n, "limit": ep["limit"]})
                warnings.append(f"{ep['pod']} is at its conntrack limit in {table} ({n}/{ep['limit']} flows): "
                                f"its new flows there drop as ct-endpoint-limit")
    tables = []
    for t in ct.get("tables") or ():
        ratio = t["entries"] / t["capacity"] if t["capacity"] else 0.0
        tables.append({**t, "ratio": round(ratio, 4)})
        if ratio > threshold:
            warnings.append(f"{t['table']} {t['entries']}/{t['capacity']} live entries ({ratio:.1%}): a full "
                            f"table evicts the least recently used flows, idle established ones included")
    masq = []
    for d in ct.get("masquerade") or ():
        ratio = d["used"] / d["capacity"] if d["capacity"] else 0.0
        masq.append({**d, "ratio": round(ratio, 4)})
        if ratio > threshold:
            warnings.append(f"masquerade ports to {d['remote']}:{d['port']}/{d['proto']} {d['used']}/{d['capacity']} "
                            f"in use ({ratio:.1%}): new flows there drop as nat-failed when none is free")
    top = max(tables, key=lambda t: t["ratio"], default=None)
    fullest_masq = masq[0] if masq else None
    summary = (f"gc {_secs(_age(ct.get('finished'), now))}: "
               + (f"fullest {top['table']} {top['ratio']:.1%}, " if top else "")
               + f"{ct.get('deleted', 0)} expired deleted, {len(at_limit)} at a pod's limit"
               + (f", masquerade fullest {fullest_masq['used']}/{fullest_masq['capacity']} ports"
                  if fullest_masq else ""))
    return _sub("conntrack", [], summary, warnings, lastRunAge=_age(ct.get("finished"), now),
                duration=ct.get("duration"), deleted=ct.get("deleted", 0), tables=tables,
                endpoints=ct.get("endpoints") or [], atLimit=at_limit, masquerade=masq)


def _age(t: float | None, now: float) -> float | None:
    return None if t is None else round(max(0.0, now - t), 3)


def _secs(s: float | None) -> str:
    if s is None:
        return "never"
    if s < 60:
        return f"{s:.1f}s ago"
    if s < 3600:
        return f"{s / 60:.0f}m ago"
    return f"{s / 3600:.1f}h ago"


def liveness_check(lv: dict[str, Any], now: float) -> dict[str, Any]:
    """The ``liveness`` subsystem: the node's liveness record renewed in time, or the node is
    degraded because the store is unavailable (``lv``: LivenessKeeper.facts)."""
    ttl, renewed = lv.get("ttl") or 0.0, lv.get("lastRenewed")
    age = _age(renewed, now)
    probs = []
    if lv.get("failingSince") is not None:
        down = now - lv["failingSince"]
        gone = (f"other nodes see this node as not ready (its record expired {ttl:.0f}s after the last "
                f"renewal)" if age is None or age > ttl else f"its record expires in {ttl - age:.0f}s")
        probs.append(f"degraded: store unavailable for {down:.0f}s, the node's liveness cannot be renewed "
                     f"({lv.get('lastError')}); {gone}; the datapath keeps forwarding on what is programmed")
    elif age is None or age > ttl:
        probs.append(f"the node's liveness was not renewed for {_secs(age)} (ttl {ttl:.0f}s)")
    summary = (f"degraded: store unavailable, last renewal {_secs(age)}" if probs else
               f"record held, renewed {_secs(age)} (ttl {ttl:.0f}s)")
    return _sub("liveness", probs, summary, degraded=bool(probs), ttl=ttl, lastRenewedAge=age,
                expired=lv.get("expired", 0))


def endpoint_states(pods: list[dict[str, Any]], endpoints: dict[str, dict[str, Any]], now: float,
                    grace: float = ENDPOINT_GRACE_SECONDS) -> list[dict[str, Any]]:
    """Each local pod's endpoint state: ``ready`` (program attached, veth and delivery entries
    present), ``pending`` (no endpoint yet, within the grace period after the pod was created) or
    ``failing`` with the reason. ``pods``: ``{"pod", "created"}``; ``endpoints`` by pod:
    ``{"ifname", "attached" (bool), "attachReason", "veth" (bool), "delivery" (missing prefixes)}``."""
    out = []
    for p in pods:
        ep = endpoints.get(p["pod"])
        young = p.get("created") is not None and now - p["created"] < grace
        if ep is None:
            state, reason = ("pending", "no endpoint yet") if young else (
                "failing", f"no endpoint after {grace:.0f}s (no interface or no lease on this node)")
        elif not ep.get("attached"):
            state, reason = "failing", f"program not attached to {ep.get('ifname')}: {ep.get('attachReason')}"
        elif not ep.get("veth") or ep.get("delivery"):
            what = ([] if ep.get("veth") else ["no veth entry"]) + \
                [f"no delivery entry {d}" for d in ep.get("delivery") or ()]
            state, reason = ("pending" if young else "failing"), ", ".join(what)
        else:
            state, reason = "ready", None
        out.append({"pod": p["pod"], "state": state, "reason": reason, "ifname": (ep or {}).get("ifname")})
    return out


def assemble(f: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """The status document from gathered facts (see :func:`gather` for their shape)."""
    now = time.time() if now is None else now
    subs: list[dict[str, Any]] = []

    w = f["watch"]
    probs = []
    if not w.get("connected"):
        probs.append("not connected to the store" + (f": {w['error']}" if w.get("error") else ""))
    lag = w.get("lag") or 0.0
    if lag > WATCH_LAG_LIMIT:
        probs.append(f"store changes wait {lag:.0f}s for a reconcile (over {WATCH_LAG_LIMIT:.0f}s)")
    subs.append(_sub("store-watch", probs,
                     f"{'connected' if w.get('connected') else 'disconnected'}, last event "
                     f"{_secs(_age(w.get('lastEvent'), now))}, lag {lag:.1f}s",
                     connected=bool(w.get("connected")), revision=w.get("revision"),
                     lastEventAge=_age(w.get("lastEvent"), now), lag=round(lag, 3)))

    lv = f.get("liveness")
    if lv is not None:
        subs.append(liveness_check(lv, now))

    r = f["reconcile"]
    probs = [f"last pass failed: {r['lastError']}"] if r.get("lastError") else []
    n = r.get("reconciles", 0)
    subs.append(_sub("reconcile", probs, f"{n} pass{'' if n == 1 else 'es'}, last {_secs(_age(r.get('lastReconcile'), now))}, "
                     f"{r.get('errors', 0)} errors", passes=r.get("reconciles", 0), errors=r.get("errors", 0),
                     lastReconcileAge=_age(r.get("lastReconcile"), now)))

    ip = f["ipam"]
    probs = list(ip.get("errors") or ())
    for b in ip.get("blocks") or ():
        if b["size"] and b["leases"] >= b["size"]:
            probs.append(f"block {b['cidr']} of {b['network']} is full ({b['leases']}/{b['size']})")
    blocks = ip.get("blocks") or []
    subs.append(_sub("ipam", probs, f"{len(blocks)} blocks, {sum(b['leases'] for b in blocks)} leases",
                     blocks=blocks))

    sg = f["segments"]
    subs.append(_sub("segments", list(sg.get("errors") or ()), f"{sg.get('count', 0)} segments, "
                     f"{sg.get('local', 0)} used by local endpoints", count=sg.get("count", 0), local=sg.get("local", 0)))

    for name in ("policy", "services"):
        pr = f.get(name + "Pressure")
        probs = [f"map full ({pr['reason']}): entries left out"] if pr and pr.get("reason") else []
        if name == "services" and pr and pr.get("leftOut"):
            n, shown = pr["frontends"] - pr["programmed"], pr["leftOut"][:5]
            more = f", {n - len(shown)} more" if n > len(shown) else ""
            probs = [f"map full ({pr['reason']}): {n} frontends left out ({', '.join(shown)}{more}); "
                     "new flows to them are dropped as map-full"]
        extra = {"pressure": pr}
        if name == "policy":
            summary = f"{f.get('policyEntries', 0)} policy entries"
            extra["entries"] = f.get("policyEntries", 0)
        else:
            summary = (f"{pr.get('programmed')}/{pr.get('frontends')} frontends programmed" if pr
                       else "no frontends")
        subs.append(_sub(name, probs, summary + ("" if not probs else ", map full"), **extra))

    pb = f["probes"]
    probs = []
    if pb.get("kubeletCgroup") and not pb.get("kubeletCgroupId"):
        probs.append(f"kubelet cgroup {pb['kubeletCgroup']} has no ID (missing?)")
    subs.append(_sub("probes", probs, f"{pb.get('entries', 0)} probe entries, kubelet cgroup "
                     f"{pb.get('kubeletCgroup') or 'not configured (any host process may probe)'}", **pb))

    a = f["attach"]
    probs = [f"{x['what']}: {x['reason']}" for x in [a["uplink"], a["host"], *a.get("sock", [])] if not x.get("ok")]
    bad_pods = [p for p in a.get("pods") or () if not p.get("ok")]
    probs += [f"pod {p['pod']} ({p['ifname']}): {p['reason']}" for p in bad_pods]
    pods = a.get("pods") or []
    subs.append(_sub("datapath", probs, f"uplink {a['uplink'].get('ifname')}, host device, "
                     f"{len(a.get('sock') or [])} socket hooks, {len(pods) - len(bad_pods)}/{len(pods)} pod programs attached",
                     **a))

    fl = f["flows"]
    probs = [] if fl.get("running") else ["the flow collector is not running"]
    subs.append(_sub("flows", probs, f"{'running' if fl.get('running') else 'stopped'}, {fl.get('received', 0)} events, "
                     f"{fl.get('lost', 0)} lost", **fl))

    m = mtu_check(f["mtu"]["pod"], f["mtu"].get("underlay"))
    m["ifname"] = f["mtu"].get("uplink")
    subs.append(_sub("mtu", [m["reason"]] if not m["ok"] else [],
                     f"pod {m['podMTU']} + {m['overhead']} <= underlay {m['underlayMTU']}" if m["ok"]
                     else f"pod {m['podMTU']} + {m['overhead']} > underlay {m['underlayMTU']}", **m))

    maps = [map_pressure(x["map"], x["entries"], x["capacity"], x.get("type", "hash")) for x in f["maps"]]
    full = [x for x in maps if not x["ok"]]
    top = max((x for x in maps if x["type"] not in ARRAY_TYPES), key=lambda x: x["ratio"], default=None)
    subs.append(_sub("maps", [x["reason"] for x in full],
                     f"{len(maps)} maps, fullest {top['map']} {top['ratio']:.1%}" if top else f"{len(maps)} maps",
                     maps=maps))

    eps = endpoint_states(f["pods"], f["endpoints"], now)
    ready = sum(1 for e in eps if e["state"] == "ready")
    failing = [e for e in eps if e["state"] == "failing"]
    subs.append(_sub("endpoints", [f"{e['pod']}: {e['reason']}" for e in failing],
                     f"{ready}/{len(eps)} ready", ready=ready, total=len(eps), endpoints=eps))

    subs.append(conntrack_check(f.get("conntrack"), now))

    loops = f.get("loops") or []
    for lp in loops:
        for k in ("lastSuccess", "lastErrorTime"):
            lp[k + "Age"] = _age(lp.get(k), now)
    problems = [f"{s['name']}: {s['reason']}" for s in subs if not s["ok"]]
    warnings = [f"{s['name']}: {s['warning']}" for s in subs if s.get("warning")]
    return {"node": f["node"], "version": f.get("version", __version__), "pid": f.get("pid"),
            "uptime": _age(f.get("started"), now), "healthy": not problems, "problems": problems,
            "warnings": warnings,
            "endpoints": {"ready": ready, "total": len(eps)}, "subsystems": subs, "loops": loops,
            "metrics": f.get("metrics")}


# ---- facts (I/O) -----------------------------------------------------------------------------------

def _attach_check(what: str, path: str, want_ifindex: int | None, want_prog: int | None,
                  ifname: str | None = None) -> dict[str, Any]:
    """A pinned tcx link against the interface and program it should carry."""
    from lace.bpf import BPFError, Link
    doc: dict[str, Any] = {"what": what, "ifname": ifname, "ifindex": want_ifindex, "pin": path}
    if want_ifindex is None:
        return {**doc, "ok": False, "reason": f"interface {ifname} does not exist"}
    if not os.path.exists(path):
        return {**doc, "ok": False, "reason": f"no pinned link {os.path.basename(path)}"}
    try:
        link = Link.open_pinned(path)
        try:
            info = link.info()
        finally:
            link.close()
    except BPFError as e:
        return {**doc, "ok": False, "reason": f"pinned link unusable: {e}"}
    doc.update(linkId=info.id, progId=info.prog_id, linkIfindex=info.ifindex)
    if not info.ifindex:
        return {**doc, "ok": False, "reason": f"link {info.id} is detached (defunct)"}
    if info.ifindex != want_ifindex:
        return {**doc, "ok": False, "reason": f"link {info.id} sits on ifindex {info.ifindex}, not {want_ifindex}"}
    if want_prog and info.prog_id != want_prog:
        return {**doc, "ok": False, "reason": f"link {info.id} runs program {info.prog_id}, not this agent's {want_prog}"}
    return {**doc, "ok": True, "reason": None}


def _prog_id(agent: Any, name: str) -> int | None:
    from lace.bpf.info import prog_info_fd
    try:
        return prog_info_fd(agent.datapath.program(name).fd).id
    except Exception:
        return None


def _attach_facts(agent: Any, snap: Any) -> dict[str, Any]:
    from lace import netlink
    from lace.bpf import BPFError, Link
    from lace.bpf.cgroup import attach_type, cgroup_id, cgroup_link_target

    from .datapath import HOST_LINK, HOST_PROGRAM, POD_PROGRAM, UPLINK_LINK, UPLINK_PROGRAM, pod_link_name
    from .hostdev import NET_IFNAME
    from .socklb import HOOK_PROGRAMS

    links_dir = agent.datapath.links_dir
    up = netlink.link(agent.uplink)
    net = netlink.link(NET_IFNAME)
    out: dict[str, Any] = {
        "uplink": _attach_check("uplink", os.path.join(links_dir, UPLINK_LINK), up.ifindex if up else None,
                                _prog_id(agent, UPLINK_PROGRAM), agent.uplink),
        "host": _attach_check("host device", os.path.join(links_dir, HOST_LINK), net.ifindex if net else None,
                              _prog_id(agent, HOST_PROGRAM), NET_IFNAME),
        "sock": [], "pods": [], "stalePins": []}
    if agent.socklb is not None:
        try:
            target = cgroup_id(agent.socklb.cgroup)
        except OSError:
            target = None
        for hook in HOOK_PROGRAMS:
            doc: dict[str, Any] = {"what": f"socket hook {hook}", "ok": True, "reason": None}
            try:
                link = Link.open_pinned(agent.socklb.path(hook))
                try:
                    at = cgroup_link_target(link)
                finally:
                    link.close()
                if target is None:
                    doc.update(ok=False, reason=f"cgroup {agent.socklb.cgroup} is gone")
                elif at != (target, attach_type(hook)):
                    doc.update(ok=False, reason=f"link not on cgroup {agent.socklb.cgroup} (detached)")
            except BPFError as e:
                doc.update(ok=False, reason=f"no pinned link ({e.strerror if hasattr(e, 'strerror') else e})")
            out["sock"].append(doc)
    pod_prog = _prog_id(agent, POD_PROGRAM)
    expected = set()
    for ep in (snap.endpoints if snap is not None else ()):
        expected.add(ep.host_ifname)
        doc = _attach_check("pod", os.path.join(links_dir, pod_link_name(ep.host_ifname)), ep.ifindex,
                            pod_prog, ep.host_ifname)
        doc["pod"] = ep.pod
        out["pods"].append(doc)
    out["stalePins"] = sorted(set(agent.datapath.pod_links()) - expected)
    return out


def _store_facts(agent: Any) -> dict[str, Any]:
    """IPAM, segments and this node's pods, from the agent's cache of the store (what its passes
    read, as current as its watch: the store-watch subsystem says how current). Listing the store
    instead would decode every pod and lease of the cluster at each scrape: at 10k pods ~40 MiB
    made and thrown away every time."""
    cluster, node = agent.cluster, agent.node
    ipam: dict[str, Any] = {"blocks": [], "errors": []}
    seg: dict[str, Any] = {"count": 0, "local": 0, "errors": []}
    pods: list[dict[str, Any]] = []
    with cluster.lock:
        leases = [x for x in cluster.items("ipleases") if x.node == node]
        for b in cluster.items("ipblocks"):
            if b["spec"].get("node") != node:
                continue
            net = ipaddress.ip_network(b["spec"]["cidr"])
            n = sum(1 for x in leases if x.network == b["spec"]["network"] and x.ip in net)
            ipam["blocks"].append({"network": b["spec"]["network"], "cidr": str(net), "leases": n,
                                   "size": net.num_addresses})
        seg["count"] = len(cluster.items("segments"))
        pods = [{"pod": p.key, "created": p.created} for p in cluster.items("pods") if p.node == node and not p.done]
    return {"ipam": ipam, "segments": seg, "pods": pods}


def _endpoint_facts(agent: Any, snap: Any, attach: dict[str, Any]) -> dict[str, dict[str, Any]]:
    from lace.datapath.delivery import delivery_key
    from lace.datapath.endpoint import veth_key
    if snap is None:
        return {}
    try:
        veth = agent.datapath.read_kernel("veth")
        delivery = agent.datapath.read_kernel("delivery")
    except Exception:
        veth, delivery = {}, {}
    attached = {p["ifname"]: p for p in attach.get("pods") or ()}
    out = {}
    for ep in snap.endpoints:
        missing = []
        for ip in (ep.ipv4, ep.ipv6):
            if ip is not None:
                prefix = f"{ip}/{ip.max_prefixlen}"
                if delivery_key(ep.network, prefix) not in delivery:
                    missing.append(prefix)
        a = attached.get(ep.host_ifname) or {}
        out[ep.pod] = {"ifname": ep.host_ifname, "attached": bool(a.get("ok")), "attachReason": a.get("reason"),
                       "veth": veth_key(ep.ifindex) in veth, "delivery": missing}
    return out


def _map_facts(agent: Any) -> list[dict[str, Any]]:
    from lace.datapath import registry
    out = []
    svc = agent.services.pressure
    counted = [name for name, m in registry.MAPS.items()
               if m.map_type != "ringbuf" and name != "maglev" and m.map_type not in ARRAY_TYPES]
    try:
        counts = agent.datapath.entry_counts(counted)
    except Exception:
        counts = {}
    for name, m in registry.MAPS.items():
        if m.map_type == "ringbuf":
            continue
        if name == "maglev":   # an array of whole tables: its fill is the tables in use
            if svc is not None:
                out.append({"map": name, "type": "tables", "entries": svc.tables_used,
                            "capacity": svc.tables_capacity})
            continue
        if m.map_type in ARRAY_TYPES:   # every slot exists: nothing to count
            out.append({"map": name, "type": m.map_type, "entries": m.max_entries, "capacity": m.max_entries})
            continue
        if name not in counts:
            continue
        out.append({"map": name, "type": m.map_type, "entries": counts[name], "capacity": m.max_entries})
    return out


def ring_backlog(events_map: Any) -> int | None:
    """Bytes in a BPF ring buffer not consumed yet (producer position - consumer position, from its
    first two pages mapped read-only): how far the flow collector is behind the datapath."""
    import mmap
    import struct
    try:
        ps = mmap.PAGESIZE
        with mmap.mmap(events_map.fd, ps, mmap.MAP_SHARED, mmap.PROT_READ, offset=0) as cons, \
                mmap.mmap(events_map.fd, ps, mmap.MAP_SHARED, mmap.PROT_READ, offset=ps) as prod:
            return max(0, struct.unpack_from("<Q", prod, 0)[0] - struct.unpack_from("<Q", cons, 0)[0])
    except Exception:
        return None


def flow_facts(flows: Any, events_map: Any = None) -> dict[str, Any]:
    """The flow collector: reader thread alive, events read, unreadable records, events lost (the
    datapath found the ring buffer full: its exact count), the ring buffer's unread bytes."""
    th = getattr(flows, "_thread", None)
    return {"running": th is not None and th.is_alive(), "received": getattr(flows, "received", 0),
            "decodeErrors": getattr(flows, "errors", 0), "lost": getattr(flows, "ring_lost", 0),
            "followers": flows.followers,
            "backlog": ring_backlog(events_map) if events_map is not None else None}


def _events_map(agent: Any) -> Any:
    try:
        return agent.datapath.map("events")
    except Exception:
        return None


def flow_loop(fl: dict[str, Any]) -> dict[str, Any]:
    """The flow collector as a loop entry (its reader thread; records it could not decode fail)."""
    return {"name": "flow-collector", "runs": fl.get("received", 0), "lastSuccess": None,
            "lastError": None if fl.get("running") else "not running", "lastErrorTime": None,
            "failures": 0 if fl.get("running") else 1, "totalFailures": fl.get("decodeErrors", 0),
            "ok": bool(fl.get("running"))}


def gather(agent: Any, *, maps: bool = True) -> dict[str, Any]:
    """Every fact :func:`assemble` needs, read now (``maps=False``: not the map fill, which the
    metrics read themselves)."""
    from lace import netlink
    snap = getattr(agent, "last_snapshot", None)
    with netlink.reuse():
        attach = _attach_facts(agent, snap)
        up = netlink.link(agent.uplink)
    store = _store_facts(agent)
    pol, svc = agent.policy.pressure, agent.services.pressure
    try:
        probe_entries = agent.datapath.entry_counts(["probes"])["probes"]
    except Exception:
        probe_entries = None
    w: WatchState = agent.watch_state
    st = agent.stats
    local_segments = {ep.segment for ep in snap.endpoints} if snap is not None else set()
    store["segments"]["local"] = len(local_segments)
    try:
        from lace.datapath.policy import POLICY_MAPS
        policy_entries = sum(agent.datapath.entry_counts(POLICY_MAPS).values())
    except Exception:
        policy_entries = 0
    return {
        "node": agent.node, "version": __version__, "pid": os.getpid(), "started": st.get("started"),
        "watch": {"connected": w.connected, "revision": w.revision, "lastEvent": w.last_event, "lag": w.lag(),
                  "error": w.error},
        "liveness": agent.liveness.facts() if getattr(agent, "liveness", None) is not None else None,
        "reconcile": {"reconciles": st.get("reconciles", 0), "errors": st.get("errors", 0),
                      "lastError": st.get("last_error"), "lastReconcile": st.get("last_reconcile")},
        "ipam": store["ipam"], "segments": store["segments"], "pods": store["pods"],
        "policyPressure": pol.as_dict() if pol else None, "policyEntries": policy_entries,
        "servicesPressure": svc.as_dict() if svc else None,
        "probes": {"entries": probe_entries, "kubeletCgroup": agent.kubelet_cgroup,
                   "kubeletCgroupId": agent.kubelet_cgroup_id},
        "attach": attach, "endpoints": _endpoint_facts(agent, snap, attach),
        "flows": flow_facts(agent.flows, _events_map(agent)),
        "mtu": {"pod": agent.mtu, "underlay": up.mtu if up else None, "uplink": agent.uplink},
        "maps": _map_facts(agent) if maps else [], "loops": agent.loops.as_list(),
        "conntrack": agent.ct_gc.as_dict() if getattr(agent, "ct_gc", None) is not None else None,
        "metrics": getattr(agent, "metrics_addresses", None),
    }


def status(agent: Any, *, maps: bool = True) -> dict[str, Any]:
    """``GET /v1/status``."""
    facts = gather(agent, maps=maps)
    facts["loops"].append(flow_loop(facts["flows"]))
    return assemble(facts)
