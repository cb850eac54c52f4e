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
#define LACE_CT_F_DNAT       0x02  /* destination translated (service) */
#define LACE_CT_F_SNAT       0x04  /* source translated (masquerade) */
#define LACE_CT_F_AUDIT      0x08  /* admitted by audit mode */
#define LACE_CT_F_PROBE      0x10  /* a kubelet probe connection */

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

/* Times are CLOCK_MONOTONIC_COARSE nanoseconds (bpf_ktime_get_coarse_ns). */
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
	__u32  rev_nat_id;      /* service whose VIP replies are translated back to (0: none) */
	__u8   nat_addr[16];    /* original VIP (DNAT) or masquerade address (SNAT) */
	__be16 nat_port;
	__u8   state;           /* enum lace_ct_state */
	__u8   flags;           /* LACE_CT_F_* */
	__u8   tcp_flags_fwd;   /* union of TCP flags seen in the original direction */
	__u8   tcp_flags_rev;
	__u8   delivery;        /* enum lace_delivery_kind of the original direction */
	__u8   reserved;
};

#endif
