/* Flow events into the ring buffer and per-CPU counters by (reason, point, verdict). */
#ifndef LACE_LIB_TRACE_H
#define LACE_LIB_TRACE_H

#include "lib/maps.h"
#include "lib/flow.h"

/* Types only used through casts or as plain integers get no BTF of their own; these anchors put
 * them in every object so that tests/schema can check the Python mirrors against them. */
const enum lace_drop_reason lace_btf_drop_reason __attribute__((unused));
const enum lace_trace_point lace_btf_trace_point __attribute__((unused));
const struct lace_trace_event *lace_btf_trace_event __attribute__((unused));

static __always_inline void metrics_count(__u16 reason, __u8 point, __u8 verdict, __u32 len)
{
	__u32 idx = LACE_METRICS_INDEX(reason, point, verdict);
	struct lace_metrics_value *v = bpf_map_lookup_elem(&lace_metrics, &idx);

	if (v) {
		v->packets++;
		v->bytes += len;
	}
}

static __always_inline void trace_emit(struct __sk_buff *skb, const struct lace_flow *f,
				       __u8 verdict, __u16 reason)
{
	struct lace_trace_event *e = bpf_ringbuf_reserve(&lace_events, sizeof(*e), 0);

	if (!e) {
		/* the ring buffer is full (its reader is behind): count the lost event at index 0
		 * (verdict 0, which no packet has), which the agent's flow collector reports */
		metrics_count(0, 0, 0, skb->len);
		return;
	}
	e->ts_ns = bpf_ktime_get_ns();
	e->ifindex = skb->ifindex;
	e->pkt_len = skb->len;
	e->point = f->point;
	e->verdict = verdict;
	e->reason = reason;
	e->family = f->family;
	e->proto = f->proto;
	e->ct_status = f->ct_status;
	e->delivery = f->delivery;
	e->src_network = f->src_network;
	e->dst_network = f->dst_network;
	e->src_segment = f->src_segment;
	e->dst_segment = f->dst_segment;
	lace_copy16(e->saddr, f->saddr);
	lace_copy16(e->daddr, f->daddr);
	e->sport = f->sport;
	e->dport = f->dport;
	e->policy_id = f->policy_id;
	lace_copy16(e->nat_addr, f->nat_addr);
	e->nat_port = f->nat_port;
	e->nat_kind = f->nat_kind;
	e->tcp_flags = f->tcp_flags;
	e->delivery_ifindex = f->delivery_ifindex;
	lace_copy16(e->sid, f->sid);
	e->node_id = f->node_id;
	e->rule = f->rule;
	e->reserved = 0;
	/* flags 0: the kernel wakes the reader only when it had drained everything (it is asleep);
	 * a reader that is behind gets no wakeup per event */
	bpf_ringbuf_submit(e, 0);
}

#endif
