/* delivery: (network, destination prefix) -> local pod, remote node SID, or host. */
#ifndef LACE_ABI_DELIVERY_H
#define LACE_ABI_DELIVERY_H

#define LACE_DELIVERY_MAX 65536
#define LACE_DELIVERY_PREFIX_BASE 64

enum lace_delivery_kind {
	LACE_DELIVERY_NONE    = 0,
	LACE_DELIVERY_LOCAL   = 1, /* redirect into a pod veth on this node */
	LACE_DELIVERY_REMOTE  = 2, /* encapsulate to another node's locator SID */
	LACE_DELIVERY_HOST    = 3, /* hand to this node's stack */
	LACE_DELIVERY_OUTSIDE = 4, /* leave the cluster (routing to LACE_NETWORK_OUTSIDE) */
};

/* LPM trie key, same shape as the routing key. */
struct lace_delivery_key {
	__u32 prefixlen;
	__u32 network;
	__u8  family;
	__u8  reserved[3];
	__u8  addr[16];
};

struct lace_delivery {
	__u8  kind;         /* enum lace_delivery_kind */
	__u8  flags;
	__u16 reserved;
	__u32 ifindex;      /* local: host side of the pod veth */
	__u8  mac[6];       /* local: the pod's MAC */
	__u8  host_mac[6];  /* local: host-side veth MAC, the pod's gateway */
	__u32 node_id;      /* remote: the owning node */
	__u8  sid[16];      /* remote: locator + function (this network); the argument is filled per packet */
	__u32 endpoint_id;  /* local: the endpoint */
};

#endif
