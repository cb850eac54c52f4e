"""ID -> name resolution through the store: networks, segments, pods (by IP or interface), services.

The data plane holds numbers; operators think in names.  :class:`Resolver` reads the store once
(lazily, on the first name asked for) and answers from memory.  An ID the store does not know is
shown as unresolved — ``segment 812 (unresolved)`` — never dropped.  :class:`NumericResolver` is
what ``-n`` gets: it never opens the store and prints the raw IDs.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

import lace.store
from lace.cli.errors import UnavailableError
from lace.datapath.common import POLICY_SEGMENTS, RESERVED_NETWORKS, RESERVED_SEGMENTS
from lace.services.model import PROTOCOLS, cluster_ips, service_id
from lace.store import kinds as K

ANN_HOST_IFNAME = K.HOST_IFNAME_ANNOTATION
ANN_POLICY_ID = K.POLICY_ID_ANNOTATION

StoreOpener = Callable[[], Any]


def _norm_ip(text: str) -> str | None:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def unresolved(kind: str, value: int | str) -> str:
    return f"{kind} {value} (unresolved)"


class NumericResolver:
    """``-n``: raw IDs and addresses; the store is never opened."""

    numeric = True

    def network(self, net_id: int) -> str:
        return str(net_id)

    def network_name(self, net_id: int) -> str | None:
        return None

    def segment(self, seg: int) -> str:
        return str(seg)

    def segment_name(self, seg: int) -> str | None:
        return None

    def peer(self, seg: int) -> str:
        return POLICY_SEGMENTS.get(seg, str(seg))

    def pod_for_ip(self, net_id: int, addr: str) -> str | None:
        return None

    def pod_for_ifname(self, ifname: str) -> str | None:
        return None

    def service(self, service_id: int, *, network: int | None = None, vip: str | None = None,
                port: int | None = None, proto: int | str | None = None) -> str:
        return str(service_id)

    def policy(self, policy_id: int) -> str:
        return str(policy_id)

    def ips_to_pods(self, net_id: int) -> dict[str, str]:
        return {}

    def preload(self) -> None:
        """Read the store now (while something else waits, e.g. a map dump); never with -n."""


class Resolver(NumericResolver):
    """Names from the store (read once, lazily); see the module docstring."""

    numeric = False

    def __init__(self, open_store: StoreOpener) -> None:
        self._open_store = open_store
        self._loaded = False
        self.networks: dict[int, str] = {}
        self.segments: dict[int, dict[str, Any]] = {}
        self.pods_by_ip: dict[tuple[str, str], str] = {}  # (network name, ip) -> ns/name
        self.pods_by_ifname: dict[str, str] = {}
        self.services_by_id: dict[int, str] = {}
        self.services_by_vip: dict[tuple[str, str, int, int], str] = {}  # (network, vip, port, proto)
        self.policies: dict[int, str] = {}

    @classmethod
    def from_objects(cls, objects: dict[str, list[dict]]) -> Resolver:
        """A resolver over given objects by kind (tests; a Kubernetes-backed store)."""
        r = cls(lambda: None)
        r._index(objects)
        return r

    def _load(self) -> None:
        if self._loaded:
            return
        store = self._open_store()
        try:
            objects = {k: store.list(k).items for k in
                       ("networks", "segments", "ipleases", "pods", "services", "networkpolicies")}
        except Exception as exc:  # a store error: say so, and how to do without it
            raise UnavailableError(f"cannot read the store to resolve names: {getattr(exc, 'message', exc)}",
                                   hint="pass -n/--numeric to print raw IDs without the store") from None
        finally:
            close = getattr(store, "close", None)
            if close:
                close()
        self._index(objects)

    def preload(self) -> None:
        """Read the store now rather than at the first name.  A failure is not raised here: the
        first lookup that needs the store tries again and raises it, as it would have anyway."""
        try:
            self._load()
        except Exception:  # noqa: BLE001 - re-raised by the lookup that needs it
            pass

    def _index(self, objects: dict[str, list[dict]]) -> None:
        self._loaded = True
        for net in objects.get("networks", []):
            nid = (net.get("status") or {}).get("id")
            if nid is not None:
                self.networks[int(nid)] = net["metadata"]["name"]
        for seg in objects.get("segments", []):
            sid = (seg.get("status") or {}).get("id")
            if sid is not None:
                self.segments[int(sid)] = seg.get("spec") or {}
        for lease in objects.get("ipleases", []):
            spec = lease.get("spec") or {}
            ip = _norm_ip(str(spec.get("ip", "")))
            if ip and spec.get("pod"):
                self.pods_by_ip[(spec.get("network", "default"), ip)] = spec["pod"]
            host = ((lease.get("metadata") or {}).get("annotations") or {}).get(ANN_HOST_IFNAME)
            if host and spec.get("pod"):
                self.pods_by_ifname[host] = spec["pod"]
        for pod in objects.get("pods", []):
            meta = pod.get("metadata") or {}
            name = f'{meta.get("namespace", "default")}/{meta.get("name")}'
            net = K.pod_network(pod)
            st = pod.get("status") or {}
            ips = [e.get("ip") for e in st.get("podIPs") or [] if isinstance(e, dict)] or [st.get("podIP")]
            for text in ips:
                ip = _norm_ip(str(text or ""))
                if ip:
                    self.pods_by_ip.setdefault((net, ip), name)
        for svc in objects.get("services", []):
            meta = svc.get("metadata") or {}
            name = f'{meta.get("namespace", "default")}/{meta.get("name")}'
            sid = service_id(svc)
            if sid is not None:
                self.services_by_id[sid] = name
            spec = svc.get("spec") or {}
            net = K.pod_network(svc)
            for vip in cluster_ips(svc):
                ip = str(vip)
                for p in spec.get("ports") or []:
                    proto = PROTOCOLS.get(str(p.get("protocol", "TCP")).upper(), 0)
                    self.services_by_vip[(net, ip, int(p.get("port", 0)), proto)] = name
        # policy IDs are derived from namespace/name the way the resolver programs them
        from lace.policy.ids import policy_ids
        refs = [f'{(p.get("metadata") or {}).get("namespace", "default")}/{(p.get("metadata") or {}).get("name")}'
                for p in objects.get("networkpolicies", [])]
        self.policies.update({pid: ref for ref, pid in policy_ids(refs).items()})
        for pol in objects.get("networkpolicies", []):
            meta = pol.get("metadata") or {}
            pid = (pol.get("status") or {}).get("id") or (meta.get("annotations") or {}).get(ANN_POLICY_ID)
            if pid is not None:
                try:
                    self.policies[int(pid)] = f'{meta.get("namespace", "default")}/{meta.get("name")}'
                except ValueError:
                    pass

    # -- lookups ------------------------------------------------------------------------------

    def network_name(self, net_id: int) -> str | None:
        net_id = int(net_id)
        if net_id in RESERVED_NETWORKS and net_id != 1:
            return RESERVED_NETWORKS[net_id]
        self._load()
        return self.networks.get(net_id) or RESERVED_NETWORKS.get(net_id)

    def network(self, net_id: int) -> str:
        return self.network_name(net_id) or unresolved("network", net_id)

    def segment_name(self, seg: int) -> str | None:
        seg = int(seg)
        if seg in RESERVED_SEGMENTS:
            return RESERVED_SEGMENTS[seg]
        self._load()
        spec = self.segments.get(seg)
        if spec is None:
            return None
        labels = ",".join(f"{k}={v}" for k, v in sorted((spec.get("labels") or {}).items())) or "<no labels>"
        return f'{spec.get("namespace", "?")} {labels} ({spec.get("network", "?")})'

    def segment(self, seg: int) -> str:
        return self.segment_name(seg) or unresolved("segment", seg)

    def peer(self, seg: int) -> str:
        return POLICY_SEGMENTS[seg] if seg in POLICY_SEGMENTS else self.segment(seg)

    def ips_to_pods(self, net_id: int) -> dict[str, str]:
        """Every known pod address of a network (by ID) -> ns/name."""
        name = self.network_name(net_id)
        return {ip: pod for (net, ip), pod in self.pods_by_ip.items() if net == name}

    def pod_for_ip(self, net_id: int, addr: str) -> str | None:
        name = self.network_name(net_id)
        ip = _norm_ip(addr)
        return self.pods_by_ip.get((name, ip)) if name and ip else None

    def pod_for_ifname(self, ifname: str) -> str | None:
        self._load()
        return self.pods_by_ifname.get(ifname)

    def service(self, service_id: int, *, network: int | None = None, vip: str | None = None,
                port: int | None = None, proto: int | str | None = None) -> str:
        self._load()
        name = self.services_by_id.get(int(service_id))
        if name is None and vip is not None and network is not None:
            pnum = proto if isinstance(proto, int) else PROTOCOLS.get(str(proto).upper(), 0)
            name = self.services_by_vip.get((self.network_name(network) or "", _norm_ip(vip) or "",
                                             int(port or 0), pnum))
        return name or unresolved("service", service_id)

    def policy(self, policy_id: int) -> str:
        if not policy_id:
            return "-"
        self._load()
        return self.policies.get(int(policy_id)) or unresolved("policy", policy_id)


def make_resolver(numeric: bool, open_store: StoreOpener) -> NumericResolver:
    return NumericResolver() if numeric else Resolver(open_store)


def for_node(numeric: bool, store_path: Callable[[], str]) -> NumericResolver:
    """The resolver a command gets: ``store_path()`` (which checks the file) runs only when a name
    is first needed, and never with ``-n``."""
    def open_store() -> Any:
        path = store_path()
        try:
            return lace.store.open_store(path)  # loads the store's backend now, on first use
        except lace.store.StoreError as exc:
            raise UnavailableError(f"cannot open the store {path}: {exc.message}",
                                   hint="pass -n/--numeric to print raw IDs without the store") from None
    return make_resolver(numeric, open_store)
