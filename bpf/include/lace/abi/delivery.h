/* delivery: (network, destination prefix) -> local pod, remote node SID, or host; delivery-exact:
 * the same map's full-length entries again, in a hash the datapath probes first. */
#ifndef LACE_ABI_DELIVERY_H
#define LACE_ABI_DELIVERY_H

#define LACE_DELIVERY_MAX 65536
#define LACE_DELIVERY_PREFIX_BASE 64
/* = LACE_DELIVERY_MAX. The exact map holds a subset of the trie's entries, so at the trie's size an
 * entry the trie accepted is never refused by the hash: a full hash would fail the agent's whole
 * reconcile pass, not just slow one destination down. Sizing it by local endpoints (two addresses
 * per LACE_VETH_MAX pod) would save ~7 MiB of preallocated elements but not bound what the agent
 * may write at full length (host addresses, a remote node's /32 or /128 block). */
#define LACE_DELIVERY_EXACT_MAX 65536

_Static_assert(LACE_DELIVERY_EXACT_MAX == LACE_DELIVERY_MAX, "delivery-exact holds a subset of delivery");

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

/* Exact-match key: the trie key past its prefixlen, which a full-length entry does not need (the
 * family fixes it). Being the trie key's tail, one key built on the stack serves both lookups (the
 * hash is handed &key.network), and the agent derives an exact key from a trie key by dropping its
 * first four bytes. 24 bytes rather than 28 also spare the hash one jhash2 round (~4 ns a lookup
 * measured on a 2-core VM). reserved must be zero, as in any hash key. */
struct lace_delivery_exact_key {
	__u32 network;
	__u8  family;
	__u8  reserved[3];
	__u8  addr[16];
};

_Static_assert(__builtin_offsetof(struct lace_delivery_key, network) == 4 &&
	       sizeof(struct lace_delivery_key) == 4 + sizeof(struct lace_delivery_exact_key),
	       "the exact key is the trie key past its prefixlen");

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
