/* Forwarding to a delivery target, the last step of every walk that delivers: a routed hop into a
 * local pod, a routed hop over SRv6 to another node, out to the outside through the node's FIB, or
 * into this node's own stack. Each step
 * counts and traces its forward, or drops with the reason, so a program only picks the step. */
#ifndef LACE_LIB_FORWARD_H
#define LACE_LIB_FORWARD_H

#include "lib/common.h"
#include "lib/maps.h"
#include "lib/flow.h"
#include "lib/drop.h"
#include "lib/delivery.h"
#include "lib/srv6.h"

/* A routed hop into a pod on this node: TTL, then MACs and the redirect into its namespace. */
static __always_inline int forward_local(struct __sk_buff *skb, struct lace_flow *f,
					 const struct lace_config *cfg, const struct lace_delivery *d)
{
	int reason = ttl_decrement(skb, f->family);

	if (reason)
		return lace_drop(skb, f, reason);
	return deliver_to_pod(skb, f, cfg, d);
}

/* A routed hop over SRv6: TTL, the outer IPv6 header from src to sid (f->node_id names the node it
 * belongs to, 0 when none is known), the underlay's fib lookup and the redirect to the uplink. The
 * forward is traced once encapsulated (the event carries the SID), before the fib lookup that may
 * still fail. A function of its own: the outer header and the fib lookup's parameters need a frame
 * apart from the walk's, which the verifier counts together with the deepest function the walk
 * calls (512 bytes in all). */
__lace_subprog int forward_srv6(struct __sk_buff *skb, struct lace_flow *f, const struct lace_config *cfg,
				const __u8 *sid, const __u8 *src)
{
	int reason, rc;

	reason = ttl_decrement(skb, f->family);
	if (reason)
		return lace_drop(skb, f, reason);
	f->delivery = LACE_DELIVERY_REMOTE;
	reason = srv6_encap_to(skb, f, cfg, sid, f->node_id, src);
	if (reason)
		return lace_drop(skb, f, reason);
	lace_forwarded(skb, f, cfg->flags & LACE_CFG_F_TRACE_ALL);
	rc = srv6_forward(skb, f, cfg, &reason);
	if (rc < 0)
		return lace_drop(skb, f, reason);
	return rc;
}

/* A routed hop to another node: over SRv6 to d's locator SID from this node's underlay address. */
static __always_inline int forward_remote(struct __sk_buff *skb, struct lace_flow *f,
					  const struct lace_config *cfg, const struct lace_delivery *d)
{
	f->node_id = d->node_id;
	return forward_srv6(skb, f, cfg, d->sid, cfg->underlay_addr);
}

/* A packet for a pod (d: its delivery entry, or NULL to look it up): into it when it is on this
 * node, else over SRv6 to its node with src as the outer source; anything else is no delivery. */
static __always_inline int forward_to_pod(struct __sk_buff *skb, struct lace_flow *f,
					  const struct lace_config *cfg, struct lace_delivery *d, const __u8 *src)
{
	if (!d)
		d = delivery_lookup(f->dst_network, f->family, f->daddr);
	if (!d)
		return lace_drop(skb, f, LACE_DROP_NO_DELIVERY);
	f->delivery = d->kind;
	if (d->kind == LACE_DELIVERY_LOCAL)
		return forward_local(skb, f, cfg, d);
	if (d->kind == LACE_DELIVERY_REMOTE) {
		f->node_id = d->node_id;
		return forward_srv6(skb, f, cfg, d->sid, src);
	}
	return lace_drop(skb, f, LACE_DROP_NO_DELIVERY);
}

/* Out to the outside through the node's routing table, bypassing its stack: a pod flow the node
 * masquerades, a reply of a NodePort or LoadBalancer flow. These packets carry one of the node's
 * own addresses (or a load-balancer address) as their source, which the stack would drop as a martian arriving on a pod veth
 * or the uplink; so the node's FIB is asked for the next hop (bpf_fib_lookup, as a forwarded packet
 * from the uplink) and the packet is redirected out of the interface it names, with its MACs, or
 * through the kernel's neighbour resolution when the next hop has no neighbour entry yet. A routed
 * hop: the TTL is decremented. A function of its own for the lookup's 64-byte parameters. */
__lace_subprog int forward_outside(struct __sk_buff *skb, struct lace_flow *f, const struct lace_config *cfg)
{
	struct bpf_fib_lookup p = {};
	int reason;
	long rc;

	reason = ttl_decrement(skb, f->family);
	if (reason)
		return lace_drop(skb, f, reason);
	p.ifindex = cfg->uplink_ifindex;
	p.l4_protocol = f->proto;
	if (f->family == LACE_FAMILY_IPV4) {
		p.family = AF_INET;
		__builtin_memcpy(&p.ipv4_dst, f->daddr, 4);
	} else {
		p.family = AF_INET6;
		__builtin_memcpy(p.ipv6_dst, f->daddr, 16);
	}
	f->delivery = LACE_DELIVERY_OUTSIDE;
	rc = bpf_fib_lookup(skb, &p, sizeof(p), 0);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS) {
		if (set_macs(skb, p.dmac, p.smac) < 0)
			return lace_drop(skb, f, LACE_DROP_PKT_TRUNCATED);
		lace_forwarded(skb, f, cfg->flags & LACE_CFG_F_TRACE_ALL);
		return bpf_redirect(p.ifindex, 0);
	}
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		lace_forwarded(skb, f, cfg->flags & LACE_CFG_F_TRACE_ALL);
		return bpf_redirect_neigh(p.ifindex, 0, 0, 0);
	}
	return lace_drop(skb, f, LACE_DROP_FIB_LOOKUP_FAILED);
}

/* Into this node's stack: a host address of this node (delivery kind HOST), or the outside. The
 * packet goes up unchanged on the interface it arrived on. */
static __always_inline int forward_host(struct __sk_buff *skb, struct lace_flow *f,
					const struct lace_config *cfg)
{
	lace_forwarded(skb, f, cfg->flags & LACE_CFG_F_TRACE_ALL);
	return TC_ACT_OK;
}

#endif
