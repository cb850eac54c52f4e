/* routing: (source network, destination prefix) -> destination network, masquerade. */
#ifndef LACE_ABI_ROUTING_H
#define LACE_ABI_ROUTING_H

#define LACE_ROUTING_MAX 16384
/* prefixlen counts the bits after it: src_network + family + reserved, then the address. */
#define LACE_ROUTING_PREFIX_BASE 64

#define LACE_ROUTE_F_MASQUERADE 0x1
/* A service frontend's address that the full services map left out (the agent writes a host route
 * for it): a packet that found no frontend there is dropped as MAP_FULL, not routed on. */
#define LACE_ROUTE_F_SERVICE_MAP_FULL 0x2

/* LPM trie key. IPv4 addresses occupy addr[0..3]. */
struct lace_routing_key {
	__u32 prefixlen;
	__u32 src_network;
	__u8  family;       /* LACE_FAMILY_* */
	__u8  reserved[3];
	__u8  addr[16];
};

struct lace_route {
	__u32 dst_network;  /* LACE_NETWORK_OUTSIDE: leave the cluster through the node */
	__u32 flags;        /* LACE_ROUTE_F_* */
};

#endif
