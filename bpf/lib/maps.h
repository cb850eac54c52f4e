/* Every lace map, pinned by name under the node's pin root so that all programs share them and
 * they outlive the agent. Types and capacities are mirrored by lace/datapath/registry.py and
 * checked against this object's BTF by tests/schema. */
#ifndef LACE_LIB_MAPS_H
#define LACE_LIB_MAPS_H

#include "lib/common.h"
#include "lace/abi/config.h"
#include "lace/abi/devices.h"
#include "lace/abi/routing.h"
#include "lace/abi/delivery.h"
#include "lace/abi/endpoint.h"
#include "lace/abi/segment.h"
#include "lace/abi/policy.h"
#include "lace/abi/conntrack.h"
#include "lace/abi/services.h"
#include "lace/abi/probes.h"
#include "lace/abi/trace.h"

/* config: the node's identity (one entry). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LACE_CONFIG_MAX);
	__type(key, __u32);
	__type(value, struct lace_config);
	LACE_PIN;
} lace_config SEC(".maps");

/* devices: managed interfaces by ifindex. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LACE_DEVICES_MAX);
	__type(key, struct lace_device_key);
	__type(value, struct lace_device);
	LACE_PIN;
} lace_devices SEC(".maps");

/* nexthops: the underlay's next hop per SID, cached from the FIB by the datapath (lib/srv6.h). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LACE_NEXTHOPS_MAX);
	__type(key, struct lace_nexthop_key);
	__type(value, struct lace_nexthop);
	LACE_PIN;
} lace_nexthops SEC(".maps");

/* routing: (source network, destination prefix) -> destination network. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, LACE_ROUTING_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lace_routing_key);
	__type(value, struct lace_route);
	LACE_PIN;
} lace_routing SEC(".maps");

/* delivery: (network, destination prefix) -> local pod / remote SID / host. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, LACE_DELIVERY_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lace_delivery_key);
	__type(value, struct lace_delivery);
	LACE_PIN;
} lace_delivery SEC(".maps");

/* delivery-exact: the delivery trie's full-length entries (/32, /128), same value, keyed by the trie
 * key past its prefixlen; probed before the trie (lib/delivery.h). Preallocated as the other
 * hashes: a lookup costs the same either way, and a pod's first entry needs no allocation. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LACE_DELIVERY_EXACT_MAX);
	__type(key, struct lace_delivery_exact_key);
	__type(value, struct lace_delivery);
	LACE_PIN;
} lace_dlv_exact SEC(".maps");

/* veth: pod interface -> endpoint. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LACE_VETH_MAX);
	__type(key, struct lace_veth_key);
	__type(value, struct lace_endpoint);
	LACE_PIN;
} lace_veth SEC(".maps");

/* segment: endpoint address in a network -> segment. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LACE_SEGMENT_MAX);
	__type(key, struct lace_segment_key);
	__type(value, struct lace_segment_value);
	LACE_PIN;
} lace_segment SEC(".maps");

/* prefix-segment: prefix in a network -> segment. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, LACE_PREFIX_SEGMENT_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lace_prefix_segment_key);
	__type(value, struct lace_segment_value);
	LACE_PIN;
} lace_pfx_seg SEC(".maps");

/* policy: the port blocks of port ranges, the only allow entries an exact key cannot find
 * (abi/policy.h). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, LACE_POLICY_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lace_policy_key);
	__type(value, struct lace_policy_entry);
	LACE_PIN;
} lace_policy SEC(".maps");

/* policy-exact: selection markers and every other allow entry (exact port, whole protocol, any
 * protocol), by exact key: a lookup costs the same at 16 entries as at 64k, where a trie deepens. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LACE_POLICY_MAX);
	__type(key, struct lace_policy_key);
	__type(value, struct lace_policy_entry);
	LACE_PIN;
} lace_pol_exact SEC(".maps");

/* services: VIP entries (slot 0) and their backend slots. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LACE_SERVICES_MAX);
	__type(key, struct lace_service_key);
	__type(value, struct lace_service);
	LACE_PIN;
} lace_services SEC(".maps");

/* backends: backend ID -> address. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LACE_BACKENDS_MAX);
	__type(key, struct lace_backend_key);
	__type(value, struct lace_backend);
	LACE_PIN;
} lace_backends SEC(".maps");

/* maglev: every multi-backend service's consistent-hash table (see abi/services.h); mappable, so
 * the agent reads and writes whole tables through memory instead of one syscall per batch */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, LACE_MAGLEV_MAX);
	__type(key, __u32);
	__type(value, __u32);
	LACE_PIN;
} lace_maglev SEC(".maps");

/* affinity: (service, client) -> backend for sessionAffinity ClientIP */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LACE_AFFINITY_MAX);
	__type(key, struct lace_affinity_key);
	__type(value, struct lace_affinity);
	LACE_PIN;
} lace_affinity SEC(".maps");

/* revnat: the frontends a backend's replies may come from (the agent writes it). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LACE_REVNAT_MAX);
	__type(key, struct lace_revnat_key);
	__type(value, struct lace_revnat);
	LACE_PIN;
} lace_revnat SEC(".maps");

/* sock-revnat: the frontend behind each (host socket, backend) the socket hooks translated. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LACE_SOCK_REVNAT_MAX);
	__type(key, struct lace_sock_revnat_key);
	__type(value, struct lace_sock_revnat);
	LACE_PIN;
} lace_sk_revnat SEC(".maps");

/* probes: configured kubelet probe targets. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LACE_PROBES_MAX);
	__type(key, struct lace_probe_key);
	__type(value, struct lace_probe);
	LACE_PIN;
} lace_probes SEC(".maps");

/* probe-cookie: in-flight probe connections by socket cookie. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LACE_PROBE_COOKIE_MAX);
	__type(key, struct lace_probe_cookie_key);
	__type(value, struct lace_probe_cookie);
	LACE_PIN;
} lace_probe_ck SEC(".maps");

#define LACE_CT_MAP(name, key_t, cap)                    \
	struct {                                          \
		__uint(type, BPF_MAP_TYPE_LRU_HASH);      \
		__uint(max_entries, cap);                 \
		__type(key, key_t);                       \
		__type(value, struct lace_ct_entry);      \
		LACE_PIN;                                 \
	} name SEC(".maps")

/* conntrack, one table per protocol and family. LRU, so that a full table evicts instead of
 * refusing new flows. Its cost is memory, not code: a new flow's lookup reads one cold bucket and
 * its insert pops a cold preallocated node, 250-500 ns together in a 1.2M-entry table on a 2-core VM
 * (bench/datapath.py's stage table). Measured there for the kernel's maps alone, an insert of a
 * fresh key at 1k / 1M entries: LRU 345 / 508 ns, per-CPU LRU lists (BPF_F_NO_COMMON_LRU)
 * 338 / 807, a preallocated plain hash 262 / 468 — which would fail when full instead of evicting:
 * no flag choice pays for a semantic change. */
LACE_CT_MAP(lace_ct_tcp4, struct lace_ct4_key, LACE_CT_TCP_MAX);
LACE_CT_MAP(lace_ct_udp4, struct lace_ct4_key, LACE_CT_UDP_MAX);
LACE_CT_MAP(lace_ct_icmp4, struct lace_ct4_key, LACE_CT_ICMP_MAX);
LACE_CT_MAP(lace_ct_tcp6, struct lace_ct6_key, LACE_CT_TCP_MAX);
LACE_CT_MAP(lace_ct_udp6, struct lace_ct6_key, LACE_CT_UDP_MAX);
LACE_CT_MAP(lace_ct_icmp6, struct lace_ct6_key, LACE_CT_ICMP_MAX);

/* endpoint-ct: conntrack flows per local endpoint and table, against its limit (abi/conntrack.h). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LACE_CT_ENDPOINT_MAX);
	__type(key, struct lace_ct_endpoint_key);
	__type(value, struct lace_ct_endpoint);
	LACE_PIN;
} lace_ep_ct SEC(".maps");

/* events: flow decisions for node trace flow. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, LACE_EVENTS_BYTES);
	LACE_PIN;
} lace_events SEC(".maps");

/* metrics: per-CPU packet and byte counters at LACE_METRICS_INDEX(reason, point, verdict). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LACE_METRICS_MAX);
	__type(key, __u32);
	__type(value, struct lace_metrics_value);
	LACE_PIN;
} lace_metrics SEC(".maps");

#endif
