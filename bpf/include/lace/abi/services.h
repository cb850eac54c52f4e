/* services: (source network, frontend address, port, protocol) -> service and its backends by slot;
 * backends: backend ID -> address; maglev: each service's consistent-hash lookup table;
 * affinity: (service, client) -> the backend ClientIP affinity pins it to;
 * revnat: (backend network, address, port, protocol) -> the frontends its replies may come from;
 * sock-revnat: (socket cookie, backend) -> the frontend a host socket asked for. */
#ifndef LACE_ABI_SERVICES_H
#define LACE_ABI_SERVICES_H

#define LACE_SERVICES_MAX 262144   /* slot 0 of every frontend plus one slot per backend */
#define LACE_BACKENDS_MAX 262144
#define LACE_AFFINITY_MAX 65536
#define LACE_SOCK_REVNAT_MAX 65536  /* host sockets translated at connect/sendmsg time */
#define LACE_REVNAT_MAX 262144      /* one per backend (network, address, port, protocol) */
#define LACE_REVNAT_FRONTENDS 8     /* frontends one backend answers for (lace_revnat) */

/* Maglev: every service with two or more active backends owns one table of LACE_MAGLEV_SIZE
 * backend IDs, stored at [table * SIZE, (table + 1) * SIZE) of the maglev array. Table 0 is never
 * used (0 = no table). The number of tables is the map's max_entries / SIZE (the loader may size
 * it); SIZE is a prime well above 100 x the backends of a service (Maglev's balance rule). */
#define LACE_MAGLEV_SIZE   1021
#define LACE_MAGLEV_TABLES 1024
#define LACE_MAGLEV_MAX    1045504   /* SIZE x TABLES */

#define LACE_SVC_F_NODEPORT     0x01  /* frontend is a node address (NodePort); source network OUTSIDE */
#define LACE_SVC_F_LOCAL        0x02  /* traffic policy Local: only this node's backends are programmed */
#define LACE_SVC_F_LOADBALANCER 0x04  /* frontend is a LoadBalancer ingress address */
#define LACE_SVC_F_AFFINITY     0x08  /* sessionAffinity ClientIP for affinity_timeout seconds */
#define LACE_SVC_F_EXTERNAL_IP  0x10  /* frontend is an externalIP */

#define LACE_BACKEND_F_ACTIVE      0x1
#define LACE_BACKEND_F_TERMINATING 0x2
/* More frontends send flows to this backend than its revnat entry names (LACE_REVNAT_FRONTENDS),
 * or the revnat map had no room for its entry: its new flows keep a backend entry for their
 * replies (LACE_CT_F2_BACKEND_ENTRY, abi/conntrack.h) instead of relying on the revnat map. */
#define LACE_BACKEND_F_REPLY_ENTRY 0x4

/* Hairpin: a pod whose service flow is balanced to itself receives it from a reserved source
 * instead of its own address (a kernel drops a packet from one of its own addresses arriving on
 * an interface), and its replies to that source are written back. The addresses are never a
 * pod's, a service's or a node's, and pods route them through their default gateway (no
 * neighbour resolution): IPv4 169.254.42.1 (link-local; pods hold /32s and a host route to their
 * gateway only) and IPv6 100::a9fe:2a01 (in the discard-only prefix 100::/64, RFC 6666; not
 * link-local, which pods would try to resolve on eth0). Backend conntrack entries of hairpin
 * flows carry them as the client address. */
#define LACE_HAIRPIN_IPV4      0xa9fe2a01u            /* 169.254.42.1, host order */
#define LACE_HAIRPIN_IPV6_HIGH 0x0100000000000000ull  /* 100::a9fe:2a01, first 8 bytes, big endian */
#define LACE_HAIRPIN_IPV6_LOW  0x00000000a9fe2a01ull  /* last 8 bytes, big endian */

/* Slot 0 is the frontend itself; slots 1..backend_count point at backends, the active ones first
 * (1..active_count take new flows; the rest are terminating: kept for their established flows and
 * shown by `node bpf show services --endpoints`). */
struct lace_service_key {
	__u32  network;     /* the source network this frontend serves */
	__u8   addr[16];
	__be16 port;
	__u8   proto;
	__u8   family;
	__u16  slot;
	__u16  reserved;
};

struct lace_service {
	__u32 service_id;       /* cluster-wide ID: reverse NAT and affinity key */
	__u32 backend_id;       /* slot > 0: the backend in this slot */
	__u16 backend_count;    /* slot 0: backend slots, active and terminating */
	__u16 active_count;     /* slot 0: slots 1..active_count take new flows */
	__u16 flags;            /* LACE_SVC_F_* */
	__u16 reserved;
	__u32 affinity_timeout; /* slot 0: seconds of ClientIP affinity */
	__u32 maglev;           /* slot 0: Maglev table number (0: none, one active backend or none) */
};

struct lace_backend_key {
	__u32 backend_id;
};

struct lace_backend {
	__u8   addr[16];
	__be16 port;
	__u8   proto;
	__u8   family;
	__u32  network;     /* the backend pod's network: routing continues in it */
	__u32  flags;       /* LACE_BACKEND_F_* */
};

struct lace_affinity_key {
	__u32 service_id;
	__u32 network;      /* the client's source network */
	__u8  addr[16];     /* the client's address */
	__u8  family;
	__u8  reserved[3];
};

struct lace_affinity {
	__u64 last_used_ns; /* CLOCK_MONOTONIC_COARSE, as conntrack */
	__u32 backend_id;
	__u32 reserved;
};

/* Reverse NAT of a service flow's replies. A service flow has one conntrack entry, keyed by its
 * frontend (client -> frontend:port under the client's source network, lib/service.h); a reply
 * comes from the backend, whose address says nothing of the frontend. The agent writes, for every
 * backend it programs, the frontends that may send flows to it — one per (source network,
 * frontend address, port): a ClusterIP in each network it is offered to, a node port, a
 * LoadBalancer or external IP — and keeps a backend's entry while conntrack may still hold a flow
 * to it (a deleted or terminating backend keeps its established flows). A reply looks its source
 * up here and tries the frontend entries (client -> each frontend) until one whose nat_addr:nat_port
 * is this backend: that is its flow. At most LACE_REVNAT_FRONTENDS frontends per backend: a backend
 * with more (or none, when the map is full) is flagged LACE_BACKEND_F_REPLY_ENTRY, and its new
 * flows keep a backend entry that their replies find directly — a second conntrack entry for those
 * flows only, so that any number of frontends may share a backend. */
struct lace_revnat_key {
	__u32  network;     /* the backend's network */
	__u8   addr[16];
	__be16 port;
	__u8   proto;
	__u8   family;
};

struct lace_revnat_frontend {
	__u8   addr[16];    /* 8-byte aligned in lace_revnat */
	__u32  network;     /* the source network its flows are keyed under (OUTSIDE: node port, LB) */
	__be16 port;
	__u16  reserved;
};

struct lace_revnat {
	__u32 count;        /* frontends[0..count) are used */
	__u32 reserved;
	struct lace_revnat_frontend frontends[LACE_REVNAT_FRONTENDS];
};

/* Socket-level translation (cgroup socket hooks): a host socket's connect or sendmsg to a frontend
 * is rewritten to a backend, and this entry lets getpeername and recvmsg show the frontend again.
 * Addresses are as the socket sees them: an IPv4 frontend reached through an IPv4-mapped IPv6
 * address is stored as IPv4. */
struct lace_sock_revnat_key {
	__u64  cookie;      /* the socket's cookie (SO_COOKIE) */
	__u8   addr[16];    /* the backend the socket was sent to */
	__be16 port;
	__u8   family;
	__u8   reserved[5];
};

struct lace_sock_revnat {
	__u8   addr[16];    /* the frontend the socket asked for */
	__be16 port;
	__u8   family;
	__u8   reserved;
	__u32  service_id;
};

/* lace-sk-term (progs/sock_term.c): a host UDP socket to terminate, by cookie: the backend it must
 * still be connected to. */
struct lace_sock_term {
	__u8   addr[16];
	__be16 port;
	__u8   family;
	__u8   reserved[5];
};

#endif
