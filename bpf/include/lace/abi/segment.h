/* segment and prefix-segment: endpoint address or prefix (in a network) -> segment. */
#ifndef LACE_ABI_SEGMENT_H
#define LACE_ABI_SEGMENT_H

#define LACE_SEGMENT_MAX        65536
#define LACE_PREFIX_SEGMENT_MAX 16384
#define LACE_PREFIX_SEGMENT_PREFIX_BASE 64

#define LACE_SEG_F_LOCAL 0x1  /* the endpoint lives on this node */

/* Hash key: an endpoint address in its network. */
struct lace_segment_key {
	__u32 network;
	__u8  family;
	__u8  reserved[3];
	__u8  addr[16];
};

/* LPM trie key: a prefix in a network (ipBlocks, world, node addresses). */
struct lace_prefix_segment_key {
	__u32 prefixlen;
	__u32 network;
	__u8  family;
	__u8  reserved[3];
	__u8  addr[16];
};

struct lace_segment_value {
	__u32 segment;
	__u32 flags;        /* LACE_SEG_F_* */
};

#endif
