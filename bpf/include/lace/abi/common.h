/* Shared constants of the lace ABI: families, reserved networks and segments, verdicts. */
#ifndef LACE_ABI_COMMON_H
#define LACE_ABI_COMMON_H

/* Address family as stored in keys (not AF_*: one byte, self-describing). */
#define LACE_FAMILY_IPV4 4
#define LACE_FAMILY_IPV6 6

/* Networks. 0 never names a network; 1 is the default network every cluster has. */
#define LACE_NETWORK_NONE    0u
#define LACE_NETWORK_DEFAULT 1u
/* A routing entry whose destination is outside the cluster (handed to the node's stack). */
#define LACE_NETWORK_OUTSIDE 0xffffffffu

/* Segments (security identities). Below LACE_SEGMENT_FIRST_ALLOCATED they are reserved. */
#define LACE_SEGMENT_ANY             0u   /* policy keys only: any peer segment */
#define LACE_SEGMENT_HOST            1u   /* the node's own host namespace */
#define LACE_SEGMENT_WORLD           2u   /* addresses outside the cluster */
#define LACE_SEGMENT_REMOTE_NODE     3u   /* another node's host or underlay address */
#define LACE_SEGMENT_UNKNOWN         4u   /* a cluster address no endpoint or prefix claims */
#define LACE_SEGMENT_FIRST_ALLOCATED 256u
/* policy keys only: the marker entry saying a segment is selected in a direction */
#define LACE_SEGMENT_SELECTED        0xffffffffu

/* Final decision recorded in trace events and metrics. */
enum lace_verdict {
	LACE_VERDICT_FORWARD = 1,
	LACE_VERDICT_DROP    = 2,
	LACE_VERDICT_AUDIT   = 3,  /* policy would drop; audit mode let it pass */
};

/* Direction of a policy entry, seen from its subject segment. */
enum lace_direction {
	LACE_DIR_INGRESS = 0,
	LACE_DIR_EGRESS  = 1,
};

#endif
