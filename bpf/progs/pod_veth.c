// SPDX-License-Identifier: GPL-2.0
/* Attach point: tc ingress on the host side of each pod veth (traffic leaving the pod).
 * Walk: parse -> source validation -> conntrack -> service (a new flow to a frontend: backend
 * choice and DNAT, the backend's network instead of routing) -> routing -> segment -> egress
 * policy -> masquerade (a new flow to a masquerading route to the outside: a node port, SNAT) ->
 * delivery (local pod with its ingress policy / remote node over SRv6 / host / the outside) ->
 * trace. Established service and masqueraded flows are translated from their conntrack entries
 * (lib/service.h, lib/masquerade.h). A service flow to a backend outside (no pod) is masqueraded
 * after its DNAT, without a route (service_masq_*). */
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
#include "lib/forward.h"
#include "lib/service.h"
#include "lib/reject.h"
#include "lib/masquerade.h"
#include "lib/nodeport.h"
#include "lib/probe.h"

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

/* ARP and neighbour discovery from a pod go to the node's stack, which learns neighbours from them
 * (from an ARP request for one of its addresses, from the link-layer address option of a
 * solicitation or advertisement). The node needs none of it — the pod's gateway is a permanent
 * neighbour entry inside the pod and the node reaches its pods through delivery entries, never its
 * neighbour table — but it must not learn lies: a pod claiming another pod's address, or a router
 * on its link, would poison the node's table. So they must speak for the pod alone: its MAC (the
 * frame's and any link-layer address option's), its addresses (ARP sender, IPv6 source — its
 * address, its link-local address, or the unspecified address of duplicate address detection —,
 * an advertisement's target), and no router advertisement or redirect (only the node routes on a
 * pod's link). The link-local address is the one the kernel derives from the pod's MAC (EUI-64). */
struct lace_arp {
	__be16 htype;
	__be16 ptype;
	__u8   hlen;
	__u8   plen;
	__be16 op;
	__u8   sha[6];
	__u8   spa[4];
	__u8   tha[6];
	__u8   tpa[4];
};

#define LACE_ND_OPTS_MAX 8      /* Linux sends one or two (link-layer address, nonce) */

static __always_inline int pod_link_local(const __u8 *a, const struct lace_endpoint *ep)
{
	return a[0] == 0xfe && a[1] == 0x80 && !(a[2] | a[3] | a[4] | a[5] | a[6] | a[7]) &&
	       a[8] == (ep->mac[0] ^ 0x02) && a[9] == ep->mac[1] && a[10] == ep->mac[2] &&
	       a[11] == 0xff && a[12] == 0xfe && a[13] == ep->mac[3] && a[14] == ep->mac[4] &&
	       a[15] == ep->mac[5];
}

static __always_inline int pod_own_ipv6(const __u8 *a, const struct lace_endpoint *ep)
{
	return ((ep->flags & LACE_EP_F_IPV6) && lace_eq16(a, ep->ipv6)) || pod_link_local(a, ep);
}

static __always_inline int arp_valid(struct __sk_buff *skb, struct lace_flow *f, const struct lace_endpoint *ep)
{
	struct lace_arp arp;
	__u8 zero4[4] = {};

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &arp, sizeof(arp)) < 0)
		return LACE_DROP_PKT_TRUNCATED;
	if (arp.htype != bpf_htons(1) || arp.ptype != bpf_htons(ETH_P_IP) || arp.hlen != 6 || arp.plen != 4)
		return LACE_DROP_UNSUPPORTED_L3;
	/* a drop's trace shows the addresses it names: sender -> target (protocol 0) */
	f->family = LACE_FAMILY_IPV4;
	lace_zero16(f->saddr);
	lace_zero16(f->daddr);
	__builtin_memcpy(f->saddr, arp.spa, 4);
	__builtin_memcpy(f->daddr, arp.tpa, 4);
	if (!lace_eq6(arp.sha, ep->mac))
		return LACE_DROP_SPOOFED_MAC;
	if (lace_eq4(arp.spa, zero4))
		return 0;               /* an ARP probe (RFC 5227) claims nothing */
	if (!(ep->flags & LACE_EP_F_IPV4) || !lace_eq4(arp.spa, ep->ipv4))
		return LACE_DROP_SPOOFED_SOURCE;
	return 0;
}

static __always_inline int nd_valid(struct __sk_buff *skb, const struct lace_flow *f,
				    const struct lace_endpoint *ep)
{
	__u8 zero16[16] = {}, target[16], opt[8];
	__u32 off = f->l4_off;
	int i;

	if (f->icmp_type == 134 || f->icmp_type == 137)     /* router advertisement, redirect */
		return LACE_DROP_SPOOFED_SOURCE;
	if (!lace_eq16(f->saddr, zero16) && !pod_own_ipv6(f->saddr, ep))
		return LACE_DROP_SPOOFED_SOURCE;
	if (f->icmp_type == 136) {                          /* neighbour advertisement */
		if (bpf_skb_load_bytes(skb, off + 8, target, sizeof(target)) < 0)
			return LACE_DROP_PKT_TRUNCATED;
		if (!pod_own_ipv6(target, ep))
			return LACE_DROP_SPOOFED_SOURCE;
	}
	if (f->icmp_type == 133)                            /* router solicitation */
		off += 8;
	else if (f->icmp_type == 135 || f->icmp_type == 136)
		off += 24;
	else
		return 0;               /* multicast listener messages carry no link-layer address */
#pragma unroll
	for (i = 0; i < LACE_ND_OPTS_MAX; i++) {
		if (off >= skb->len)
			return 0;
		if (bpf_skb_load_bytes(skb, off, opt, sizeof(opt)) < 0)
			return LACE_DROP_PKT_TRUNCATED;
		if (!opt[1])
			return LACE_DROP_PKT_TRUNCATED;     /* a zero-length option: malformed */
		/* source / target link-layer address */
		if ((opt[0] == 1 || opt[0] == 2) && !lace_eq6(opt + 2, ep->mac))
			return LACE_DROP_SPOOFED_MAC;
		off += opt[1] * 8;
	}
	/* more options than a pod's kernel sends: one past the scan could be an address */
	return off >= skb->len ? 0 : LACE_DROP_UNSUPPORTED_L4;
}

/* ARP or neighbour discovery (parse_packet's PASS) from the endpoint: passed to the node's stack
 * only when it speaks for the endpoint alone (above). */
static __always_inline int control_valid(struct __sk_buff *skb, struct lace_flow *f,
					 const struct lace_endpoint *ep)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end)
		return LACE_DROP_PKT_TRUNCATED;
	if (!lace_eq6(eth->h_source, ep->mac))
		return LACE_DROP_SPOOFED_MAC;
	if (eth->h_proto == bpf_htons(ETH_P_ARP))
		return arp_valid(skb, f, ep);
	return nd_valid(skb, f, ep);
}

/* Hand the packet to its delivery target (d: its delivery entry, or NULL to look it up; expect:
 * the delivery kind its flow's conntrack entry recorded, LACE_DELIVERY_NONE when none applies). */
static __always_inline int deliver(struct __sk_buff *skb, struct lace_flow *f, const struct lace_config *cfg,
				   struct lace_delivery *d, __u8 expect)
{
	if (f->dst_network == LACE_NETWORK_OUTSIDE) {
		f->delivery = LACE_DELIVERY_OUTSIDE;
		/* translated to a node address (masquerade, a NodePort reply): past the node's stack */
		if (f->nat_kind)
			return forward_outside(skb, f, cfg);
		return forward_host(skb, f, cfg);
	}
	if (!d)
		d = delivery_lookup_expect(f->dst_network, f->family, f->daddr, expect);
	if (!d)
		return lace_drop(skb, f, probe_no_delivery(f));   /* a probe address: PROBE_DENIED */
	f->delivery = d->kind;
	switch (d->kind) {
	case LACE_DELIVERY_LOCAL:
		return forward_local(skb, f, cfg, d);
	case LACE_DELIVERY_REMOTE:
		return forward_remote(skb, f, cfg, d);
	case LACE_DELIVERY_HOST:
		return forward_host(skb, f, cfg);
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
	if (d && d->kind == LACE_DELIVERY_LOCAL)
		return policy_ingress(f, f->src_segment);
	return 0;
}

/* A new flow to the frontend svc (found under key): choose a backend and translate the packet to
 * it; then segment, egress policy and (local backend) ingress policy of the backend in its own
 * network, its delivery entry in *d. Returns 0 or a drop reason: SERVICE_NO_BACKEND when no
 * backend is active. The caller creates the entries (service_ct_create) and delivers. */
__lace_subprog int service_new_flow(struct __sk_buff *skb, struct lace_flow *f, struct lace_service_key *key,
				    const struct lace_service *svc, struct lace_delivery **d)
{
	int rc = service_dnat(skb, f, key, svc, f->src_network, 1);

	if (rc)
		return rc;
	f->dst_segment = segment_resolve(f->dst_network, f->family, f->daddr);
	return new_flow_policy(skb, f, d);
}

static __always_inline int from_pod(struct __sk_buff *skb, struct lace_flow *f)
{
	struct lace_veth_key vk = { .ifindex = skb->ifindex };
	struct lace_service_key skey;
	struct lace_endpoint *ep;
	struct lace_config *cfg;
	struct lace_delivery *d = 0;
	struct lace_service *svc;
	struct lace_ct_entry *e;
	struct lace_route *route;
	__u32 zero = 0, src_net;
	__u64 now;
	int rc, quoted_orig;

	rc = parse_packet(skb, f);
	LACE_BENCH_STAGE(1);            /* parsed */
	ep = bpf_map_lookup_elem(&lace_veth, &vk);
	if (rc == LACE_PARSE_PASS) {
		/* ARP and neighbour discovery, for the node's stack: only the endpoint's own. Before
		 * CNI ADD has written the endpoint, only the pod's kernel speaks (its duplicate address
		 * detection and router solicitation: nothing runs in the pod yet). */
		if (!ep)
			return TC_ACT_OK;
		f->src_network = ep->network;
		f->src_segment = ep->segment;
		rc = control_valid(skb, f, ep);
		return rc ? lace_drop(skb, f, rc) : TC_ACT_OK;
	}
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
	LACE_BENCH_STAGE(2);            /* endpoint found and the source validated, config */

	now = f->now_ns = ct_now();
	if (!f->icmp_error) {
		/* its own flow, a service flow's reply from its backend (lib/service.h), a reply */
		e = service_classify(f, src_net, LACE_NETWORK_NONE, now);
		LACE_BENCH_STAGE(3);    /* conntrack looked up (an entry found is advanced) */
		if (e) {
			if (f->ct_status == LACE_CT_STATUS_ESTABLISHED && (e->flags & LACE_CT_F_SERVICE)) {
				rc = service_forward(skb, f, e, now);
				if (!rc && (e->flags2 & LACE_CT_F2_MASQ))
					rc = service_masq_forward(skb, f, now);   /* its backend is outside */
			} else if (f->ct_status == LACE_CT_STATUS_ESTABLISHED && (e->flags & LACE_CT_F_SNAT)) {
				/* a service flow's pod entry met straight from its port: that flow's tuple
				 * (lib/masquerade.h) */
				rc = (e->flags2 & LACE_CT_F2_MASQ) ? LACE_DROP_TUPLE_IN_USE : masq_forward(skb, f, e, now);
			} else if (f->ct_status == LACE_CT_STATUS_ESTABLISHED) {
				f->dst_network = e->dst_network;
				f->dst_segment = e->dst_segment;
			} else {
				/* a reply: back into the network its flow is keyed under (src_net,
				 * or the one a reply alias names); a flow another node's NodePort sent
				 * here goes back to that node */
				if (f->ct_network == LACE_NETWORK_OUTSIDE && nodeport_from_origin(e))
					return nodeport_return(skb, f, cfg, e);
				if (e->flags & (LACE_CT_F_SERVICE | LACE_CT_F_DNAT))
					rc = service_reply(skb, f, e, f->ct_network, now);
				f->dst_network = f->ct_network;
				f->dst_segment = e->src_segment;
			}
			if (rc)
				return lace_drop(skb, f, rc);
			/* the flow's way out as its entry recorded it (a reply goes the other way) */
			return deliver(skb, f, cfg, 0, f->ct_status == LACE_CT_STATUS_ESTABLISHED ?
						       e->delivery : LACE_DELIVERY_NONE);
		}
		/* a frontend in the source network: its backend's network, not a route */
		svc = service_frontend(f, src_net, &skey);
		LACE_BENCH_STAGE(4);    /* service frontend looked up */
		if (svc) {
			rc = service_new_flow(skb, f, &skey, svc, &d);
			LACE_BENCH_STAGE(6);    /* backend chosen, DNAT, segment, policy, delivery */
			if (rc == LACE_DROP_SERVICE_NO_BACKEND || rc == LACE_DROP_TUPLE_IN_USE)
				return lace_reject(skb, f, rc);
			if (!rc)
				rc = ct_endpoint_admit(f, vk.ifindex, ep->ct_max);
			if (!rc)
				rc = service_ct_create(f, now);
			/* a backend outside: out of the node from its address, no pod network delivers it */
			if (!rc && (f->svc_flags & LACE_SVC_FLOW_MASQ))
				rc = service_masq_new_flow(skb, f, cfg, now);
			LACE_BENCH_STAGE(7);    /* conntrack entries created */
			if (rc)
				return lace_drop(skb, f, rc);
			return ct_endpoint_charge(f, vk.ifindex, ep->ct_max,
						  ct_forget_if_shot(f, deliver(skb, f, cfg, d, LACE_DELIVERY_NONE)));
		}
	}
	/* an ICMP error's cut for stage 3 (every other packet took it above): without it the bench
	 * object cut there verifies the error path alone, unpruned, past the verifier's limit */
	LACE_BENCH_STAGE(3);
	route = route_lookup(src_net, f->family, f->daddr);
	if (!route)
		return lace_drop(skb, f, LACE_DROP_NO_ROUTE);
	/* a frontend the full services map left out: named, not routed on as a plain address */
	if ((route->flags & LACE_ROUTE_F_SERVICE_MAP_FULL) && !f->icmp_error)
		return lace_drop(skb, f, LACE_DROP_MAP_FULL);
	f->dst_network = route->dst_network;
	LACE_BENCH_STAGE(5);            /* routed */
	if (f->icmp_error) {
		e = ct_related(f, src_net, f->dst_network, now, &quoted_orig);
		if (!e) {       /* from a service backend, about its flow (lib/service.h) */
			e = service_ct_related(f, src_net, now);
			quoted_orig = 1;
			/* back into the network the flow is keyed under, as a reply: the client of a
			 * service another network imports is not in the backend's network, where its
			 * address may be another pod's */
			if (e) {
				f->dst_network = f->ct_network;
				f->dst_segment = e->src_segment;
			}
		}
		if (!e)
			return lace_drop(skb, f, LACE_DROP_CT_INVALID);
		rc = 0;
		if (quoted_orig && (e->flags & (LACE_CT_F_SERVICE | LACE_CT_F_DNAT)))
			rc = service_icmp_error(skb, f, e);
		else if (!quoted_orig && (e->flags & LACE_CT_F_SNAT))
			rc = masq_icmp_error_out(skb, f, e);   /* about a reply of a masqueraded flow */
		if (rc)
			return lace_drop(skb, f, rc);
		return deliver(skb, f, cfg, 0, LACE_DELIVERY_NONE);
	}
	if (f->dst_network != src_net) {
		e = ct_reply(f, f->dst_network, now);
		if (e) {
			if (e->flags & LACE_CT_F_DNAT) {
				rc = service_reply(skb, f, e, f->ct_network, now);
				if (rc)
					return lace_drop(skb, f, rc);
			}
			f->dst_network = f->ct_network;
			f->dst_segment = e->src_segment;
			return deliver(skb, f, cfg, 0, LACE_DELIVERY_NONE);
		}
		f->ct_status = LACE_CT_STATUS_NEW;
	}

	f->dst_segment = segment_resolve(f->dst_network, f->family, f->daddr);
	rc = new_flow_policy(skb, f, &d);
	LACE_BENCH_STAGE(6);            /* segment, policy, delivery */
	if (rc)
		return lace_drop(skb, f, rc);
	/* a new flow whose packet its delivery then drops (it dies at this hop — every traceroute
	 * probe —, has no way out, no route in the underlay) leaves no conntrack entry behind, nor a
	 * masquerade port taken: ct_forget_if_shot */
	if (f->dst_network == LACE_NETWORK_OUTSIDE && (route->flags & LACE_ROUTE_F_MASQUERADE)) {
		/* the endpoint's conntrack limit, where a new flow's entries are about to be stored */
		rc = ct_endpoint_admit(f, vk.ifindex, ep->ct_max);
		if (!rc)
			rc = masq_new_flow(skb, f, cfg, now);
		if (rc)
			return lace_drop(skb, f, rc);
		return ct_endpoint_charge(f, vk.ifindex, ep->ct_max,
					  ct_forget_if_shot(f, deliver(skb, f, cfg, 0, LACE_DELIVERY_NONE)));
	}
	/* nowhere to deliver it: dropped before it leaves a conntrack entry behind */
	if (!d && f->dst_network != LACE_NETWORK_OUTSIDE)
		return lace_drop(skb, f, probe_no_delivery(f));
	rc = ct_endpoint_admit(f, vk.ifindex, ep->ct_max);
	if (!rc)
		rc = ct_create(f, now);
	LACE_BENCH_STAGE(7);            /* conntrack entry created */
	if (rc)
		return lace_drop(skb, f, rc);
	return ct_endpoint_charge(f, vk.ifindex, ep->ct_max,
				  ct_forget_if_shot(f, deliver(skb, f, cfg, d, LACE_DELIVERY_NONE)));
}

SEC("tc")
int lace_from_pod(struct __sk_buff *skb)
{
	struct lace_flow *f = flow_start(LACE_POINT_FROM_POD);

	if (!f)
		return TC_ACT_SHOT;     /* unreachable (see flow_start); never pass unchecked */
	return from_pod(skb, f);
}
