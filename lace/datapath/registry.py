"""The one registry of lace's maps and program objects: CLI name -> pin name -> key/value layouts -> decoders.

The CLI (``node bpf show``), the agent (the map writer) and the tests all look maps up here; the
schema tests check every entry against the compiled objects' BTF (type, key and value struct,
capacity, flags), so the Python side cannot drift from ``bpf/lib/maps.h``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from lace.bpf.layout import Layout
from lace.datapath import config, conntrack, delivery, devices, endpoint, policy, probes, routing, segment, services, trace
from lace.datapath.common import Family, Proto

#: BPF_F_NO_PREALLOC (uapi): LPM tries require it
BPF_F_NO_PREALLOC = 1
#: BPF_F_MMAPABLE (uapi): an array the agent reads and writes through memory (the maglev tables)
BPF_F_MMAPABLE = 1 << 10

KeyDecoder = Callable[[bytes], dict[str, Any]]
#: value decoders also get the raw key: some values need its family to render addresses
ValueDecoder = Callable[[bytes, bytes], dict[str, Any]]


def _generic(layout: Layout | None) -> KeyDecoder:
    def decode(raw: bytes) -> dict[str, Any]:
        return layout.unpack(raw) if layout is not None else {}

    return decode


def _value(fn: KeyDecoder) -> ValueDecoder:
    return lambda raw, _key: fn(raw)


@dataclass(frozen=True)
class MapDef:
    """One datapath map: how the CLI names it, its BPF (and pin) name, type, layouts and capacity.

    ``key`` is None for the ring buffer, whose ``value`` is the layout of one record.
    """

    cli_name: str
    pin_name: str
    map_type: str
    key: Layout | None
    value: Layout
    max_entries: int
    doc: str
    map_flags: int = 0
    decode_key: KeyDecoder | None = field(default=None, compare=False)
    decode_value: ValueDecoder | None = field(default=None, compare=False)

    @property
    def percpu(self) -> bool:
        return self.map_type.startswith("percpu_") or self.map_type.startswith("lru_percpu_")

    @property
    def lpm(self) -> bool:
        return self.map_type == "lpm_trie"

    def key_dict(self, raw: bytes) -> dict[str, Any]:
        """The key as a readable dict (addresses as strings, enums by label)."""
        return (self.decode_key or _generic(self.key))(raw)

    def value_dict(self, raw: bytes, key: bytes = b"") -> dict[str, Any]:
        """The value as a readable dict; ``key`` is the raw key it was stored under."""
        if self.decode_value is not None:
            return self.decode_value(raw, key)
        return _generic(self.value)(raw)


def _revnat_value(raw: bytes, key: bytes) -> dict[str, Any]:
    family = services.REVNAT_KEY.unpack(key)["family"] if key else Family.IPV6
    return services.decode_revnat(raw, family)


def _probe_value(raw: bytes, key: bytes) -> dict[str, Any]:
    family = probes.PROBE_KEY.unpack(key)["family"] if key else Family.IPV6
    return probes.decode_probe(raw, family)


_MAPS: tuple[MapDef, ...] = (
    MapDef("config", "lace_config", "array", config.CONFIG_KEY, config.CONFIG, config.CONFIG_MAX,
           "the node's own locator prefix, underlay address, node ID, MTU and datapath options",
           decode_key=config.decode_config_key, decode_value=_value(config.decode_config)),
    MapDef("devices", "lace_devices", "hash", devices.DEVICE_KEY, devices.DEVICE, devices.DEVICES_MAX,
           "ifindex -> managed interface role and MAC",
           decode_key=devices.decode_device_key, decode_value=_value(devices.decode_device)),
    MapDef("nexthops", "lace_nexthops", "lru_hash", devices.NEXTHOP_KEY, devices.NEXTHOP, devices.NEXTHOPS_MAX,
           "SID -> the underlay interface, MACs and MTU the node's FIB gave for it (the datapath's own cache, "
           "asked again after 100 ms)",
           decode_key=devices.decode_nexthop_key, decode_value=_value(devices.decode_nexthop)),
    MapDef("routing", "lace_routing", "lpm_trie", routing.ROUTING_KEY, routing.ROUTE, routing.ROUTING_MAX,
           "(source network, destination prefix) -> destination network, masquerade",
           map_flags=BPF_F_NO_PREALLOC,
           decode_key=routing.decode_routing_key, decode_value=_value(routing.decode_route)),
    MapDef("delivery", "lace_delivery", "lpm_trie", delivery.DELIVERY_KEY, delivery.DELIVERY,
           delivery.DELIVERY_MAX,
           "(network, destination prefix) -> local pod, remote node SID or host",
           map_flags=BPF_F_NO_PREALLOC,
           decode_key=delivery.decode_delivery_key, decode_value=_value(delivery.decode_delivery)),
    MapDef("delivery-exact", "lace_dlv_exact", "hash", delivery.DELIVERY_EXACT_KEY, delivery.DELIVERY,
           delivery.DELIVERY_EXACT_MAX,
           "(network, address) -> delivery's full-length (/32, /128) entries again: probed before the trie",
           decode_key=delivery.decode_delivery_exact_key, decode_value=_value(delivery.decode_delivery)),
    MapDef("veth", "lace_veth", "hash", endpoint.VETH_KEY, endpoint.ENDPOINT, endpoint.VETH_MAX,
           "pod interface ifindex -> endpoint, network, source segment, addresses",
           decode_key=endpoint.decode_veth_key, decode_value=_value(endpoint.decode_endpoint)),
    MapDef("services", "lace_services", "hash", services.SERVICE_KEY, services.SERVICE, services.SERVICES_MAX,
           "(source network, frontend, port, protocol, slot) -> service, counts, flags (slot 0) or backend",
           decode_key=services.decode_service_key, decode_value=_value(services.decode_service)),
    MapDef("backends", "lace_backends", "hash", services.BACKEND_KEY, services.BACKEND, services.BACKENDS_MAX,
           "backend ID -> backend address, port and network",
           decode_key=services.decode_backend_key, decode_value=_value(services.decode_backend)),
    MapDef("maglev", "lace_maglev", "array", services.MAGLEV_KEY, services.MAGLEV_VALUE, services.MAGLEV_MAX,
           "each multi-backend service's Maglev table: index -> backend ID", map_flags=BPF_F_MMAPABLE),
    MapDef("affinity", "lace_affinity", "lru_hash", services.AFFINITY_KEY, services.AFFINITY,
           services.AFFINITY_MAX, "(service, client network and address) -> backend (sessionAffinity ClientIP)",
           decode_key=services.decode_affinity_key, decode_value=_value(services.decode_affinity)),
    MapDef("revnat", "lace_revnat", "hash", services.REVNAT_KEY, services.REVNAT, services.REVNAT_MAX,
           "(backend network, address, port, protocol) -> the frontends its replies come from",
           decode_key=services.decode_revnat_key, decode_value=_revnat_value),
    MapDef("sock-revnat", "lace_sk_revnat", "lru_hash", services.SOCK_REVNAT_KEY, services.SOCK_REVNAT,
           services.SOCK_REVNAT_MAX, "(host socket cookie, backend) -> the frontend the socket asked for",
           decode_key=services.decode_sock_revnat_key, decode_value=_value(services.decode_sock_revnat)),
    MapDef("policy", "lace_policy", "lpm_trie", policy.POLICY_KEY, policy.POLICY_ENTRY, policy.POLICY_MAX,
           "(segment, peer segment, direction, protocol, port block) -> allow, its rule and hits: the port "
           "blocks of port ranges (node bpf show policy lists policy-exact's entries with them)",
           map_flags=BPF_F_NO_PREALLOC,
           decode_key=policy.decode_policy_key, decode_value=_value(policy.decode_policy_entry)),
    MapDef("policy-exact", "lace_pol_exact", "hash", policy.POLICY_KEY, policy.POLICY_ENTRY, policy.POLICY_MAX,
           "the selection markers and every policy entry but port blocks (exact port, whole protocol, any "
           "protocol), by exact key: lookups that cost the same however many entries there are",
           decode_key=policy.decode_policy_key, decode_value=_value(policy.decode_policy_entry)),
    MapDef("segment", "lace_segment", "hash", segment.SEGMENT_KEY, segment.SEGMENT_VALUE, segment.SEGMENT_MAX,
           "(network, endpoint IP) -> segment",
           decode_key=segment.decode_segment_key, decode_value=_value(segment.decode_segment_value)),
    MapDef("prefix-segment", "lace_pfx_seg", "lpm_trie", segment.PREFIX_SEGMENT_KEY, segment.SEGMENT_VALUE,
           segment.PREFIX_SEGMENT_MAX, "(network, prefix) -> segment",
           map_flags=BPF_F_NO_PREALLOC,
           decode_key=segment.decode_prefix_segment_key, decode_value=_value(segment.decode_segment_value)),
    MapDef("probes", "lace_probes", "hash", probes.PROBE_KEY, probes.PROBE, probes.PROBES_MAX,
           "(pod address, port) -> configured kubelet probe target",
           decode_key=probes.decode_probe_key, decode_value=_probe_value),
    MapDef("probe-cookie", "lace_probe_ck", "lru_hash", probes.PROBE_COOKIE_KEY, probes.PROBE_COOKIE,
           probes.PROBE_COOKIE_MAX, "socket cookie -> in-flight probe connection's original destination",
           decode_key=probes.decode_probe_cookie_key, decode_value=_value(probes.decode_probe_cookie)),
    *(
        MapDef(f"ct-{proto}-v{v}", f"lace_ct_{proto}{v}", "lru_hash",
               conntrack.CT4_KEY if v == 4 else conntrack.CT6_KEY, conntrack.CT_ENTRY, cap,
               f"{proto.upper()} over IPv{v} conntrack: tuple -> state, NAT, counters, expiry",
               decode_key=conntrack.decode_ct4_key if v == 4 else conntrack.decode_ct6_key,
               decode_value=_value(conntrack.decode_ct4_entry if v == 4 else conntrack.decode_ct6_entry))
        for v in (4, 6)
        for proto, cap in (("tcp", conntrack.CT_TCP_MAX), ("udp", conntrack.CT_UDP_MAX),
                           ("icmp", conntrack.CT_ICMP_MAX))
    ),
    MapDef("endpoint-ct", "lace_ep_ct", "hash", conntrack.CT_ENDPOINT_KEY, conntrack.CT_ENDPOINT,
           conntrack.CT_ENDPOINT_MAX,
           "pod interface ifindex -> conntrack flows the endpoint opened per table (against its limit)",
           decode_key=conntrack.decode_ct_endpoint_key, decode_value=_value(conntrack.decode_ct_endpoint)),
    MapDef("events", "lace_events", "ringbuf", None, trace.TRACE_EVENT, trace.EVENTS_BYTES,
           "ring buffer of flow decisions (struct lace_trace_event records); max_entries is its size in bytes",
           decode_value=_value(trace.decode_trace_event)),
    MapDef("metrics", "lace_metrics", "percpu_array", trace.METRICS_KEY, trace.METRICS_VALUE, trace.METRICS_MAX,
           "per-CPU packet and byte counters by (drop reason, trace point, verdict)",
           decode_key=trace.decode_metrics_key, decode_value=_value(trace.decode_metrics_value)),
)

#: CLI name -> map definition, in the order ``node bpf`` lists them
MAPS: dict[str, MapDef] = {m.cli_name: m for m in _MAPS}

#: conntrack tables in the order ``node bpf ct`` walks them
CT_TABLES: tuple[str, ...] = ("ct-tcp-v6", "ct-udp-v6", "ct-icmp-v6", "ct-tcp-v4", "ct-udp-v4", "ct-icmp-v4")

#: the maps ``node bpf show`` accepts
SHOWABLE: tuple[str, ...] = (
    "config", "devices", "routing", "delivery", "delivery-exact", "veth", "services", "revnat", "policy",
    "segment", "prefix-segment", "probes", "probe-cookie", "nexthops",
)


def by_pin_name() -> dict[str, MapDef]:
    """Pin (BPF object) name -> map definition."""
    return {m.pin_name: m for m in _MAPS}


def get(cli_name: str) -> MapDef:
    """The map called ``cli_name``; KeyError lists the known names."""
    try:
        return MAPS[cli_name]
    except KeyError:
        raise KeyError(f"unknown map {cli_name!r}; known maps: {', '.join(MAPS)}") from None


_CT_PROTOS = {Proto.TCP: "tcp", Proto.UDP: "udp", Proto.ICMP: "icmp", Proto.ICMPV6: "icmp"}


def ct_table(family: int, proto: int) -> str:
    """The CLI name of the conntrack table for a family and IP protocol, e.g. ``ct-tcp-v4``."""
    fam = Family(family)
    try:
        name = _CT_PROTOS[Proto(proto)]
    except ValueError:
        raise ValueError(f"no conntrack table for IP protocol {proto}") from None
    return f"ct-{name}-v{4 if fam is Family.IPV4 else 6}"


# --- program objects -----------------------------------------------------------------------------

#: program object name -> file under build/bpf: the tc programs of the pod veths, the uplink and the
#: host device, and the cgroup socket hooks of the node's host processes
OBJECTS: dict[str, str] = {"pod_veth": "pod_veth.o", "uplink": "uplink.o", "host": "host.o", "sock": "sock.o"}

#: the map iterator (not a datapath program) that reads every hash map's entry count the kernel
#: keeps (lace.bpf.iter), and its program
MAP_ENTRIES_OBJECT = "map_entries.o"
MAP_ENTRIES_PROGRAM = "lace_map_entries"
#: the UDP socket iterator (not a datapath program) that terminates host sockets connected to a
#: backend that left its service (lace.agent.socklb.terminate_udp), and its program
SOCK_TERM_OBJECT = "sock_term.o"
SOCK_TERM_PROGRAM = "lace_sock_terminate"
#: the iterator objects, by name: loaded on demand beside the datapath's OBJECTS
ITERATORS: dict[str, str] = {"map_entries": MAP_ENTRIES_OBJECT, "sock_term": SOCK_TERM_OBJECT}

#: the repository root (lace/datapath/registry.py -> ../..)
REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def bpf_dir() -> Path:
    """Where the compiled objects live: $LACE_BPF_DIR, else <repo>/build/bpf."""
    env = os.environ.get("LACE_BPF_DIR")
    return Path(env) if env else REPO_ROOT / "build" / "bpf"


def bpf_object_path(name: str) -> Path:
    """The path of program object ``name`` (a key of OBJECTS, or its file name).

    Raises FileNotFoundError saying how to build it when it is missing.
    """
    file = OBJECTS.get(name, name)
    if file not in OBJECTS.values():
        raise KeyError(f"unknown BPF object {name!r}; known objects: {', '.join(OBJECTS)}")
    path = bpf_dir() / file
    if not path.is_file():
        raise FileNotFoundError(
            f"BPF object {path} not found: run `make bpf` in {REPO_ROOT}"
            + (" (or fix LACE_BPF_DIR)" if os.environ.get("LACE_BPF_DIR") else "")
        )
    return path
