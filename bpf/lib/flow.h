/* struct lace_flow: what one packet's walk has learned so far; the trace event is built from it. */
#ifndef LACE_LIB_FLOW_H
#define LACE_LIB_FLOW_H

#include "lib/common.h"

struct lace_flow {
	__u8   family;        /* LACE_FAMILY_* */
	__u8   proto;         /* transport protocol */
	__u8   tcp_flags;
	__u8   icmp_type;
	__u8   ct_status;     /* enum lace_ct_status */
	__u8   delivery;      /* enum lace_delivery_kind */
	__u8   point;         /* enum lace_trace_point */
	__u8   icmp_error;    /* an ICMP error: inner_* hold the embedded packet's tuple */
	__be16 sport;
	__be16 dport;
	__u32  l3_len;        /* bytes from the IP header on */
	__u32  src_network;
	__u32  dst_network;
	__u32  src_segment;
	__u32  dst_segment;
	__u32  policy_id;
	__u16  rule;
	__u8   inner_proto;
	__u8   audit;         /* audit mode passed a would-be drop: its reason (0: none) */
	__u32  delivery_ifindex;
	__u32  node_id;
	__be16 inner_sport;
	__be16 inner_dport;
	__u8   saddr[16];
	__u8   daddr[16];
	__u8   sid[16];
	__u8   inner_saddr[16];
	__u8   inner_daddr[16];
};

#endif
