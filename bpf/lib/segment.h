/* Segment resolution: an address in a network -> its segment (endpoint first, then prefix). */
#ifndef LACE_LIB_SEGMENT_H
#define LACE_LIB_SEGMENT_H

#include "lib/maps.h"

static __always_inline __u32 segment_resolve(__u32 network, __u8 family, const __u8 *addr)
{
	struct lace_segment_key k = { .network = network, .family = family };
	struct lace_segment_value *v;

	lace_copy16(k.addr, addr);
	v = bpf_map_lookup_elem(&lace_segment, &k);
	if (v)
		return v->segment;

	struct lace_prefix_segment_key pk = {
		.prefixlen = LACE_PREFIX_SEGMENT_PREFIX_BASE + (family == LACE_FAMILY_IPV4 ? 32 : 128),
		.network = network,
		.family = family,
	};
	lace_copy16(pk.addr, addr);
	v = bpf_map_lookup_elem(&lace_pfx_seg, &pk);
	if (v)
		return v->segment;
	return network == LACE_NETWORK_OUTSIDE ? LACE_SEGMENT_WORLD : LACE_SEGMENT_UNKNOWN;
}

/* Whether addr (IPv6) is another node's on the underlay: its underlay address, or its origin SID
 * (lib/nodeport.h). The agent writes both as segment REMOTE_NODE in network OUTSIDE, where the
 * outer source of a packet arriving on the uplink lives. */
static __always_inline int underlay_peer(const __u8 *addr)
{
	struct lace_segment_key k = { .network = LACE_NETWORK_OUTSIDE, .family = LACE_FAMILY_IPV6 };
	struct lace_segment_value *v;

	lace_copy16(k.addr, addr);
	v = bpf_map_lookup_elem(&lace_segment, &k);
	return v && v->segment == LACE_SEGMENT_REMOTE_NODE;
}

#endif
