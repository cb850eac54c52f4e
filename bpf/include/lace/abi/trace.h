/* Flow events (ring buffer) and per-CPU packet counters by reason. */
#ifndef LACE_ABI_TRACE_H
#define LACE_ABI_TRACE_H

#define LACE_EVENTS_BYTES  (4 * 1024 * 1024)
/* metrics is a per-CPU array indexed by (verdict, point, reason): an inlined lookup per packet */
#define LACE_METRICS_REASON_BITS 8
#define LACE_METRICS_POINT_BITS  3
#define LACE_METRICS_MAX   8192   /* 4 verdicts << (reason + point bits) */
#define LACE_METRICS_INDEX(reason, point, verdict)                                   \
	((((__u32)(verdict) & 3) << (LACE_METRICS_REASON_BITS + LACE_METRICS_POINT_BITS)) | \
	 (((__u32)(point) & 7) << LACE_METRICS_REASON_BITS) | ((__u32)(reason) & 0xff))

enum lace_nat_kind {
	LACE_NAT_NONE = 0,
	LACE_NAT_DNAT = 1,
	LACE_NAT_SNAT = 2,
};

struct lace_trace_event {
	__u64  ts_ns;           /* CLOCK_MONOTONIC */
	__u32  ifindex;         /* where it was observed */
	__u32  pkt_len;
	__u8   point;           /* enum lace_trace_point */
	__u8   verdict;         /* enum lace_verdict */
	__u16  reason;          /* enum lace_drop_reason (NONE when forwarded) */
	__u8   family;
	__u8   proto;
	__u8   ct_status;       /* enum lace_ct_status */
	__u8   delivery;        /* enum lace_delivery_kind */
	__u32  src_network;
	__u32  dst_network;
	__u32  src_segment;
	__u32  dst_segment;
	__u8   saddr[16];
	__u8   daddr[16];
	__be16 sport;
	__be16 dport;
	__u32  policy_id;       /* policy whose rule allowed it (0: none or not evaluated) */
	/* DNAT (a service flow), in both directions: saddr..dport are the backend side of the flow
	 * (forward: client -> backend, reply: backend -> client) and nat_addr:nat_port is the
	 * frontend (VIP:port) it stands for */
	__u8   nat_addr[16];
	__be16 nat_port;
	__u8   nat_kind;        /* enum lace_nat_kind */
	__u8   tcp_flags;
	__u32  delivery_ifindex;/* local delivery: the pod veth */
	__u8   sid[16];         /* remote delivery: outer destination */
	__u32  node_id;         /* remote delivery: the node */
	__u16  rule;            /* rule index inside policy_id */
	__u16  reserved;
};

struct lace_metrics_value {
	__u64 packets;
	__u64 bytes;
};

#endif
