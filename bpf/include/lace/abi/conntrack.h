/* ct-{tcp,udp,icmp}-{v4,v6}: connection tracking, one table per protocol and family. */
#ifndef LACE_ABI_CONNTRACK_H
#define LACE_ABI_CONNTRACK_H

#define LACE_CT_TCP_MAX  262144
#define LACE_CT_UDP_MAX  131072
#define LACE_CT_ICMP_MAX 32768

/* Timeouts in seconds by state. */
#define LACE_CT_TIMEOUT_SYN         60
#define LACE_CT_TIMEOUT_ESTABLISHED 21600
#define LACE_CT_TIMEOUT_FIN         120
#define LACE_CT_TIMEOUT_CLOSE       10
#define LACE_CT_TIMEOUT_UDP         30
#define LACE_CT_TIMEOUT_UDP_REPLIED 180
#define LACE_CT_TIMEOUT_ICMP        30

enum lace_ct_state {
	LACE_CT_NONE        = 0,
	LACE_CT_SYN_SENT    = 1,
	LACE_CT_SYN_RECV    = 2,
	LACE_CT_ESTABLISHED = 3,
	LACE_CT_FIN_WAIT    = 4,   /* one side sent FIN */
	LACE_CT_CLOSING     = 5,   /* both sides sent FIN */
	LACE_CT_CLOSED      = 6,   /* RST seen */
	LACE_CT_UNREPLIED   = 7,   /* UDP / ICMP: no reply yet */
	LACE_CT_REPLIED     = 8,   /* UDP / ICMP: seen both ways */
};

/* How a packet related to conntrack, reported in trace events. */
enum lace_ct_status {
	LACE_CT_STATUS_NONE        = 0,
	LACE_CT_STATUS_NEW         = 1,
	LACE_CT_STATUS_ESTABLISHED = 2,
	LACE_CT_STATUS_REPLY       = 3,
	LACE_CT_STATUS_RELATED     = 4,
};

#define LACE_CT_F_SEEN_REPLY 0x01
/* A service flow has one entry, the frontend entry (SERVICE), keyed client -> VIP:port: it holds
 * the chosen backend in nat_addr/nat_port, sends established packets there and, found through the
 * revnat map (abi/services.h), writes the frontend back as the source of replies; rev_nat_id is
 * the service ID. A kubelet probe (lib/probe.h) also has a backend entry (DNAT), keyed client ->
 * backend, holding the frontend in nat_addr/nat_port for its replies. */
#define LACE_CT_F_DNAT       0x02  /* a probe's backend entry: replies get nat_addr:nat_port as source */
/* A masqueraded flow has two entries. The pod's entry (SNAT), keyed by the pod's own tuple,
 * holds the node address and port it leaves with. The port reservation (MASQ), keyed in network
 * OUTSIDE by node address:port -> remote, holds the pod's address and port; dst_network is the
 * pod's network. Replies find the reservation and are written back to the pod. */
#define LACE_CT_F_SNAT       0x04  /* pod entry: the source leaves as nat_addr:nat_port */
#define LACE_CT_F_AUDIT      0x08  /* admitted by audit mode */
#define LACE_CT_F_PROBE      0x10  /* a kubelet probe connection */
#define LACE_CT_F_SERVICE    0x20  /* a service flow's entry: packets go to nat_addr:nat_port */
#define LACE_CT_F_MASQ       0x40  /* masquerade port reservation (see above) */
/* A NodePort or LoadBalancer flow is keyed in network OUTSIDE. The node whose frontend translated
 * it holds the flow's service entry (SERVICE). When the backend is on another node, that node
 * holds an entry keyed under OUTSIDE with no NAT flag whose nat_addr is the translating node's
 * origin SID (its locator, function OUTSIDE): the backend's replies are sent back there. */
/* A flow delivered into another network than its source network (a service a network imports, a
 * route between networks) has its entry keyed under the source network, where the reply's sender
 * is not: the node that delivers it locally adds a reply alias, keyed by the same tuple under the
 * destination network, whose dst_network names the network the flow's entry is keyed under. A
 * reply found through the alias continues with that entry, into that network: no route back is
 * needed. The alias holds nothing else; its expiry is renewed whenever a reply uses it. */
#define LACE_CT_F_ALIAS      0x80  /* reply alias of a flow between networks (see above) */
/* lace_ct_entry.flags2. A service flow to a backend its revnat entry cannot name every frontend of
 * (LACE_BACKEND_F_REPLY_ENTRY, abi/services.h) keeps a backend entry as a probe does: DNAT, keyed
 * client -> backend, holding the frontend, with its reply alias; its replies find it by their own
 * reversed tuple. Its frontend entry is flagged so that established packets advance the backend
 * entry too (it sees the replies, its state follows both directions). */
#define LACE_CT_F2_BACKEND_ENTRY 0x01  /* a frontend entry whose flow keeps a backend entry */
/* A service flow to a backend in network OUTSIDE (no pod: the apiserver behind default/kubernetes)
 * is translated to the backend and masqueraded out of the node (lib/masquerade.h): its frontend
 * entry (SERVICE, nat = backend:port, dst_network OUTSIDE) comes with the two entries of a
 * masqueraded flow from the client to the backend, the pod entry (SNAT, keyed client -> backend,
 * nat = node address:port) and the port reservation (MASQ), all three flagged. A reply finds the
 * reservation, then the frontend entry through the backend's revnat entry under OUTSIDE. */
#define LACE_CT_F2_MASQ          0x02  /* an entry of a service flow masqueraded to a backend outside */

/* Keys carry the source network of the original direction; ICMP echo uses the identifier as both
 * ports so that the reply's reversed tuple finds the same entry. */
struct lace_ct4_key {
	__u32  network;
	__u8   saddr[4];
	__u8   daddr[4];
	__be16 sport;
	__be16 dport;
	__u8   proto;
	__u8   reserved[3];
};

struct lace_ct6_key {
	__u32  network;
	__u8   saddr[16];
	__u8   daddr[16];
	__be16 sport;
	__be16 dport;
	__u8   proto;
	__u8   reserved[3];
};

/* Times are CLOCK_MONOTONIC_COARSE nanoseconds (bpf_ktime_get_coarse_ns, read once per tick:
 * lib/clock.h). */
struct lace_ct_entry {
	__u64  created_ns;
	__u64  last_seen_ns;
	__u64  expires_ns;
	__u64  packets_fwd;
	__u64  bytes_fwd;
	__u64  packets_rev;
	__u64  bytes_rev;
	__u32  src_segment;
	__u32  dst_segment;
	__u32  dst_network;
	__u32  rev_nat_id;      /* service ID of a SERVICE or DNAT entry (0: none) */
	__u8   nat_addr[16];    /* the other side of the translation: see LACE_CT_F_* */
	__be16 nat_port;
	__u8   state;           /* enum lace_ct_state */
	__u8   flags;           /* LACE_CT_F_* */
	__u8   tcp_flags_fwd;   /* union of TCP flags seen in the original direction */
	__u8   tcp_flags_rev;
	__u8   delivery;        /* enum lace_delivery_kind of the original direction */
	__u8   flags2;          /* LACE_CT_F2_* */
};

/* endpoint-ct: how many conntrack flows each local endpoint opened, per table, against the limit
 * in its veth entry (lace_endpoint.ct_max). The tables are LRU hashes: full means the least
 * recently used entry is evicted, so without a limit one pod's flood of new flows pushes other
 * pods' idle established flows out. The datapath adds one when a new flow whose entries it stored
 * is on its way (one per flow: a service flow's two entries, a masqueraded flow's two, count once;
 * a flow refused or dropped at its hop writes nothing); nothing in the datapath subtracts, so flows
 * that expire or are evicted still count until the agent's conntrack GC pass recounts the tables
 * and writes the true counts (lace/agent/conntrack.py). */
#define LACE_CT_ENDPOINT_MAX 4096   /* = LACE_VETH_MAX: one entry per local endpoint */
/* The limit a local endpoint gets when neither its Network nor the agent says otherwise: 1/32 of
 * the TCP tables, 1/16 of the UDP tables, 1/4 of the ICMP tables. */
#define LACE_CT_ENDPOINT_DEFAULT 8192

struct lace_ct_endpoint_key {
	__u32 ifindex;      /* host side of the pod's veth (as the veth map) */
};

/* Flows the endpoint holds in each conntrack table (SCTP shares the UDP tables). */
struct lace_ct_endpoint {
	__u32 tcp4;
	__u32 udp4;
	__u32 icmp4;
	__u32 tcp6;
	__u32 udp6;
	__u32 icmp6;
};

#endif
