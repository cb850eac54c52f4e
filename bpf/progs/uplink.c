// SPDX-License-Identifier: GPL-2.0
/* Attach point: tc ingress on the node's uplink (traffic arriving from the underlay).
 * Packets for this node's own locator are decapsulated; the SID names the destination network
 * (function) and the source network (argument); then conntrack (a reply of a service flow this
 * node translated gets its frontend back as the source), ingress policy of the destination pod
 * and delivery into it — or, for this node's host address, into the node's stack (ingress policy
 * of segment HOST, which no policy selects).
 *
 * A packet whose SID function is OUTSIDE is the reply of a NodePort or LoadBalancer flow this node
 * translated and sent to a backend on another node: its frontend is written back as the source and
 * it leaves through the node's FIB. A packet whose SID argument is OUTSIDE is such a flow sent here
 * by another node: its entry keeps the sender's origin SID (the outer source) for the replies
 * (lib/nodeport.h).
 *
 * Everything else arrives from the outside (from_outside), in network OUTSIDE: a reply of a flow
 * this node masquerades (or an ICMP error about one) is written back to its pod and delivered into
 * it (lib/masquerade.h), from the frontend when it is a service flow to a backend outside; a flow
 * to a NodePort or LoadBalancer frontend is balanced to a backend, on this node or another
 * (lib/nodeport.h); the rest goes to the node's stack untouched. */
#include "lib/common.h"
#include "lib/maps.h"
#include "lib/flow.h"
#include "lib/parse.h"
#include "lib/drop.h"
#include "lib/segment.h"
#include "lib/policy.h"
#include "lib/conntrack.h"
#include "lib/delivery.h"
#include "lib/srv6.h"
#include "lib/forward.h"
#include "lib/service.h"
#include "lib/masquerade.h"
#include "lib/nodeport.h"
#include "lib/probe.h"

char LICENSE[] SEC("license") = "GPL";

/* Into the pod of a masqueraded flow f, whose reply or ICMP error has been written back to it. */
static __always_inline int outside_to_pod(struct __sk_buff *skb, struct lace_flow *f,
					  const struct lace_config *cfg)
{
	struct lace_delivery *d = delivery_lookup(f->dst_network, f->family, f->daddr);

	if (!d || d->kind != LACE_DELIVERY_LOCAL)
		return lace_drop(skb, f, LACE_DROP_NO_DELIVERY);   /* the pod is gone */
	f->delivery = d->kind;
	return forward_local(skb, f, cfg, d);
}

/* A packet from the outside (not encapsulated for this node). What lace cannot parse, and what
 * belongs to no flow lace translates, is the node's own traffic: its stack decides. A function of
 * its own: its frame and the decapsulation path's are never on the stack together. */
__lace_subprog int from_outside(struct __sk_buff *skb, struct lace_flow *f, const struct lace_config *cfg)
{
	struct lace_service_key skey;
	struct lace_delivery *d = 0;
	struct lace_service *svc;
	struct lace_ct_entry *e;
	__u64 now;
	int rc, quoted_orig;
	__u8 svc_masq;

	if (parse_packet(skb, f))
		return TC_ACT_OK;
	f->src_network = LACE_NETWORK_OUTSIDE;
	now = f->now_ns = ct_now();
	if (f->icmp_error) {
		e = ct_related(f, LACE_NETWORK_OUTSIDE, LACE_NETWORK_OUTSIDE, now, &quoted_orig);
		if (!e || !quoted_orig || !(e->flags & LACE_CT_F_MASQ))
			return TC_ACT_OK;
		svc_masq = e->flags2 & LACE_CT_F2_MASQ;
		rc = masq_icmp_error(skb, f, e);
		if (!rc && svc_masq)
			rc = service_masq_icmp_error(skb, f, now);
		if (rc)
			return lace_drop(skb, f, rc);
		return outside_to_pod(skb, f, cfg);
	}
	e = ct_classify(f, LACE_NETWORK_OUTSIDE, now);
	if (e && f->ct_status == LACE_CT_STATUS_REPLY && (e->flags & LACE_CT_F_MASQ)) {
		svc_masq = e->flags2 & LACE_CT_F2_MASQ;
		rc = masq_reply(skb, f, e, now);
		if (!rc && svc_masq)
			rc = service_masq_reply(skb, f, now);   /* from the frontend, not the backend */
		if (rc)
			return lace_drop(skb, f, rc);
		return outside_to_pod(skb, f, cfg);
	}
	if (e && f->ct_status == LACE_CT_STATUS_ESTABLISHED && (e->flags & LACE_CT_F_SERVICE)) {
		rc = service_forward(skb, f, e, now);
		if (rc)
			return lace_drop(skb, f, rc);
		return nodeport_deliver(skb, f, cfg, 0);
	}
	svc = service_frontend(f, LACE_NETWORK_OUTSIDE, &skey);
	if (!svc)
		return TC_ACT_OK;
	f->ct_status = LACE_CT_STATUS_NEW;
	rc = nodeport_new_flow(skb, f, &skey, svc, &d);
	if (rc == LACE_DROP_SERVICE_NO_BACKEND)
		return nodeport_reject(skb, f, rc);
	if (!rc)
		rc = service_ct_create(f, now);
	if (rc)
		return lace_drop(skb, f, rc);
	return ct_forget_if_shot(f, nodeport_deliver(skb, f, cfg, d));
}

/* A packet encapsulated for this node's locator: decapsulated and walked in the networks its SID
 * names. A function of its own, as from_outside is. */
__lace_subprog int from_underlay(struct __sk_buff *skb, struct lace_flow *f, const struct lace_config *cfg)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct lace_ip6hdr *outer = data + ETH_HLEN;
	struct lace_delivery *d;
	struct lace_ct_entry *e;
	union lace_addr origin;
	__u32 src_net, dst_net;
	__u8 nexthdr;
	__u64 now;
	int rc, quoted_orig;

	if ((void *)(outer + 1) > data_end)
		return TC_ACT_OK;
	nexthdr = outer->nexthdr;
	if (nexthdr != IPPROTO_IPIP && nexthdr != IPPROTO_IPV6)
		return TC_ACT_OK;       /* addressed to the node itself (e.g. ping to a SID) */

	lace_copy16(f->sid, outer->daddr);
	lace_copy16(origin.b, outer->saddr);      /* a NodePort flow's origin SID (lib/nodeport.h) */
	f->src_network = src_net = sid_get_u32(f->sid, sid_offset(cfg) + 4);
	f->dst_network = dst_net = sid_get_u32(f->sid, sid_offset(cfg));
	rc = srv6_decap(skb, nexthdr);
	if (rc)
		return lace_drop(skb, f, rc);
	rc = parse_packet(skb, f);
	if (rc == LACE_PARSE_PASS)
		rc = LACE_DROP_UNSUPPORTED_L4;
	if (rc)
		return lace_drop(skb, f, rc);
	/* only another node sends to a SID: a packet anyone else addressed to one (from the outside,
	 * from anything else on the underlay) would be decapsulated into whatever networks its SID
	 * names, past every network's routes */
	if (!underlay_peer(origin.b))
		return lace_drop(skb, f, LACE_DROP_SPOOFED_SOURCE);
	if (dst_net == LACE_NETWORK_NONE || src_net == LACE_NETWORK_NONE)
		return lace_drop(skb, f, LACE_DROP_BAD_SID);

	now = f->now_ns = ct_now();
	if (f->icmp_error) {
		e = ct_related(f, src_net, dst_net, now, &quoted_orig);
		if (!e) {       /* from a service backend, about its flow (lib/service.h) */
			e = service_ct_related(f, src_net, now);
			quoted_orig = 1;
		}
		if (!e)
			return lace_drop(skb, f, LACE_DROP_CT_INVALID);
		if (quoted_orig && (e->flags & (LACE_CT_F_SERVICE | LACE_CT_F_DNAT))) {
			rc = service_icmp_error(skb, f, e);
			if (rc)
				return lace_drop(skb, f, rc);
		}
	} else {
		/* its flow, a reply of a service flow this node translated (lib/service.h), a reply */
		e = service_classify(f, src_net, dst_net, now);
		if (!e && dst_net != src_net)
			e = ct_reply(f, dst_net, now);
	}
	if (e) {
		if (f->ct_status == LACE_CT_STATUS_REPLY) {
			if (e->flags & (LACE_CT_F_SERVICE | LACE_CT_F_DNAT)) {
				rc = service_reply(skb, f, e, f->ct_network, now);
				if (rc)
					return lace_drop(skb, f, rc);
			}
			f->src_segment = e->dst_segment;
			f->dst_segment = e->src_segment;
		} else {
			f->src_segment = e->src_segment;
			f->dst_segment = e->dst_segment;
			if (src_net == LACE_NETWORK_OUTSIDE && nodeport_from_origin(e))
				lace_copy16_a8(e->nat_addr, &origin);   /* the frontend's node may change */
		}
	}

	if (dst_net == LACE_NETWORK_OUTSIDE) {
		/* only the replies of NodePort and LoadBalancer flows this node translated leave */
		if (!e || f->ct_status != LACE_CT_STATUS_REPLY || f->nat_kind != LACE_NAT_DNAT)
			return lace_drop(skb, f, LACE_DROP_CT_INVALID);
		return forward_outside(skb, f, cfg);
	}

	d = delivery_lookup(dst_net, f->family, f->daddr);
	if (!d)
		return lace_drop(skb, f, probe_no_delivery(f));   /* a probe address: PROBE_DENIED */
	f->delivery = d->kind;
	if (d->kind != LACE_DELIVERY_LOCAL && d->kind != LACE_DELIVERY_HOST)
		return lace_drop(skb, f, LACE_DROP_NOT_LOCAL);

	if (!e) {
		f->ct_status = LACE_CT_STATUS_NEW;
		f->src_segment = segment_resolve(src_net, f->family, f->saddr);
		f->dst_segment = segment_resolve(dst_net, f->family, f->daddr);
		rc = policy_ingress(f, f->src_segment);
		if (rc)
			return lace_drop(skb, f, rc);
		if (src_net == LACE_NETWORK_OUTSIDE)
			rc = nodeport_ct_create_remote(f, origin.b, now);
		else
			rc = ct_create(f, now);
		if (rc)
			return lace_drop(skb, f, rc);
	}

	if (d->kind == LACE_DELIVERY_HOST)
		return forward_host(skb, f, cfg);   /* a pod on another node to this node's host address */
	rc = deliver_to_pod(skb, f, cfg, d);
	return e ? rc : ct_forget_if_shot(f, rc);   /* a new flow's entry goes with its dropped packet */
}


static __always_inline int from_uplink(struct __sk_buff *skb, struct lace_flow *f)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct lace_ip6hdr *outer = data + ETH_HLEN;
	struct lace_config *cfg;
	__u32 zero = 0;

	cfg = bpf_map_lookup_elem(&lace_config, &zero);
	if (!cfg)
		return TC_ACT_OK;       /* not configured yet: nothing here is lace's */
	if ((void *)(eth + 1) > data_end)
		return TC_ACT_OK;
	if (eth->h_proto != bpf_htons(ETH_P_IPV6) || (void *)(outer + 1) > data_end ||
	    !in_locator(cfg, outer->daddr))
		return from_outside(skb, f, cfg);
	return from_underlay(skb, f, cfg);
}

SEC("tc")
int lace_from_uplink(struct __sk_buff *skb)
{
	struct lace_flow *f = flow_start(LACE_POINT_FROM_UPLINK);

	if (!f)
		return TC_ACT_SHOT;     /* unreachable (see flow_start); never pass unchecked */
	return from_uplink(skb, f);
}
