/* Policy between segments with Kubernetes semantics: a direction is enforced only for a segment
 * that a policy selects in that direction (its marker entry); then some allow entry must match
 * the peer (or any peer), the protocol and the destination port.
 *
 * The entries live in two maps (abi/policy.h): a hash holds the markers and every entry an exact
 * key finds (exact port, whole protocol, any protocol), the LPM trie only the port blocks of port
 * ranges. A check probes the hash from the longest prefix down, the trie where a block ranks
 * (between the exact port and the whole protocol), the peer's entries before any peer's, and only
 * for the kinds of entries the segment's marker names: the first entry found is the one a single
 * trie of every entry returned (same verdict, same rule credited, same hit counted). What a check
 * costs then depends on the kinds of entries its segment has, not on how many entries the maps
 * hold: a trie walk deepens with every entry (bench/policy.py: about +23 % on a new flow and +35 %
 * on a policy drop from 16 to 16k entries when one trie held them all), a hash probe does not. */
#ifndef LACE_LIB_POLICY_H
#define LACE_LIB_POLICY_H

#include "lib/maps.h"
#include "lib/flow.h"

enum lace_policy_verdict {
	LACE_POLICY_ALLOW  = 0,
	LACE_POLICY_DENY   = 1,
	LACE_POLICY_AUDIT  = 2,  /* denied, but the subject is in audit mode */
};

/* The allow entry for (subject, peer, dir, proto, dport) that the longest prefix matches, probing
 * only the kinds of entries has (LACE_POLICY_F_PORTS .. _BLOCKS of the marker, for peer or, shifted
 * down, for any peer) says the subject has. */
static __always_inline struct lace_policy_entry *
policy_match(__u16 has, __u32 subject, __u32 peer, __u8 dir, __u8 proto, __be16 dport)
{
	struct lace_policy_key k = {
		.prefixlen = LACE_POLICY_PREFIX_FULL,
		.segment = subject,
		.peer = peer,
		.direction = dir,
		.proto = proto,
		.dport = dport,
	};
	struct lace_policy_entry *e;

	if (has & LACE_POLICY_F_PORTS) {
		e = bpf_map_lookup_elem(&lace_pol_exact, &k);
		if (e)
			return e;
	}
	if (has & LACE_POLICY_F_BLOCKS) {
		/* a full-length key: the trie answers with its longest block holding dport */
		e = bpf_map_lookup_elem(&lace_policy, &k);
		if (e)
			return e;
	}
	/* shorter entries are stored with the bits past their prefix zero, as they are probed */
	k.dport = 0;
	if (has & LACE_POLICY_F_PROTOS) {
		k.prefixlen = LACE_POLICY_PREFIX_PROTO;
		e = bpf_map_lookup_elem(&lace_pol_exact, &k);
		if (e)
			return e;
	}
	if (has & LACE_POLICY_F_ANY_PROTO) {
		k.prefixlen = LACE_POLICY_PREFIX_ANY_PROTO;
		k.proto = 0;
		return bpf_map_lookup_elem(&lace_pol_exact, &k);
	}
	return 0;
}

/* Decide one direction; on allow by a rule, record which rule in the flow and count the hit.
 * A global function: the verifier checks it once, on its own, instead of in every path of every
 * program that reaches a policy check. f is never NULL (the verifier needs the test). */
__attribute__((noinline)) int policy_check(struct lace_flow *f, __u32 subject, __u32 peer, __u8 dir)
{
	struct lace_policy_key mk = {
		.prefixlen = LACE_POLICY_PREFIX_ANY_PROTO,
		.segment = subject,
		.peer = LACE_SEGMENT_SELECTED,
		.direction = dir,
	};
	struct lace_policy_entry *marker, *e = 0;
	__be16 dport;
	__u16 has;

	if (!f)
		return LACE_POLICY_DENY;
	marker = bpf_map_lookup_elem(&lace_pol_exact, &mk);
	if (!marker)
		return LACE_POLICY_ALLOW;       /* not selected in this direction: default allow */

	dport = f->dport;
	if (f->proto == IPPROTO_ICMP || f->proto == IPPROTO_ICMPV6)
		dport = 0;
	has = marker->flags;
	/* The peer's own entries first, then any peer's (the order of one trie's two lookups). A peer
	 * segment of LACE_SEGMENT_SELECTED would find the marker itself, which allows nothing; one of
	 * LACE_SEGMENT_ANY has only the any-peer entries. */
	if (peer != LACE_SEGMENT_SELECTED) {
		if (peer != LACE_SEGMENT_ANY)
			e = policy_match(has, subject, peer, dir, f->proto, dport);
		if (!e)
			e = policy_match(has >> LACE_POLICY_ANY_PEER_SHIFT, subject, LACE_SEGMENT_ANY, dir,
					 f->proto, dport);
	}
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
