// SPDX-License-Identifier: GPL-2.0
/* Attach point: tc ingress on lace_net, the datapath end of the node's host device. The device is a
 * veth pair: lace_host carries the node's host addresses (one per family, from its own block of the
 * default network) and the node's routes send the default network's pod CIDRs out of it, from
 * those addresses; what leaves lace_host arrives here. So every packet the node's host namespace
 * sends to a pod passes this one program, which knows it came from the host: source network
 * default, source segment HOST.
 *
 * Walk: parse -> device check -> source validation -> conntrack (the host's own flows, replies of
 * pods' flows to the host, ICMP errors the node's stack sends pods; a kubelet probe's later packets
 * follow its frontend entry) -> probe targets -> routing in the default network -> segment ->
 * delivery: a local pod (its ingress policy for peer HOST, then into the pod) or a pod on another
 * node (SRv6 to that node, whose uplink checks the pod's ingress policy for peer REMOTE_NODE) ->
 * trace.
 *
 * Decisions:
 * - Source: only this node's host addresses (the segment map holds them as segment HOST, local) may
 *   send here; anything else is dropped as SPOOFED_SOURCE. The node's stack would route here any
 *   packet for a pod address, e.g. one arriving from the underlay; admitting it as HOST would let it
 *   past every pod's policy (HOST is allowed by default), and classifying it otherwise would make
 *   the node an unpoliced router into the pod network. Traffic from outside the node enters through
 *   the uplink program.
 * - Network: the host sends in the default network only. A destination the default network routes
 *   into another network (a Network route) has no route from the host (NO_ROUTE): pods of other
 *   networks stay out of the host's reach. The one exception is the kubelet's probe of such a pod,
 *   addressed to the pod's probe address (a default-network address): a new flow to a probe target
 *   of another network passes only from the kubelet socket that connected to it, translated to
 *   that pod alone; any other packet to a probe address is PROBE_DENIED (lib/probe.h).
 * - Policy: the host has no egress policy (no NetworkPolicy selects it); the destination pod's
 *   ingress policy is checked with peer HOST, which the agent allows for every pod by default (a
 *   kubelet must reach the pods of its node; lace/policy/resolve.py).
 * - Delivery: only pods. The host's own addresses are local to its stack and never come back
 *   through its device; a HOST or OUTSIDE delivery here is a NO_DELIVERY drop. */
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
#include "lib/forward.h"
#include "lib/service.h"
#include "lib/probe.h"

char LICENSE[] SEC("license") = "GPL";

/* The interface must be the host device the agent registered. */
static __always_inline int host_device_valid(struct __sk_buff *skb)
{
	struct lace_device_key k = { .ifindex = skb->ifindex };
	struct lace_device *dev = bpf_map_lookup_elem(&lace_devices, &k);

	return dev && dev->role == LACE_ROLE_HOST;
}

/* The packet must come from one of this node's host addresses. */
static __always_inline int host_source_valid(struct lace_flow *f)
{
	struct lace_segment_key k = { .network = LACE_NETWORK_DEFAULT, .family = f->family };
	struct lace_segment_value *v;

	lace_copy16(k.addr, f->saddr);
	v = bpf_map_lookup_elem(&lace_segment, &k);
	if (!v || v->segment != LACE_SEGMENT_HOST || !(v->flags & LACE_SEG_F_LOCAL))
		return LACE_DROP_SPOOFED_SOURCE;
	f->src_segment = LACE_SEGMENT_HOST;
	return 0;
}

static __always_inline int from_host(struct __sk_buff *skb, struct lace_flow *f)
{
	const __u32 net = LACE_NETWORK_DEFAULT;
	struct lace_delivery *d;
	struct lace_config *cfg;
	struct lace_ct_entry *e;
	struct lace_route *route;
	struct lace_probe *p;
	__u32 zero = 0;
	__u64 now;
	int rc, quoted_orig;

	rc = parse_packet(skb, f);
	if (rc == LACE_PARSE_PASS)
		return TC_ACT_OK;       /* neighbour discovery of lace_host itself */
	f->src_network = net;
	if (!host_device_valid(skb))
		return lace_drop(skb, f, LACE_DROP_UNKNOWN_DEVICE);
	if (rc)
		return lace_drop(skb, f, rc);
	rc = host_source_valid(f);
	if (rc)
		return lace_drop(skb, f, rc);
	cfg = bpf_map_lookup_elem(&lace_config, &zero);
	if (!cfg)
		return lace_drop(skb, f, LACE_DROP_NO_CONFIG);

	now = f->now_ns = ct_now();
	if (!f->icmp_error) {
		e = ct_classify(f, net, now);
		if (e) {
			if (f->ct_status == LACE_CT_STATUS_ESTABLISHED && (e->flags & LACE_CT_F_SERVICE)) {
				/* a probe admitted into another network: translated as its first packet was */
				rc = service_forward(skb, f, e, now);
				if (rc)
					return lace_drop(skb, f, rc);
			} else if (f->ct_status == LACE_CT_STATUS_ESTABLISHED) {
				f->dst_network = e->dst_network;
				f->dst_segment = e->dst_segment;
			} else {
				f->dst_network = net;
				f->dst_segment = e->src_segment;
			}
			return forward_to_pod(skb, f, cfg, 0, cfg->underlay_addr);
		}
		/* a probe address (it has a marker): only its probe targets, and only for the kubelet's
		 * socket, go on into the pod of another network; every other port is denied. Any other
		 * destination costs this one lookup: a default-network pod's entries have no marker and
		 * are for the record only, the walk goes on as for any host flow. */
		if (probe_marked(f->family, f->daddr)) {
			f->dst_network = net;   /* addressed inside the default network, until translated */
			p = probe_lookup(f->daddr, f->dport, f->proto, f->family);
			if (!p)
				return lace_drop(skb, f, LACE_DROP_PROBE_DENIED);
			if (p->network != net) {
				rc = probe_new_flow(skb, f, p, &d);
				if (!rc)
					rc = service_ct_create(f, now);
				if (rc)
					return lace_drop(skb, f, rc);
				return ct_forget_if_shot(f, forward_local(skb, f, cfg, d));
			}
		}
	}
	route = route_lookup(net, f->family, f->daddr);
	if (!route || route->dst_network != net)
		return lace_drop(skb, f, LACE_DROP_NO_ROUTE);
	f->dst_network = net;
	if (f->icmp_error) {
		/* an error about a pod's flow (to the host, or through the node to the outside) */
		e = ct_related(f, net, net, now, &quoted_orig);
		if (!e)
			return lace_drop(skb, f, LACE_DROP_CT_INVALID);
		return forward_to_pod(skb, f, cfg, 0, cfg->underlay_addr);
	}

	f->dst_segment = segment_resolve(net, f->family, f->daddr);
	d = delivery_lookup(net, f->family, f->daddr);
	if (!d)
		return lace_drop(skb, f, LACE_DROP_NO_DELIVERY);
	f->delivery = d->kind;     /* recorded in the conntrack entry */
	if (d->kind == LACE_DELIVERY_LOCAL) {
		rc = policy_ingress(f, LACE_SEGMENT_HOST);
		if (rc)
			return lace_drop(skb, f, rc);
	} else if (d->kind != LACE_DELIVERY_REMOTE) {
		return lace_drop(skb, f, LACE_DROP_NO_DELIVERY);
	}
	rc = ct_create(f, now);
	if (rc)
		return lace_drop(skb, f, rc);
	/* a new flow whose packet dies at this hop or finds no way over the underlay leaves no entry */
	return ct_forget_if_shot(f, forward_to_pod(skb, f, cfg, d, cfg->underlay_addr));
}

SEC("tc")
int lace_from_host(struct __sk_buff *skb)
{
	struct lace_flow *f = flow_start(LACE_POINT_FROM_HOST);

	if (!f)
		return TC_ACT_SHOT;     /* unreachable (see flow_start); never pass unchecked */
	return from_host(skb, f);
}
