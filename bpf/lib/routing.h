/* Routing: which network a destination is routed into from the source network. */
#ifndef LACE_LIB_ROUTING_H
#define LACE_LIB_ROUTING_H

#include "lib/maps.h"
#include "lib/flow.h"

static __always_inline struct lace_route *route_lookup(__u32 src_network, __u8 family,
						       const __u8 *daddr)
{
	struct lace_routing_key k = {
		.prefixlen = LACE_ROUTING_PREFIX_BASE + (family == LACE_FAMILY_IPV4 ? 32 : 128),
		.src_network = src_network,
		.family = family,
	};

	lace_copy16(k.addr, daddr);
	return bpf_map_lookup_elem(&lace_routing, &k);
}

#endif
