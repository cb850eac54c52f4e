// SPDX-License-Identifier: GPL-2.0
/* Attach point: tc ingress on the host side of each pod veth (traffic leaving the pod).
 * Walk: parse -> source validation -> conntrack -> routing -> segment -> egress policy ->
 * delivery (local pod with its ingress policy / remote node over SRv6 / host) -> trace. */
#include "lib/common.h"
#include "lib/maps.h"
#include "lib/flow.h"
#include "lib/parse.h"
#include "lib/drop.h"
#include "lib/routing.h"
#include "lib/segment.h"
#include "lib/policy.h"
#include "lib/conntrack.h"
#include "lib/delivery.h"
#include "lib/srv6.h"

char LICENSE[] SEC("license") = "GPL";

/* The packet must come from the endpoint's own MAC and addresses. */
static __always_inline int source_valid(struct __sk_buff *skb, const struct lace_flow *f,
					const struct lace_endpoint *ep)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u8 *src_mac = data + 6;

	if ((void *)(src_mac + 6) > data_end)
		return LACE_DROP_PKT_TRUNCATED;
	if (!lace_eq6(src_mac, ep->mac))
		return LACE_DROP_SPOOFED_MAC;
	if (f->family == LACE_FAMILY_IPV4) {
		if (!(ep->flags & LACE_EP_F_IPV4) || !lace_eq4(f->saddr, ep->ipv4))
			return LACE_DROP_SPOOFED_SOURCE;
	} else {
		if (!(ep->flags & LACE_EP_F_IPV6) || !lace_eq16(f->saddr, ep->ipv6))
			return LACE_DROP_SPOOFED_SOURCE;
	}
	return 0;
}

/* Hand the packet to its delivery target. */
static __always_inline int deliver(struct __sk_buff *skb, struct lace_flow *f,
				   const struct lace_config *cfg, struct lace_delivery *d)
{
	int reason, rc;

	if (f->dst_network == LACE_NETWORK_OUTSIDE) {
		f->delivery = LACE_DELIVERY_OUTSIDE;
		lace_forwarded(skb, f, cfg->flags & LACE_CFG_F_TRACE_ALL);
		return TC_ACT_OK;
	}
	if (!d)
		d = delivery_lookup(f->dst_network, f->family, f->daddr);
	if (!d)
		return lace_drop(skb, f, LACE_DROP_NO_DELIVERY);
	f->delivery = d->kind;
	switch (d->kind) {
	case LACE_DELIVERY_LOCAL:
		reason = ttl_decrement(skb, f->family);
		if (reason)
			return lace_drop(skb, f, reason);
		return deliver_to_pod(skb, f, cfg, d);
	case LACE_DELIVERY_REMOTE:
		reason = ttl_decrement(skb, f->family);
		if (reason)
			return lace_drop(skb, f, reason);
		reason = srv6_encap(skb, f, cfg, d);
		if (reason)
			return lace_drop(skb, f, reason);
		lace_forwarded(skb, f, cfg->flags & LACE_CFG_F_TRACE_ALL);
		rc = srv6_forward(skb, f, cfg, &reason);
		if (rc < 0)
			return lace_drop(skb, f, reason);
		return rc;
	case LACE_DELIVERY_HOST:
		lace_forwarded(skb, f, cfg->flags & LACE_CFG_F_TRACE_ALL);
		return TC_ACT_OK;
	default:
		return lace_drop(skb, f, LACE_DROP_NO_DELIVERY);
	}
}

/* Policy for a new flow: the source's egress, and the destination's ingress when it is a local
 * pod (a remote destination's node checks ingress after decapsulation). */
static __always_inline int new_flow_policy(struct __sk_buff *skb, struct lace_flow *f,
					   struct lace_delivery **out)
{
	struct lace_delivery *d;
	int pv;

	pv = policy_check(f, f->src_segment, f->dst_segment, LACE_DIR_EGRESS);
	if (pv == LACE_POLICY_DENY)
		return LACE_DROP_POLICY_EGRESS;
	if (pv == LACE_POLICY_AUDIT)
		f->audit = LACE_DROP_POLICY_EGRESS;
	if (f->dst_network == LACE_NETWORK_OUTSIDE) {
		f->delivery = LACE_DELIVERY_OUTSIDE;
		return 0;
	}
	d = delivery_lookup(f->dst_network, f->family, f->daddr);
	*out = d;
	if (d)
		f->delivery = d->kind;     /* recorded in the conntrack entry */
	if (d && d->kind == LACE_DELIVERY_LOCAL) {
		pv = policy_check(f, f->dst_segment, f->src_segment, LACE_DIR_INGRESS);
		if (pv == LACE_POLICY_DENY)
			return LACE_DROP_POLICY_INGRESS;
		if (pv == LACE_POLICY_AUDIT && !f->audit)
			f->audit = LACE_DROP_POLICY_INGRESS;
	}
	return 0;
}

static __always_inline int from_pod(struct __sk_buff *skb, struct lace_flow *f)
{
	struct lace_veth_key vk = { .ifindex = skb->ifindex };
	struct lace_endpoint *ep;
	struct lace_config *cfg;
	struct lace_delivery *d = 0;
	struct lace_ct_entry *e;
	struct lace_route *route;
	__u32 zero = 0, src_net;
	__u64 now;
	int rc;

	rc = parse_packet(skb, f);
	if (rc == LACE_PARSE_PASS)
		return TC_ACT_OK;
	ep = bpf_map_lookup_elem(&lace_veth, &vk);
	if (!ep)
		return lace_drop(skb, f, LACE_DROP_UNKNOWN_ENDPOINT);
	f->src_network = src_net = ep->network;
	f->src_segment = ep->segment;
	if (rc)
		return lace_drop(skb, f, rc);
	rc = source_valid(skb, f, ep);
	if (rc)
		return lace_drop(skb, f, rc);
	cfg = bpf_map_lookup_elem(&lace_config, &zero);
	if (!cfg)
		return lace_drop(skb, f, LACE_DROP_NO_CONFIG);

	now = ct_now();
	if (!f->icmp_error) {
		e = ct_classify(f, src_net, now);
		if (e) {
			if (f->ct_status == LACE_CT_STATUS_ESTABLISHED) {
				f->dst_network = e->dst_network;
				f->dst_segment = e->dst_segment;
			} else {
				f->dst_network = src_net;
				f->dst_segment = e->src_segment;
			}
			return deliver(skb, f, cfg, 0);
		}
	}
	route = route_lookup(src_net, f->family, f->daddr);
	if (!route)
		return lace_drop(skb, f, LACE_DROP_NO_ROUTE);
	f->dst_network = route->dst_network;
	if (f->icmp_error) {
		e = ct_related(f, src_net, f->dst_network, now);
		if (!e)
			return lace_drop(skb, f, LACE_DROP_CT_INVALID);
		return deliver(skb, f, cfg, 0);
	}
	if (f->dst_network != src_net) {
		e = ct_reply(f, f->dst_network, now);
		if (e) {
			f->dst_segment = e->src_segment;
			return deliver(skb, f, cfg, 0);
		}
		f->ct_status = LACE_CT_STATUS_NEW;
	}

	f->dst_segment = segment_resolve(f->dst_network, f->family, f->daddr);
	rc = new_flow_policy(skb, f, &d);
	if (rc)
		return lace_drop(skb, f, rc);
	rc = ct_create(f, now);
	if (rc)
		return lace_drop(skb, f, rc);
	return deliver(skb, f, cfg, d);
}

SEC("tc")
int lace_from_pod(struct __sk_buff *skb)
{
	struct lace_flow f = {};

	f.point = LACE_POINT_FROM_POD;
	return from_pod(skb, &f);
}
