/* Policy between segments with Kubernetes semantics: a direction is enforced only for a segment
 * that a policy selects in that direction (its marker entry); then some allow entry must match
 * the peer (or any peer), the protocol and the destination port. */
#ifndef LACE_LIB_POLICY_H
#define LACE_LIB_POLICY_H

#include "lib/maps.h"
#include "lib/flow.h"

enum lace_policy_verdict {
	LACE_POLICY_ALLOW  = 0,
	LACE_POLICY_DENY   = 1,
	LACE_POLICY_AUDIT  = 2,  /* denied, but the subject is in audit mode */
};

static __always_inline struct lace_policy_entry *
policy_match(__u32 subject, __u32 peer, __u8 dir, __u8 proto, __be16 dport)
{
	struct lace_policy_key k = {
		.prefixlen = LACE_POLICY_PREFIX_FULL,
		.segment = subject,
		.peer = peer,
		.direction = dir,
		.proto = proto,
		.dport = dport,
	};

	return bpf_map_lookup_elem(&lace_policy, &k);
}

/* Decide one direction; on allow by a rule, record which rule in the flow and count the hit. */
static __always_inline int policy_check(struct lace_flow *f, __u32 subject, __u32 peer, __u8 dir)
{
	struct lace_policy_entry *marker, *e;
	__be16 dport = f->dport;

	marker = policy_match(subject, LACE_SEGMENT_SELECTED, dir, 0, 0);
	if (!marker)
		return LACE_POLICY_ALLOW;       /* not selected in this direction: default allow */

	if (f->proto == IPPROTO_ICMP || f->proto == IPPROTO_ICMPV6)
		dport = 0;
	e = policy_match(subject, peer, dir, f->proto, dport);
	if (!e)
		e = policy_match(subject, LACE_SEGMENT_ANY, dir, f->proto, dport);
	if (e && !(e->flags & LACE_POLICY_F_SELECTED)) {
		__sync_fetch_and_add(&e->hits, 1);
		f->policy_id = e->policy_id;
		f->rule = e->rule;
		return LACE_POLICY_ALLOW;
	}
	f->policy_id = marker->policy_id;
	f->rule = 0xffff;
	return (marker->flags & LACE_POLICY_F_AUDIT) ? LACE_POLICY_AUDIT : LACE_POLICY_DENY;
}

/* The ingress check of a new flow's local destination pod against peer: 0 when allowed or
 * audited (f->audit then names the would-be drop, unless an earlier check already did), else
 * POLICY_INGRESS. */
static __always_inline int policy_ingress(struct lace_flow *f, __u32 peer)
{
	int pv = policy_check(f, f->dst_segment, peer, LACE_DIR_INGRESS);

	if (pv == LACE_POLICY_DENY)
		return LACE_DROP_POLICY_INGRESS;
	if (pv == LACE_POLICY_AUDIT && !f->audit)
		f->audit = LACE_DROP_POLICY_INGRESS;
	return 0;
}

#endif
