/* The one way to drop a packet: count it by reason, emit a trace event, return TC_ACT_SHOT. */
#ifndef LACE_LIB_DROP_H
#define LACE_LIB_DROP_H

#include "lib/trace.h"

static __always_inline int lace_drop(struct __sk_buff *skb, const struct lace_flow *f, __u16 reason)
{
	metrics_count(reason, f->point, LACE_VERDICT_DROP, skb->len);
	trace_emit(skb, f, LACE_VERDICT_DROP, reason);
	return TC_ACT_SHOT;
}

/* A forwarded packet: counted always; traced when it opened a flow, passed by audit, or when
 * the node asks for every packet. */
static __always_inline void lace_forwarded(struct __sk_buff *skb, const struct lace_flow *f,
					   int trace_all)
{
	__u8 verdict = f->audit ? LACE_VERDICT_AUDIT : LACE_VERDICT_FORWARD;

	metrics_count(LACE_DROP_NONE, f->point, verdict, skb->len);
	if (trace_all || f->audit || f->ct_status == LACE_CT_STATUS_NEW)
		trace_emit(skb, f, verdict, f->audit);
}

#endif
