"""Pod interfaces: what CNI ADD / DEL / CHECK do on this node.

ADD: the pod's network and labels from the store, addresses from IPAM, the segment, a veth pair
(host side ``lx<hash>`` here, ``eth0`` in the pod) with addresses, a link-local gateway answered by
permanent neighbour entries, the maps for the endpoint and the pod program on the host side — all
before the pod's interface comes up, so its first packet already meets the datapath.
DEL undoes every trace: link, veth, map entries, conntrack entries, leases.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from lace import netlink
from lace.netlink import LOOPBACK_IFINDEX, LinkInfo
from lace.cni.spec import (CNI_VERSION, E_INVALID_CONFIG, E_INVALID_ENV, E_IO, E_IPAM_EXHAUSTED, E_POD_UNKNOWN,
                           E_UNKNOWN_CONTAINER, error_result)
from lace.store.errors import NotFound
from lace.probes import pod_probe_ports
from lace.store import kinds as K
from lace.store.kinds import pod_network

from .hostdev import HOST_IFNAME
from .ipam import Ipam, IpamExhausted
from .cluster import ClusterCache
from .model import (ANN_HOST_IFNAME, ANN_POD_MAC, GATEWAY4, GATEWAY6, is_host_lease, lease_container,
                    lease_pod, probe_container_id, probe_pod)

log = logging.getLogger("lace.agent.endpoints")


class CniError(Exception):
    """A CNI error result: code (lace.cni.spec), msg, details."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code, self.msg, self.details = code, msg, details

    def result(self) -> dict[str, Any]:
        return error_result(self.code, self.msg, self.details)


def host_ifname(container_id: str) -> str:
    return "lx" + hashlib.sha256(container_id.encode()).hexdigest()[:10]


def pod_mac(container_id: str) -> str:
    h = hashlib.sha256(b"mac" + container_id.encode()).digest()
    return ":".join(f"{b:02x}" for b in (0x02, h[0], h[1], h[2], h[3], h[4]))


class _Attach:
    """The pod program's attachment, running in a thread; ``join`` re-raises its failure."""

    def __init__(self, datapath, host: str, ifindex: int) -> None:
        self.error: BaseException | None = None

        def run() -> None:
            try:
                datapath.attach_pod(host, ifindex)
            except BaseException as e:  # noqa: BLE001 - handed to join()
                self.error = e
        self.thread = threading.Thread(target=run, name=f"attach-{host}", daemon=True)
        self.thread.start()

    def join(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


@dataclass
class CniRequest:
    command: str
    container_id: str
    netns: str
    ifname: str
    pod_namespace: str
    pod_name: str

    @classmethod
    def parse(cls, body: dict[str, Any]) -> CniRequest:
        """The request the plugin sent; a missing field, or one of the wrong type (the socket is
        reachable by anything root runs on the node), is a CNI error naming it."""
        def text(where: dict[str, Any], key: str, default: str | None = None, name: str | None = None) -> str:
            value = where.get(key)
            value = default if value is None else value
            if value is None:
                raise CniError(E_INVALID_ENV, f"missing {name or key}")
            if not isinstance(value, str) or "\0" in value:
                raise CniError(E_INVALID_ENV, f"{name or key} must be a string, not {value!r}")
            return value

        args = body.get("args") or {}
        if not isinstance(args, dict):
            raise CniError(E_INVALID_ENV, f"args must be an object (CNI_ARGS as key=value pairs), not {args!r}")
        return cls(text(body, "command"), text(body, "containerID"), text(body, "netns", "") or "",
                   text(body, "ifname", "eth0") or "eth0",
                   text(args, "K8S_POD_NAMESPACE", "default", "args.K8S_POD_NAMESPACE"),
                   text(args, "K8S_POD_NAME", "", "args.K8S_POD_NAME"))


def lease_pods(leases: list[dict]) -> set[str]:
    """The pods (``namespace/name``) these IPLeases were leased to (a probe address's: the pod it
    stands for)."""
    return {pod for o in leases
            if (pod := lease_pod(o["spec"].get("pod") or "", o["spec"].get("containerID") or ""))}


class Endpoints:
    """CNI operations for this node; ``program`` programs the maps for the pods
    (``namespace/name``) an operation changed afterwards (the agent's program_pods). A pass reads
    the agent's cluster cache, which the watch keeps: what an operation wrote goes into the cache at
    once (``learn``, ``forget``), so the pass that follows sees it without waiting for the watch."""

    def __init__(self, store, node: str, mtu: int, datapath, program: Callable[[set[str]], None],
                 flush_conntrack: Callable[[int, list], int], cluster: ClusterCache) -> None:
        self.store = store
        self.node = node
        self.mtu = mtu
        self.datapath = datapath
        self.program = program
        self.cluster = cluster
        self.flush_conntrack = flush_conntrack
        self.ipam = Ipam(store, node)

    # -- ADD ---------------------------------------------------------------------------------

    def add(self, req: CniRequest) -> dict[str, Any]:
        return self._timed(req, self._add)

    def _timed(self, req: CniRequest, op: Callable[[CniRequest, Callable[[str], None]], dict[str, Any]]
               ) -> dict[str, Any]:
        """Run an ADD or DEL, logging its time and its phases' (each ``mark`` ends one)."""
        t0 = time.monotonic()
        marks: list[tuple[str, float]] = []

        def mark(what: str) -> None:
            marks.append((what, time.monotonic()))
        try:
            with netlink.reuse():
                return op(req, mark)
        finally:
            prev, parts = t0, []
            for what, t in marks:
                parts.append(f"{what} {(t - prev) * 1000:.0f}")
                prev = t
            who = f"{req.pod_namespace}/{req.pod_name}" if req.pod_name else req.container_id[:12]
            log.info("%s %s: %.0f ms (%s)", req.command, who, (time.monotonic() - t0) * 1000, ", ".join(parts))

    def _add(self, req: CniRequest, mark: Callable[[str], None]) -> dict[str, Any]:
        if not req.netns:
            raise CniError(E_INVALID_ENV, "CNI_NETNS is required for ADD")
        ref = f"{req.pod_namespace}/{req.pod_name}"
        try:
            pod = self.store.get("pods", req.pod_name, req.pod_namespace)
        except NotFound:
            raise CniError(E_POD_UNKNOWN, f"pod {ref} is not in the store",
                           "apply the Pod first; the runtime calls CNI for pods the API knows") from None
        net_name = pod_network(pod)
        try:
            network = self.store.get("networks", net_name)
        except NotFound:
            raise CniError(E_INVALID_CONFIG, f'pod {ref} asks for network "{net_name}", which does not exist',
                           "create the Network or fix the pod's lace.dev/network annotation") from None
        cidrs = [ipaddress.ip_network(c) for c in network["spec"].get("cidrs") or []]
        labels = (pod.get("metadata") or {}).get("labels") or {}
        host = host_ifname(req.container_id)
        mac = pod_mac(req.container_id)
        try:
            # the leases name the interfaces from the start (they exist once ADD has made them):
            # one store write for the pod's addresses, not one more per lease to annotate them
            leases = self.ipam.allocate(net_name, cidrs, ref, req.container_id, req.ifname,
                                        {ANN_HOST_IFNAME: host, ANN_POD_MAC: mac})
        except IpamExhausted as e:
            raise CniError(E_IPAM_EXHAUSTED, str(e)) from None
        try:
            probe_leases = self._probe_leases(pod, net_name, leases, ref, req.container_id)
        except IpamExhausted as e:
            self.ipam.release(req.container_id)
            raise CniError(E_IPAM_EXHAUSTED, f"pod {ref}: no probe address: {e}") from None
        self.store.allocate_segment(net_name, req.pod_namespace, labels)
        self.cluster.learn([pod, *(lease.object for lease in (*leases, *probe_leases) if lease.object)])
        mark("ipam")

        try:
            families, attaching, host_info = self._plumb(req, host, mac, leases)
            mark("interfaces")
            self.program({ref})            # maps for this endpoint (and everyone's view of it)
            mark("maps")
            attaching.join()
            mark("attach")
            # default routes go in last: until now the pod could send nowhere
            self._default_routes(req, families, host_info.peer_ifindex or req.ifname)
            result = self._result(req, host_info, mac, leases, probe_leases)
            mark("routes")
            return result
        except CniError:
            self._undo(req, host, ref)
            raise
        except Exception as e:
            self._undo(req, host, ref)
            raise CniError(E_IO, f"could not set up the interface of pod {ref}: {e}") from None

    def _probe_leases(self, pod: dict, net_name: str, leases, ref: str, container_id: str) -> list:
        """A pod of another network than the default one that the kubelet probes over TCP gets one
        probe address per family it has: an address of the default network from this node's block,
        leased to the pseudo-pod ``probe/<namespace>/<name>`` (no pod has that name, so nothing
        takes it for a pod address). The kubelet connects there; the host device's program sends
        exactly the configured probe ports of exactly the kubelet's sockets on into the pod
        (lace.agent.probes). Pods of the default network are probed at their own addresses."""
        if net_name == K.DEFAULT_NETWORK or not pod_probe_ports(pod):
            return []
        try:
            default = self.store.get("networks", K.DEFAULT_NETWORK)
        except NotFound:
            return []
        families = {lease.ip.version for lease in leases}
        cidrs = [c for c in (ipaddress.ip_network(c) for c in default["spec"].get("cidrs") or [])
                 if c.version in families]
        if not cidrs:
            return []
        return self.ipam.allocate(K.DEFAULT_NETWORK, cidrs, probe_pod(ref), probe_container_id(container_id),
                                  "probe")

    def _plumb(self, req: CniRequest, host: str, mac: str, leases) -> tuple[set[int], "_Attach", LinkInfo]:
        netlink.delete_link(host)   # a leftover of an interrupted ADD of the same container
        # the peer is created inside the pod's namespace, so it can carry its final name at once
        host_info = netlink.veth_pair(host, req.ifname, peer_netns=req.netns, peer_mac=mac, mtu=self.mtu)
        # every later request names its interface by ifindex: a name would cost a lookup each time
        # (pyroute2 spends ~1 ms of CPU on a request, a dozen of them here). The pod side's index is
        # the host side's IFLA_LINK; a new namespace's loopback is always ifindex 1.
        pod_if = host_info.peer_ifindex or req.ifname
        # attaching waits out a kernel RCU grace period (~10-20 ms here): let it run while the pod
        # side is configured; the pod cannot send anywhere before its default routes anyway
        attaching = _Attach(self.datapath, host, host_info.ifindex)
        netlink.set_up(host_info.ifindex)
        netlink.set_up(LOOPBACK_IFINDEX, netns=req.netns)
        has4 = has6 = False
        for lease in leases:
            plen = 32 if lease.ip.version == 4 else 128
            netlink.add_address(pod_if, f"{lease.ip}/{plen}", netns=req.netns)
            has4 |= lease.ip.version == 4
            has6 |= lease.ip.version == 6
        # eth0 must be up for routes through it; only the gateway is reachable until ADD has
        # attached the program and installs the default routes
        netlink.set_up(pod_if, netns=req.netns)
        if has4:
            netlink.add_neighbor(str(GATEWAY4), host_info.mac, pod_if, netns=req.netns)
            netlink.add_route(f"{GATEWAY4}/32", netns=req.netns, dev=pod_if, scope="link")
        if has6:
            netlink.add_neighbor(str(GATEWAY6), host_info.mac, pod_if, netns=req.netns)
        return {v for v, on in ((4, has4), (6, has6)) if on}, attaching, host_info

    def _default_routes(self, req: CniRequest, families: set[int], pod_if: int | str) -> None:
        if 4 in families:
            netlink.add_route("0.0.0.0/0", netns=req.netns, via=str(GATEWAY4), dev=pod_if)
        if 6 in families:
            netlink.add_route("::/0", netns=req.netns, via=str(GATEWAY6), dev=pod_if)

    def _result(self, req: CniRequest, hinfo: LinkInfo, mac: str, leases, probe_leases) -> dict[str, Any]:
        """The CNI result. The pod's own addresses are on its interface (index 1, the one with a
        sandbox), as a runtime reads them; its probe addresses, if any, are listed on the node's
        host device (index 2, no sandbox): what a kubelet connects to for the pod's probes."""
        ips, routes = [], []
        for lease in leases:
            v4 = lease.ip.version == 4
            ips.append({"address": f"{lease.ip}/{32 if v4 else 128}",
                        "gateway": str(GATEWAY4 if v4 else GATEWAY6), "interface": 1})
            routes.append({"dst": "0.0.0.0/0" if v4 else "::/0", "gw": str(GATEWAY4 if v4 else GATEWAY6)})
        interfaces = [{"name": hinfo.name, "mac": hinfo.mac},
                      {"name": req.ifname, "mac": mac, "mtu": self.mtu, "sandbox": req.netns}]
        if probe_leases:
            interfaces.append({"name": HOST_IFNAME})
            for lease in probe_leases:
                ips.append({"address": f"{lease.ip}/{32 if lease.ip.version == 4 else 128}", "interface": 2})
        return {
            "cniVersion": CNI_VERSION,
            "interfaces": interfaces,
            "ips": ips,
            "routes": routes,
            "dns": {},
        }

    def _undo(self, req: CniRequest, host: str, ref: str) -> None:
        try:
            self.datapath.detach_pod(host)
        except Exception as e:  # keep undoing: the rest must go too
            log.warning("detach %s: %s", host, e)
        try:
            netlink.delete_link(host)
        except Exception as e:
            log.warning("delete %s: %s", host, e)
        leases = self._release(req.container_id)
        self.cluster.forget(leases)
        self.program({ref, *lease_pods(leases)})

    def _release(self, container_id: str) -> list[dict]:
        """Delete the container's leases and its probe leases; returns them as they were."""
        return self.ipam.release(container_id) + self.ipam.release(probe_container_id(container_id))

    # -- DEL / CHECK -------------------------------------------------------------------------

    def delete(self, req: CniRequest) -> dict[str, Any]:
        """Idempotent, as the spec asks: deleting what is already gone succeeds."""
        return self._timed(req, self._delete)

    def _delete(self, req: CniRequest, mark: Callable[[str], None]) -> dict[str, Any]:
        host = host_ifname(req.container_id)
        self.datapath.detach_pod(host)
        removed = netlink.delete_link(host)
        mark("interfaces")
        leases = self._release(req.container_id)
        self.cluster.forget(leases)
        mark("ipam")
        # a repeated DEL (runtimes send them) finds nothing left: the maps already hold nothing of it
        if leases or removed:
            self.program(lease_pods(leases))
        mark("maps")
        for o in leases:
            try:
                net = self.store.get("networks", o["spec"]["network"])
            except NotFound:
                continue
            self.flush_conntrack(int(net["status"]["id"]), [ipaddress.ip_address(o["spec"]["ip"])])
        mark("conntrack")
        return {}

    def gc(self, valid: list[dict[str, Any]]) -> dict[str, Any]:
        """CNI GC: release what this node holds for containers the runtime no longer knows (the
        node's own host addresses are not a container's: they stay)."""
        keep = {a.get("containerID") for a in valid}
        # this node's leases only (the allocator labels each with its node): not the cluster's
        mine = self.store.list("ipleases", label_selector={"matchLabels": {K.NODE_LABEL: self.node}}).items
        stale = {lease_container(o["spec"]) for o in mine
                 if o["spec"]["node"] == self.node and lease_container(o["spec"]) not in keep
                 and not is_host_lease(o["spec"])}
        for cid in stale:
            if cid:
                self.delete(CniRequest("DEL", cid, "", "eth0", "", ""))
        return {}

    def check(self, req: CniRequest) -> dict[str, Any]:
        host = host_ifname(req.container_id)
        if not self.ipam.leases_for(req.container_id):
            raise CniError(E_UNKNOWN_CONTAINER, f"container {req.container_id} has no address on {self.node}")
        info = netlink.link(host)
        if info is None:
            raise CniError(E_IO, f"interface {host} of container {req.container_id} is missing")
        inner = netlink.link(req.ifname, netns=req.netns) if req.netns else None
        if req.netns and inner is None:
            raise CniError(E_IO, f"interface {req.ifname} is missing in {req.netns}")
        if host not in self.datapath.pod_links():
            raise CniError(E_IO, f"the lace program is not attached to {host}")
        return {}
