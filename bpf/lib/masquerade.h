/* Masquerade: a pod flow routed to the outside by a route with LACE_ROUTE_F_MASQUERADE leaves from
 * the node's own address (config addr4 for IPv4, underlay_addr for IPv6) and a node port, and the
 * replies are written back to the pod.
 *
 * A new flow gets a port by the rules of abi/masquerade.h: candidates in a fixed order derived from
 * the pod tuple's flow hash, each tried by inserting its port reservation with BPF_NOEXIST, so two
 * CPUs can never hand out the same (node address, port, remote, remote port). Then the flow has
 * two conntrack entries (abi/conntrack.h):
 *   pod entry        (SNAT): (pod network, pod -> remote), nat = node address:port,
 *                            dst_network OUTSIDE
 *   port reservation (MASQ): (OUTSIDE, node address:port -> remote), nat = pod address:port,
 *                            dst_network = the pod's network
 * Both see every packet of the flow in both directions (so they share state and expiry).
 * Established packets from the pod find the pod entry and leave translated; a lost reservation is
 * put back from it. Replies arrive on the uplink addressed to the node, find the reservation as a
 * reply in network OUTSIDE, are written back to the pod's address and port, advance the pod entry
 * and are delivered into the pod. ICMP errors the outside sends about a masqueraded packet (they
 * quote node address:port -> remote) get the pod back in their destination and in the quoted
 * source; an error the pod sends about a reply leaves from the node, quoting the node address and
 * port as the remote sent them.
 *
 * TCP and UDP are translated by port, ICMP echo by identifier (both "ports" of an echo's key are
 * its identifier). Anything else routed to a masquerading route cannot be translated and is
 * dropped as NAT_FAILED, as is a flow whose family the node has no address of.
 *
 * Translated packets leave through the node's FIB, not its stack (lib/forward.h forward_outside):
 * a packet from one of the node's own addresses arriving on a pod veth is a martian to the stack.
 *
 * Trace events of a translated packet carry nat_kind SNAT; their addresses are the pod side of the
 * flow (forward: pod -> remote, reply: remote -> pod) and nat_addr:nat_port is the node address and
 * port the pod stands behind.
 *
 * A service flow to a backend in network OUTSIDE (lib/service.h; LACE_CT_F2_MASQ) is masqueraded
 * here after its DNAT, without a route: the translated flow (pod -> backend) gets its port, pod
 * entry and reservation as any, flagged, next to the service's frontend entry. Established packets
 * find the frontend entry, are translated to the backend, then find the pod entry by the
 * translated tuple and leave from the node (service_masq_forward). Replies find the reservation,
 * are written back to the pod, and then find the frontend entry through the backend's revnat entry
 * under OUTSIDE, whose frontend becomes their source (service_masq_reply); ICMP errors about the
 * flow get the frontend back in their quote the same way. Three entries where a service flow has
 * one and a masqueraded flow two: the frontend entry holds the backend, the pod entry the port, and
 * neither has room for the other's. The pod entry's tuple is the one a direct flow from the same
 * port to the backend would have: the new service flow does not take it while such a flow is live
 * (service_dnat), and a direct packet that meets the service flow's pod entry is dropped as
 * TUPLE_IN_USE (pod_veth.c). These flows' events are the service's (DNAT, nat_* the frontend). */
#ifndef LACE_LIB_MASQUERADE_H
#define LACE_LIB_MASQUERADE_H

#include "lib/common.h"
#include "lib/maps.h"
#include "lib/flow.h"
#include "lib/conntrack.h"
#include "lib/nat.h"
#include "lib/service.h"
#include "lace/abi/masquerade.h"

_Static_assert((LACE_MASQ_PORT_COUNT & (LACE_MASQ_PORT_COUNT - 1)) == 0,
	       "the masquerade port count is a power of two (candidates are taken modulo it)");
_Static_assert(LACE_MASQ_PORT_MIN + LACE_MASQ_PORT_COUNT <= 65536, "masquerade ports are 16-bit");

/* The flags that make an entry part of an address translation. */
#define LACE_CT_NAT_FLAGS (LACE_CT_F_DNAT | LACE_CT_F_SNAT | LACE_CT_F_SERVICE | LACE_CT_F_MASQ)

/* Whether f can be masqueraded: TCP, UDP, or an ICMP echo request (ICMP errors are translated
 * with the flow they are about). */
static __always_inline int masq_supported(const struct lace_flow *f)
{
	if (f->proto == IPPROTO_TCP || f->proto == IPPROTO_UDP)
		return 1;
	if (f->proto == IPPROTO_ICMP)
		return f->icmp_type == 8;
	if (f->proto == IPPROTO_ICMPV6)
		return f->icmp_type == 128;
	return 0;
}

/* The node address a flow of family leaves from, into out (8-byte aligned); 0 when the node has
 * none of that family. */
static __always_inline int masq_node_addr(const struct lace_config *cfg, __u8 family, __u8 *out)
{
	__u64 *w = (__u64 *)out;

	w[0] = 0;
	w[1] = 0;
	if (family == LACE_FAMILY_IPV4) {
		__builtin_memcpy(out, cfg->addr4, 4);
		return w[0] != 0;
	}
	__builtin_memcpy(out, cfg->underlay_addr, 16);
	return (w[0] | w[1]) != 0;
}

/* Candidate i of hash h (abi/masquerade.h), in network byte order. */
static __always_inline __be16 masq_candidate(__u32 h, __u32 i)
{
	__u32 start = h & (LACE_MASQ_PORT_COUNT - 1);
	__u32 stride = ((h >> 16) & (LACE_MASQ_PORT_COUNT - 1)) | 1;

	return bpf_htons(LACE_MASQ_PORT_MIN + ((start + i * stride) & (LACE_MASQ_PORT_COUNT - 1)));
}

/* The reservation key of (node:port -> f's destination); an echo's identifier is both its ports. */
static __always_inline void masq_key(union lace_ct_key *k, const struct lace_flow *f, const __u8 *node,
				     __be16 port)
{
	__be16 dport = f->proto == IPPROTO_TCP || f->proto == IPPROTO_UDP ? f->dport : port;

	ct_key(k, f->family, LACE_NETWORK_OUTSIDE, f->proto, node, f->daddr, port, dport);
}

/* Whether reservation r already stands for f's own pod address and port in f's network. */
static __always_inline int masq_owned(const struct lace_ct_entry *r, const struct lace_flow *f)
{
	return (r->flags & LACE_CT_F_MASQ) && r->dst_network == f->src_network && r->nat_port == f->sport &&
	       lace_eq16_a8(r->nat_addr, f->saddr);
}

/* Claim reservation e under k for f: a free key, or one f may take over — an expired reservation,
 * or f's own (its pod entry was lost or expired first). */
static __always_inline int masq_claim(union lace_ct_key *k, const struct lace_flow *f,
				      const struct lace_ct_entry *e, __u64 now)
{
	struct lace_ct_entry *old;

	if (ct_insert(f->family, f->proto, k, e, BPF_NOEXIST) == 0)
		return 1;
	old = ct_lookup(f->family, f->proto, k);
	if (!old || (old->expires_ns >= now && !masq_owned(old, f)))
		return 0;
	return ct_insert(f->family, f->proto, k, e, BPF_ANY) == 0;
}

/* Write the source of f's packet over with node:port (an echo: its identifier). f keeps the pod
 * side of the flow; nat_* get the node side. */
static __always_inline int masq_rewrite_source(struct __sk_buff *skb, struct lace_flow *f, const __u8 *node,
					       __be16 port)
{
	int rc;

	rc = nat_rewrite_addr(skb, f->family, f->proto, f->l4_off, NAT_SRC, f->saddr, node);
	if (rc)
		return rc;
	if (f->proto == IPPROTO_TCP || f->proto == IPPROTO_UDP)
		rc = nat_rewrite_port(skb, f->proto, f->l4_off, NAT_SRC, f->sport, port);
	else
		rc = nat_rewrite_echo_id(skb, f->l4_off, f->sport, port);
	if (rc)
		return rc;
	lace_copy16_a8(f->nat_addr, node);
	f->nat_port = port;
	f->nat_kind = LACE_NAT_SNAT;
	return 0;
}

/* The search for a free port, run by bpf_loop (the verifier checks the callback once, not once per
 * candidate): the reservation to insert, the node address, and what was found. */
struct masq_search {
	struct lace_ct_entry e;   /* the reservation, complete but for its key */
	union lace_addr node;
	__u64 now;
	__u32 hash;
	__be16 port;              /* the port claimed (valid when found) */
	__u8 found;
	__u8 reserved;
};

/* The search lives in a per-CPU array of one entry, as struct lace_flow does (lib/flow.h): on the
 * stack it would not fit next to the walk's frames and the callback's. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct masq_search);
} lace_masq_scratch SEC(".maps");

/* bpf_loop callback: try candidate i; 1 (stop) once one is claimed. */
static long masq_try(__u32 i, void *ctx)
{
	union lace_ct_key k;
	struct masq_search *s;
	struct lace_flow *f;
	__u32 zero = 0;
	__be16 port;

	f = bpf_map_lookup_elem(&lace_scratch, &zero);
	s = bpf_map_lookup_elem(&lace_masq_scratch, &zero);
	if (!f || !s)
		return 1;
	port = masq_candidate(s->hash, i);
	masq_key(&k, f, s->node.b, port);
	if (!masq_claim(&k, f, &s->e, s->now))
		return 0;
	s->port = port;
	s->found = 1;
	return 1;
}

/* A new flow of f, admitted by policy, to a masquerading route: claim a port, record the pod entry
 * and translate the packet. Returns 0 or a drop reason (NAT_FAILED: nothing to translate with, or
 * masquerade port space exhausted for this destination). */
__lace_subprog int masq_new_flow(struct __sk_buff *skb, struct lace_flow *f, const struct lace_config *cfg,
				 __u64 now)
{
	union lace_ct_key k;
	union lace_addr node;
	struct masq_search *s;
	__u32 zero = 0;
	__be16 port;
	int rc;

	s = bpf_map_lookup_elem(&lace_masq_scratch, &zero);
	if (!s)
		return LACE_DROP_NAT_FAILED;   /* unreachable: index 0 of a one-entry array */
	__builtin_memset(s, 0, sizeof(*s));
	if (!masq_supported(f) || !masq_node_addr(cfg, f->family, s->node.b))
		return LACE_DROP_NAT_FAILED;
	ct_init(&s->e, f, now);
	s->e.flags |= LACE_CT_F_MASQ;
	if (f->svc_flags & LACE_SVC_FLOW_MASQ) {
		/* a service flow's (service_masq_new_flow): both entries say so */
		s->e.flags2 = LACE_CT_F2_MASQ;
		s->e.rev_nat_id = f->service_id;
	}
	s->e.dst_network = f->src_network;
	lace_copy16_a8(s->e.nat_addr, f->saddr);
	s->e.nat_port = f->sport;
	s->now = now;
	s->hash = service_flow_hash(f, f->src_network);
	bpf_loop(LACE_MASQ_TRIES, masq_try, 0, 0);
	if (!s->found)
		return LACE_DROP_NAT_FAILED;   /* masquerade port space exhausted for this destination */

	/* the same entry, turned into the pod's */
	port = s->port;
	lace_copy16_a8(&node, &s->node);
	s->e.flags = (s->e.flags & ~LACE_CT_F_MASQ) | LACE_CT_F_SNAT;
	s->e.dst_network = f->dst_network;
	lace_copy16_a8(s->e.nat_addr, node.b);
	s->e.nat_port = port;
	rc = ct_store(f, f->src_network, f->saddr, f->daddr, f->sport, f->dport, &s->e);
	if (rc) {
		masq_key(&k, f, node.b, port);
		ct_delete(f->family, f->proto, &k);   /* a new flow that could not be recorded after all */
		return rc;
	}
	rc = masq_rewrite_source(skb, f, node.b, port);
	if (rc) {
		/* not translated (a transport header cut short of its checksum): the flow never left,
		 * so neither its port nor its pod entry stays */
		masq_key(&k, f, node.b, port);
		ct_delete(f->family, f->proto, &k);
		ct_key(&k, f->family, f->src_network, f->proto, f->saddr, f->daddr, f->sport, f->dport);
		ct_delete(f->family, f->proto, &k);
	}
	return rc;
}

/* An established packet of a masqueraded flow, found by its pod entry pe (already advanced): the
 * reservation sees it too (put back from pe if it was evicted; NAT_FAILED when another flow took
 * the port meanwhile), and the packet leaves translated. Returns 0 or a drop reason. */
__lace_subprog int masq_forward(struct __sk_buff *skb, struct lace_flow *f, struct lace_ct_entry *pe,
				__u64 now)
{
	struct lace_ct_entry *r;
	union lace_ct_key k;
	union lace_addr node;
	__be16 port = pe->nat_port;

	lace_copy16_a8(&node, pe->nat_addr);
	masq_key(&k, f, node.b, port);
	r = ct_lookup(f->family, f->proto, &k);
	if (r && masq_owned(r, f)) {
		ct_advance(r, f, 0, now);
	} else {
		if (r && r->expires_ns >= now)
			return LACE_DROP_NAT_FAILED;   /* the port went to another flow meanwhile */
		/* copied map to map, then made a reservation in place (no entry on the stack) */
		if (ct_insert(f->family, f->proto, &k, pe, r ? BPF_ANY : BPF_NOEXIST) < 0)
			return LACE_DROP_NAT_FAILED;
		r = ct_lookup(f->family, f->proto, &k);
		if (r) {
			r->flags = (r->flags & ~LACE_CT_F_SNAT) | LACE_CT_F_MASQ;
			r->dst_network = f->src_network;
			lace_copy16_a8(r->nat_addr, f->saddr);
			r->nat_port = f->sport;
		}
	}
	f->dst_network = pe->dst_network;
	f->dst_segment = pe->dst_segment;
	return masq_rewrite_source(skb, f, node.b, port);
}

/* A reply of a masqueraded flow arriving from the outside, found as the reply of reservation r
 * (already advanced): its destination becomes the pod's address and port again, in the pod's
 * network, and the pod entry sees it. f becomes the pod side (remote -> pod); nat_* keep the node
 * side. Returns 0 or a drop reason. */
__lace_subprog int masq_reply(struct __sk_buff *skb, struct lace_flow *f, const struct lace_ct_entry *r,
			      __u64 now)
{
	struct lace_ct_entry *pe;
	union lace_addr pod;
	__be16 port = r->nat_port;
	int rc;

	lace_copy16_a8(&pod, r->nat_addr);
	rc = nat_rewrite_addr(skb, f->family, f->proto, f->l4_off, NAT_DST, f->daddr, pod.b);
	if (rc)
		return rc;
	if (f->proto == IPPROTO_TCP || f->proto == IPPROTO_UDP)
		rc = nat_rewrite_port(skb, f->proto, f->l4_off, NAT_DST, f->dport, port);
	else
		rc = nat_rewrite_echo_id(skb, f->l4_off, f->dport, port);
	if (rc)
		return rc;
	lace_copy16_a8(f->nat_addr, f->daddr);
	f->nat_port = f->dport;
	f->nat_kind = LACE_NAT_SNAT;
	lace_copy16_a8(f->daddr, &pod);
	f->dport = port;
	if (f->proto != IPPROTO_TCP && f->proto != IPPROTO_UDP)
		f->sport = port;            /* an echo reply: the identifier is both "ports" */
	f->dst_network = r->dst_network;
	f->src_segment = r->dst_segment;
	f->dst_segment = r->src_segment;
	pe = ct_reply(f, f->dst_network, now);
	if (pe)
		f->dst_segment = pe->src_segment;
	f->ct_status = LACE_CT_STATUS_REPLY;
	return 0;
}

/* A new service flow to a backend outside (LACE_SVC_FLOW_MASQ), translated to it and its frontend
 * entry stored: masqueraded as the pod's flow to that address would be (masq_new_flow), whatever
 * the routes say. f keeps the service's view, for its trace and for ct_forget_new: nat_addr:nat_port
 * the frontend, nat_kind DNAT. A refused flow takes its frontend entry back too. Returns 0 or a drop
 * reason. */
__lace_subprog int service_masq_new_flow(struct __sk_buff *skb, struct lace_flow *f,
					 const struct lace_config *cfg, __u64 now)
{
	union lace_addr vip;
	__be16 vport = f->nat_port;
	int rc;

	lace_copy16_a8(&vip, f->nat_addr);
	rc = masq_new_flow(skb, f, cfg, now);
	lace_copy16_a8(f->nat_addr, &vip);
	f->nat_port = vport;
	f->nat_kind = LACE_NAT_DNAT;
	if (rc)
		ct_forget_new(f);   /* the frontend entry: masq_new_flow took its own back */
	return rc;
}

/* An established packet of a service flow to a backend outside, translated to the backend by
 * service_forward (f: the backend flow, nat_* the frontend): its pod entry, keyed by that flow, sees
 * it, and it leaves masqueraded (masq_forward). NAT_FAILED without the pod entry: the port is in it
 * alone. Returns 0 or a drop reason. */
__lace_subprog int service_masq_forward(struct __sk_buff *skb, struct lace_flow *f, __u64 now)
{
	union lace_ct_key k;
	struct lace_ct_entry *pe;
	union lace_addr vip;
	__be16 vport = f->nat_port;
	int rc;

	ct_key(&k, f->family, f->src_network, f->proto, f->saddr, f->daddr, f->sport, f->dport);
	pe = ct_lookup(f->family, f->proto, &k);
	if (!pe || !(pe->flags & LACE_CT_F_SNAT) || !(pe->flags2 & LACE_CT_F2_MASQ))
		return LACE_DROP_NAT_FAILED;
	ct_advance(pe, f, 0, now);
	lace_copy16_a8(&vip, f->nat_addr);
	rc = masq_forward(skb, f, pe, now);
	lace_copy16_a8(f->nat_addr, &vip);
	f->nat_port = vport;
	f->nat_kind = LACE_NAT_DNAT;
	return rc;
}

/* A reply of a service flow to a backend outside, written back to its pod by masq_reply (f: backend
 * -> pod, in the pod's network): the frontend entry, found through the backend's revnat entry under
 * OUTSIDE among the frontends of the pod's network, sees it, and the frontend becomes its source
 * (service_reply). CT_INVALID when no frontend entry holds the flow any more: the pod's socket knows
 * only the frontend, and the backend's own address would not be its reply. Returns 0 or a drop
 * reason. */
__lace_subprog int service_masq_reply(struct __sk_buff *skb, struct lace_flow *f, __u64 now)
{
	struct lace_ct_entry *fe = service_lookup(f, LACE_NETWORK_OUTSIDE, f->dst_network, 0);

	if (!fe || fe->expires_ns < now)
		return LACE_DROP_CT_INVALID;
	ct_advance(fe, f, 1, now);
	return service_reply(skb, f, fe, f->ct_network, now);
}

/* An ICMP error from the outside about a service flow to a backend outside, written back to its pod
 * by masq_icmp_error (its quote: pod -> backend): the quoted destination becomes the frontend again
 * (and the error's source, when the backend sent it: service_icmp_error), the frontend entry found
 * as service_masq_reply finds it. Returns 0 or a drop reason. */
__lace_subprog int service_masq_icmp_error(struct __sk_buff *skb, struct lace_flow *f, __u64 now)
{
	struct lace_ct_entry *fe = service_lookup(f, LACE_NETWORK_OUTSIDE, f->dst_network, 1);

	if (!fe || fe->expires_ns < now)
		return LACE_DROP_CT_INVALID;
	fe->last_seen_ns = now;
	return service_icmp_error(skb, f, fe);
}

/* Rewrite an ICMP error in place, on one side of its outer header and the other side of the packet
 * it quotes (the quoted packet went the other way): from_node set — an error to the node about a
 * packet that left from it: outer destination and quoted source; clear — an error from a pod about
 * a packet it received: outer source and quoted destination. The address goes from -> to, the
 * quoted port (a quoted echo: its identifier) pfrom -> pto (nat_rewrite_quoted). */
static __always_inline int masq_icmp_error_rewrite(struct __sk_buff *skb, struct lace_flow *f, int from_node,
						   const __u8 *from, const __u8 *to, __be16 pfrom, __be16 pto)
{
	int rc = nat_rewrite_quoted(skb, f, from_node ? NAT_SRC : NAT_DST, from, to, pfrom, pto);

	if (rc)
		return rc;
	return nat_rewrite_addr(skb, f->family, f->proto, f->l4_off, from_node ? NAT_DST : NAT_SRC,
				from_node ? f->daddr : f->saddr, to);
}

/* An ICMP error from the outside quoting a packet of the masqueraded flow whose reservation is r:
 * written back to the pod (outer destination, quoted source address and port), for delivery in
 * the pod's network. Returns 0 or a drop reason. */
__lace_subprog int masq_icmp_error(struct __sk_buff *skb, struct lace_flow *f, const struct lace_ct_entry *r)
{
	union lace_addr pod;
	int rc;

	lace_copy16_a8(&pod, r->nat_addr);
	rc = masq_icmp_error_rewrite(skb, f, 1, f->daddr, pod.b, f->inner_sport, r->nat_port);
	if (rc)
		return rc;
	lace_copy16_a8(f->nat_addr, f->daddr);
	f->nat_port = f->inner_sport;
	f->nat_kind = LACE_NAT_SNAT;
	lace_copy16_a8(f->daddr, &pod);
	lace_copy16_a8(f->inner_saddr, &pod);
	f->inner_sport = r->nat_port;
	f->dst_network = r->dst_network;
	f->src_segment = r->dst_segment;
	f->dst_segment = r->src_segment;
	return 0;
}

/* An ICMP error a pod sends to the outside about a packet of its masqueraded flow (pod entry pe,
 * found through the quoted remote -> pod packet): it leaves from the node, quoting the packet as
 * the remote sent it (to the node address and port). Returns 0 or a drop reason. */
__lace_subprog int masq_icmp_error_out(struct __sk_buff *skb, struct lace_flow *f, const struct lace_ct_entry *pe)
{
	union lace_addr node;
	int rc;

	lace_copy16_a8(&node, pe->nat_addr);
	rc = masq_icmp_error_rewrite(skb, f, 0, f->saddr, node.b, f->inner_dport, pe->nat_port);
	if (rc)
		return rc;
	lace_copy16_a8(f->nat_addr, &node);
	f->nat_port = pe->nat_port;
	f->nat_kind = LACE_NAT_SNAT;
	f->dst_network = LACE_NETWORK_OUTSIDE;
	return 0;
}

#endif
