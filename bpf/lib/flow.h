/* struct lace_flow: what one packet's walk has learned so far; the trace event is built from it.
 * 8-byte aligned with the addresses at multiples of 8: copies and comparisons of them compile to
 * 8-byte loads instead of byte by byte (which also spill to the stack). */
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
	__u16  l4_off;        /* offset of the transport header from the start of the frame */
	__be16 nat_port;      /* nat_*: see lib/service.h for which side of a translation they hold */
	__u8   nat_kind;      /* enum lace_nat_kind */
	__u8   svc_flags;     /* a new service flow: LACE_SVC_FLOW_* */
	__u16  reserved;
	__u32  service_id;    /* a new service flow: its service and chosen backend */
	__u32  backend_id;
	__u32  ct_network;    /* the network the packet's conntrack entry is keyed under */
	__u32  reserved2;
	__u64  now_ns;        /* the walk's coarse clock reading (ct_now), 0 before the walk takes it */
	__u8   nat_addr[16];
	__u8   saddr[16];
	__u8   daddr[16];
	__u8   sid[16];
	__u8   inner_saddr[16];
	__u8   inner_daddr[16];
} __attribute__((aligned(8)));

/* Each packet's struct lace_flow lives in this per-CPU array of one entry, not on the stack: at
 * ~170 bytes it would leave too little of the verifier's 512 bytes (counted over a whole chain of
 * BPF-to-BPF calls) for the rest of the walk. A tc program runs to completion on its CPU before
 * the next packet there starts over with the entry. Every object has its own (not pinned: it holds
 * nothing from one packet to the next). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lace_flow);
} lace_scratch SEC(".maps");

/* A cleared flow for a packet observed at point; NULL never happens (index 0 of a one-entry
 * array always exists) but the verifier needs the check. */
static __always_inline struct lace_flow *flow_start(__u8 point)
{
	__u32 zero = 0;
	struct lace_flow *f = bpf_map_lookup_elem(&lace_scratch, &zero);

	if (f) {
		__builtin_memset(f, 0, sizeof(*f));
		f->point = point;
	}
	return f;
}

#endif
