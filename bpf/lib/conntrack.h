/* Stateful connection tracking per family and protocol: new / established / reply / related,
 * TCP state with timeouts. Keys carry the original direction's source network; a reply is found
 * by looking the reversed tuple up under the network the reply is routed back into. */
#ifndef LACE_LIB_CONNTRACK_H
#define LACE_LIB_CONNTRACK_H

#include "lib/maps.h"
#include "lib/flow.h"
#include "lib/clock.h"

union lace_ct_key {
	struct lace_ct4_key v4;
	struct lace_ct6_key v6;
};

/* Build the key of (network, saddr -> daddr, sport -> dport) for proto. */
static __always_inline void ct_key(union lace_ct_key *k, __u8 family, __u32 network, __u8 proto,
				   const __u8 *saddr, const __u8 *daddr, __be16 sport, __be16 dport)
{
	if (family == LACE_FAMILY_IPV4) {
		__builtin_memset(&k->v4, 0, sizeof(k->v4));
		k->v4.network = network;
		__builtin_memcpy(k->v4.saddr, saddr, 4);
		__builtin_memcpy(k->v4.daddr, daddr, 4);
		k->v4.sport = sport;
		k->v4.dport = dport;
		k->v4.proto = proto;
	} else {
		__builtin_memset(&k->v6, 0, sizeof(k->v6));
		k->v6.network = network;
		lace_copy16(k->v6.saddr, saddr);
		lace_copy16(k->v6.daddr, daddr);
		k->v6.sport = sport;
		k->v6.dport = dport;
		k->v6.proto = proto;
	}
}

static __always_inline struct lace_ct_entry *ct_lookup(__u8 family, __u8 proto, union lace_ct_key *k)
{
	if (family == LACE_FAMILY_IPV4) {
		if (proto == IPPROTO_TCP)
			return bpf_map_lookup_elem(&lace_ct_tcp4, &k->v4);
		if (proto == IPPROTO_UDP || proto == IPPROTO_SCTP)
			return bpf_map_lookup_elem(&lace_ct_udp4, &k->v4);
		return bpf_map_lookup_elem(&lace_ct_icmp4, &k->v4);
	}
	if (proto == IPPROTO_TCP)
		return bpf_map_lookup_elem(&lace_ct_tcp6, &k->v6);
	if (proto == IPPROTO_UDP || proto == IPPROTO_SCTP)
		return bpf_map_lookup_elem(&lace_ct_udp6, &k->v6);
	return bpf_map_lookup_elem(&lace_ct_icmp6, &k->v6);
}

/* Store e under k with the map update flags (BPF_ANY; BPF_NOEXIST to claim a key). */
static __always_inline long ct_insert(__u8 family, __u8 proto, union lace_ct_key *k,
				      const struct lace_ct_entry *e, __u64 flags)
{
	if (family == LACE_FAMILY_IPV4) {
		if (proto == IPPROTO_TCP)
			return bpf_map_update_elem(&lace_ct_tcp4, &k->v4, e, flags);
		if (proto == IPPROTO_UDP || proto == IPPROTO_SCTP)
			return bpf_map_update_elem(&lace_ct_udp4, &k->v4, e, flags);
		return bpf_map_update_elem(&lace_ct_icmp4, &k->v4, e, flags);
	}
	if (proto == IPPROTO_TCP)
		return bpf_map_update_elem(&lace_ct_tcp6, &k->v6, e, flags);
	if (proto == IPPROTO_UDP || proto == IPPROTO_SCTP)
		return bpf_map_update_elem(&lace_ct_udp6, &k->v6, e, flags);
	return bpf_map_update_elem(&lace_ct_icmp6, &k->v6, e, flags);
}

static __always_inline void ct_delete(__u8 family, __u8 proto, union lace_ct_key *k)
{
	if (family == LACE_FAMILY_IPV4) {
		if (proto == IPPROTO_TCP)
			bpf_map_delete_elem(&lace_ct_tcp4, &k->v4);
		else if (proto == IPPROTO_UDP || proto == IPPROTO_SCTP)
			bpf_map_delete_elem(&lace_ct_udp4, &k->v4);
		else
			bpf_map_delete_elem(&lace_ct_icmp4, &k->v4);
		return;
	}
	if (proto == IPPROTO_TCP)
		bpf_map_delete_elem(&lace_ct_tcp6, &k->v6);
	else if (proto == IPPROTO_UDP || proto == IPPROTO_SCTP)
		bpf_map_delete_elem(&lace_ct_udp6, &k->v6);
	else
		bpf_map_delete_elem(&lace_ct_icmp6, &k->v6);
}

static __always_inline __u64 ct_timeout_ns(__u8 state)
{
	__u64 s;

	switch (state) {
	case LACE_CT_SYN_SENT:
	case LACE_CT_SYN_RECV:    s = LACE_CT_TIMEOUT_SYN; break;
	case LACE_CT_ESTABLISHED: s = LACE_CT_TIMEOUT_ESTABLISHED; break;
	case LACE_CT_FIN_WAIT:    s = LACE_CT_TIMEOUT_FIN; break;
	case LACE_CT_CLOSING:
	case LACE_CT_CLOSED:      s = LACE_CT_TIMEOUT_CLOSE; break;
	case LACE_CT_REPLIED:     s = LACE_CT_TIMEOUT_UDP_REPLIED; break;
	default:                  s = LACE_CT_TIMEOUT_UDP; break;
	}
	return s * NSEC_PER_SEC;
}

/* Advance the state of an existing entry for a packet in direction reply (0: original). */
static __always_inline void ct_advance(struct lace_ct_entry *e, const struct lace_flow *f,
				       int reply, __u64 now)
{
	__u8 st = e->state;
	__u8 fl = f->tcp_flags;

	if (f->proto == IPPROTO_TCP) {
		if (fl & TCP_F_RST) {
			st = LACE_CT_CLOSED;
		} else if (fl & TCP_F_FIN) {
			__u8 other = reply ? e->tcp_flags_fwd : e->tcp_flags_rev;

			st = (other & TCP_F_FIN) ? LACE_CT_CLOSING : LACE_CT_FIN_WAIT;
		} else if (st == LACE_CT_SYN_SENT && reply && (fl & TCP_F_SYN) && (fl & TCP_F_ACK)) {
			st = LACE_CT_SYN_RECV;
		} else if (st == LACE_CT_SYN_RECV && (fl & TCP_F_ACK) && !(fl & TCP_F_SYN)) {
			st = LACE_CT_ESTABLISHED;
		} else if (st == LACE_CT_SYN_SENT && reply && (fl & TCP_F_ACK)) {
			st = LACE_CT_ESTABLISHED;
		}
		if (reply)
			e->tcp_flags_rev |= fl;
		else
			e->tcp_flags_fwd |= fl;
	} else if (reply) {
		st = LACE_CT_REPLIED;
	}
	if (reply) {
		e->packets_rev++;
		e->bytes_rev += f->l3_len;
		e->flags |= LACE_CT_F_SEEN_REPLY;
	} else {
		e->packets_fwd++;
		e->bytes_fwd += f->l3_len;
	}
	e->state = st;
	e->last_seen_ns = now;
	e->expires_ns = now + ct_timeout_ns(st);
}

static __always_inline __u8 ct_initial_state(const struct lace_flow *f)
{
	if (f->proto != IPPROTO_TCP)
		return LACE_CT_UNREPLIED;
	if (f->tcp_flags & TCP_F_RST)
		return LACE_CT_CLOSED;
	if ((f->tcp_flags & TCP_F_SYN) && !(f->tcp_flags & TCP_F_ACK))
		return LACE_CT_SYN_SENT;
	return LACE_CT_ESTABLISHED;   /* picked up mid-stream */
}

/* The entry an ICMP error relates to. The quoted packet was sent by the error's receiver: in a
 * flow's original direction (key under reply_network, the receiver's network; *quoted_orig = 1)
 * or in its reply direction (key under src_network, reversed; *quoted_orig = 0). */
static __always_inline struct lace_ct_entry *
ct_related(struct lace_flow *f, __u32 src_network, __u32 reply_network, __u64 now, int *quoted_orig)
{
	union lace_ct_key k;
	struct lace_ct_entry *e;

	*quoted_orig = 1;
	f->ct_network = reply_network;
	ct_key(&k, f->family, reply_network, f->inner_proto, f->inner_saddr, f->inner_daddr,
	       f->inner_sport, f->inner_dport);
	e = ct_lookup(f->family, f->inner_proto, &k);
	if (!e || (e->flags & LACE_CT_F_ALIAS)) {
		*quoted_orig = 0;
		f->ct_network = src_network;
		ct_key(&k, f->family, src_network, f->inner_proto, f->inner_daddr, f->inner_saddr,
		       f->inner_dport, f->inner_sport);
		e = ct_lookup(f->family, f->inner_proto, &k);
	}
	if (e && (e->flags & LACE_CT_F_ALIAS))
		e = 0;
	if (e && e->expires_ns < now)
		e = 0;
	if (e) {
		f->ct_status = LACE_CT_STATUS_RELATED;
		e->last_seen_ns = now;
	}
	return e;
}

/* Whether an entry still stands for this packet: not once it has expired (the agent's gc may not
 * have run yet), and not for a SYN that reopens a closed or closing TCP tuple — that is a new
 * connection and must meet policy again. */
static __always_inline int ct_usable(const struct lace_ct_entry *e, const struct lace_flow *f,
				     int reply, __u64 now)
{
	if (e->expires_ns < now)
		return 0;
	if (f->proto == IPPROTO_TCP && !reply && (f->tcp_flags & TCP_F_SYN) && !(f->tcp_flags & TCP_F_ACK) &&
	    e->state >= LACE_CT_FIN_WAIT && e->state <= LACE_CT_CLOSED)
		return 0;
	return 1;
}

/* Whether e stands for a connection its ends still hold: not an alias, not expired, and for TCP
 * not past both FINs or a reset (a peer in TIME_WAIT takes a new SYN on the tuple; one FIN is a
 * half-close, and the other end may still be sending). */
static __always_inline int ct_live(const struct lace_ct_entry *e, __u8 proto, __u64 now)
{
	if ((e->flags & LACE_CT_F_ALIAS) || e->expires_ns < now)
		return 0;
	return proto != IPPROTO_TCP || e->state < LACE_CT_CLOSING || e->state > LACE_CT_CLOSED;
}

/* A TCP segment with SYN and without ACK opens a connection: it is never a reply. A SYN that
 * reuses a tracked tuple reversed therefore meets policy as a new flow (as a SYN reopening a closed
 * tuple does), and new connections skip the reply lookup, a cold hash bucket in a large table.
 * A simultaneous open (both ends send a bare SYN) needs policy to allow both directions. */
static __always_inline int ct_may_be_reply(const struct lace_flow *f)
{
	return f->proto != IPPROTO_TCP || (f->tcp_flags & (TCP_F_SYN | TCP_F_ACK)) != TCP_F_SYN;
}

/* A reply of a flow whose original direction started in network: the reversed tuple, or, when
 * that is a reply alias (LACE_CT_F_ALIAS), the same tuple under the network the alias names.
 * f->ct_network says which. */
static __always_inline struct lace_ct_entry *
ct_reply(struct lace_flow *f, __u32 network, __u64 now)
{
	union lace_ct_key k;
	struct lace_ct_entry *e, *alias;

	if (!ct_may_be_reply(f))
		return 0;
	f->ct_network = network;
	ct_key(&k, f->family, network, f->proto, f->daddr, f->saddr, f->dport, f->sport);
	e = ct_lookup(f->family, f->proto, &k);
	if (e && (e->flags & LACE_CT_F_ALIAS)) {
		alias = e;
		f->ct_network = alias->dst_network;
		ct_key(&k, f->family, alias->dst_network, f->proto, f->daddr, f->saddr, f->dport, f->sport);
		e = ct_lookup(f->family, f->proto, &k);
		if (e && (e->flags & LACE_CT_F_ALIAS))
			e = 0;                          /* aliases never chain */
		if (e) {
			alias->last_seen_ns = now;
			alias->expires_ns = now + ct_timeout_ns(LACE_CT_ESTABLISHED);
		}
	}
	if (e && !ct_usable(e, f, 1, now))
		e = 0;
	if (e) {
		f->ct_status = LACE_CT_STATUS_REPLY;
		ct_advance(e, f, 1, now);
	}
	return e;
}

/* Look the packet up in its original direction under src_network: the entry (advanced, status
 * ESTABLISHED), or NULL — with *stale set when an entry of the tuple no longer stands for it
 * (status NEW: ct_create replaces it, and it is no reply either): 2 when that is a service flow's
 * entry (lib/service.h: its reopening SYN looks for a connection holding its backend's tuple), else 1. */
static __always_inline struct lace_ct_entry *
ct_forward(struct lace_flow *f, __u32 src_network, __u64 now, int *stale)
{
	union lace_ct_key k;
	struct lace_ct_entry *e;

	*stale = 0;
	ct_key(&k, f->family, src_network, f->proto, f->saddr, f->daddr, f->sport, f->dport);
	e = ct_lookup(f->family, f->proto, &k);
	if (e && (e->flags & LACE_CT_F_ALIAS))
		e = 0;                                  /* an alias answers replies only */
	if (e && !ct_usable(e, f, 0, now)) {
		f->ct_status = LACE_CT_STATUS_NEW;   /* ct_create replaces the stale entry */
		*stale = (e->flags & LACE_CT_F_SERVICE) ? 2 : 1;
		return 0;
	}
	if (e) {
		f->ct_status = LACE_CT_STATUS_ESTABLISHED;
		f->ct_network = src_network;
		ct_advance(e, f, 0, now);
	}
	return e;
}

/* Look the packet up in its original direction under src_network, then as a reply of a flow
 * from the same network. Sets f->ct_status; NULL means new so far (the caller may still try
 * ct_reply under the network the destination is routed into). */
static __always_inline struct lace_ct_entry *
ct_classify(struct lace_flow *f, __u32 src_network, __u64 now)
{
	struct lace_ct_entry *e;
	int stale;

	e = ct_forward(f, src_network, now, &stale);
	if (e || stale)
		return e;
	e = ct_reply(f, src_network, now);
	if (!e)
		f->ct_status = LACE_CT_STATUS_NEW;
	return e;
}

/* A new entry for flow f, admitted by policy: its original direction seen once. */
static __always_inline void ct_init(struct lace_ct_entry *e, const struct lace_flow *f, __u64 now)
{
	e->created_ns = now;
	e->last_seen_ns = now;
	e->state = ct_initial_state(f);
	e->expires_ns = now + ct_timeout_ns(e->state);
	e->packets_fwd = 1;
	e->bytes_fwd = f->l3_len;
	e->src_segment = f->src_segment;
	e->dst_segment = f->dst_segment;
	e->dst_network = f->dst_network;
	e->tcp_flags_fwd = f->tcp_flags;
	e->delivery = f->delivery;
	if (f->audit)
		e->flags |= LACE_CT_F_AUDIT;
}

/* Store entry e under (network, saddr -> daddr, sport -> dport) of f's family and protocol.
 * BPF_ANY: a new flow replaces a stale entry of the same tuple (expired, or a reopened TCP port);
 * an LRU table evicts rather than fails, so a failure here is a full table. Returns 0 or a drop
 * reason. */
static __always_inline int ct_store(const struct lace_flow *f, __u32 network, const __u8 *saddr,
				    const __u8 *daddr, __be16 sport, __be16 dport, struct lace_ct_entry *e)
{
	union lace_ct_key k;

	ct_key(&k, f->family, network, f->proto, saddr, daddr, sport, dport);
	if (ct_insert(f->family, f->proto, &k, e, BPF_ANY) < 0)
		return LACE_DROP_CT_FULL;
	return 0;
}

/* Whether a new flow needs a reply alias here: delivered to a local pod in another network than
 * its source network (LACE_CT_F_ALIAS). */
static __always_inline int ct_needs_alias(const struct lace_flow *f)
{
	return f->dst_network != f->src_network && f->delivery == LACE_DELIVERY_LOCAL;
}

/* Turn e into the reply alias of flow f, to be stored under f's destination network. */
static __always_inline void ct_make_alias(struct lace_ct_entry *e, const struct lace_flow *f, __u64 now)
{
	__builtin_memset(e, 0, sizeof(*e));
	e->created_ns = now;
	e->last_seen_ns = now;
	e->expires_ns = now + ct_timeout_ns(LACE_CT_ESTABLISHED);
	e->dst_network = f->src_network;
	e->flags = LACE_CT_F_ALIAS;
}

/* Store a new flow's entry e (from ct_init) under its source network, and its reply alias when it
 * needs one (e becomes the alias). Returns 0 or a drop reason. */
static __always_inline int ct_record(const struct lace_flow *f, struct lace_ct_entry *e, __u64 now)
{
	int rc = ct_store(f, f->src_network, f->saddr, f->daddr, f->sport, f->dport, e);

	if (rc || !ct_needs_alias(f))
		return rc;
	ct_make_alias(e, f, now);
	return ct_store(f, f->dst_network, f->saddr, f->daddr, f->sport, f->dport, e);
}

/* Delete the entry of (network, saddr -> daddr, sport -> dport) of f's family and protocol, if
 * any (ct_store's counterpart). */
static __always_inline void ct_forget(const struct lace_flow *f, __u32 network, const __u8 *saddr,
				      const __u8 *daddr, __be16 sport, __be16 dport)
{
	union lace_ct_key k;

	ct_key(&k, f->family, network, f->proto, saddr, daddr, sport, dport);
	ct_delete(f->family, f->proto, &k);
}

/* The endpoint-ct counter of the table a flow of (family, proto) goes into (as ct_lookup). */
static __always_inline __u32 *ct_endpoint_slot(struct lace_ct_endpoint *q, __u8 family, __u8 proto)
{
	if (family == LACE_FAMILY_IPV4) {
		if (proto == IPPROTO_TCP)
			return &q->tcp4;
		if (proto == IPPROTO_UDP || proto == IPPROTO_SCTP)
			return &q->udp4;
		return &q->icmp4;
	}
	if (proto == IPPROTO_TCP)
		return &q->tcp6;
	if (proto == IPPROTO_UDP || proto == IPPROTO_SCTP)
		return &q->udp6;
	return &q->icmp6;
}

/* Whether the local endpoint on ifindex, whose limit is ct_max flows per table (0: none), may
 * open the new flow f: 0, or CT_ENDPOINT_LIMIT when it already holds ct_max flows in f's table.
 * Called right before a new flow's entries are stored. Writes nothing: a refused flow leaves no
 * state. Only new flows get here: established packets and replies never pay for the limit. */
static __always_inline int ct_endpoint_admit(const struct lace_flow *f, __u32 ifindex, __u16 ct_max)
{
	struct lace_ct_endpoint_key k = { .ifindex = ifindex };
	struct lace_ct_endpoint *q;

	if (!ct_max)
		return 0;
	q = bpf_map_lookup_elem(&lace_ep_ct, &k);
	if (q && *ct_endpoint_slot(q, f->family, f->proto) >= ct_max)
		return LACE_DROP_CT_ENDPOINT_LIMIT;
	return 0;
}

/* Count the new flow f against the endpoint once its packet is on its way: verdict is the
 * delivery's, and a flow whose delivery dropped it has had its entries taken back
 * (ct_forget_if_shot), so it does not count. Returns verdict. The counts are looked up again
 * rather than carried over from ct_endpoint_admit: a map pointer that may be NULL, live across
 * the delivery, would double the states the verifier walks through every delivery path. */
static __always_inline int ct_endpoint_charge(const struct lace_flow *f, __u32 ifindex, __u16 ct_max,
					      int verdict)
{
	struct lace_ct_endpoint_key k = { .ifindex = ifindex };
	struct lace_ct_endpoint *q, first = {};

	if (!ct_max || verdict == TC_ACT_SHOT)
		return verdict;
	q = bpf_map_lookup_elem(&lace_ep_ct, &k);
	if (!q) {
		/* the endpoint's first counted flow (or the first since the agent's GC found none) */
		*ct_endpoint_slot(&first, f->family, f->proto) = 1;
		if (bpf_map_update_elem(&lace_ep_ct, &k, &first, BPF_NOEXIST) == 0)
			return verdict;
		q = bpf_map_lookup_elem(&lace_ep_ct, &k);   /* another CPU made it meanwhile */
		if (!q)
			return verdict;   /* cannot happen: one entry per veth entry fits; uncounted */
	}
	__sync_fetch_and_add(ct_endpoint_slot(q, f->family, f->proto), 1);
	return verdict;
}

/* Record a new flow after policy allowed it (and its reply alias when it needs one). Returns 0
 * or a drop reason. */
__lace_subprog int ct_create(const struct lace_flow *f, __u64 now)
{
	struct lace_ct_entry e = {};

	ct_init(&e, f, now);
	return ct_record(f, &e, now);
}

#endif
