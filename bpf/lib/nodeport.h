/* NodePort and LoadBalancer frontends: flows from the outside to a node address at a node port, or
 * to a load-balancer address at its port, balanced to a service backend on the uplink before the
 * node's stack sees them.
 *
 * The frontends are keyed in source network OUTSIDE (abi/services.h, NODEPORT / LOADBALANCER); the
 * backend is chosen, the packet translated and the flow's one conntrack entry made as for a pod's
 * flow to a ClusterIP (lib/service.h), keyed under OUTSIDE:
 *   (OUTSIDE, client -> frontend:port), SERVICE, nat = backend:port
 * and the agent's revnat entry of each backend names the frontend under OUTSIDE. The client's
 * address is kept whatever the traffic policy: the backend sees the real client.
 *
 * - A backend on this node: delivered into its pod after its ingress policy (peer: the client's
 *   segment in OUTSIDE, WORLD unless a prefix says otherwise). The pod's replies find the entry
 *   through the revnat map without a route to the client, get the frontend back as their source
 *   and leave through the node's FIB (lib/forward.h forward_outside).
 * - A backend on another node (externalTrafficPolicy Cluster): sent there over SRv6 with source
 *   network OUTSIDE in the SID argument, from this node's *origin SID* — its locator with function
 *   OUTSIDE — instead of its underlay address. The backend's node checks the pod's ingress policy,
 *   and its entry for the flow (keyed under OUTSIDE, no NAT flag, with its reply alias) keeps that
 *   origin SID in nat_addr; the pod's replies are sent back to it encapsulated, with the pod's
 *   network as the argument. This node decapsulates them (function OUTSIDE), finds the flow's
 *   entry (revnat), writes the frontend back as the source and sends them out through its FIB. So the
 *   node that holds the translation sees both directions, and no SNAT is needed.
 * - No active backend (externalTrafficPolicy Local on a node without a local endpoint, or no
 *   endpoint at all): refused as a pod's flow to a ClusterIP is — a TCP RST or an ICMP port
 *   unreachable from the frontend, sent back out of the uplink — and counted as
 *   SERVICE_NO_BACKEND.
 *
 * ICMP errors about NodePort flows are not translated (those from the outside go to the stack, an
 * error a backend sends about one is dropped where it has no route). */
#ifndef LACE_LIB_NODEPORT_H
#define LACE_LIB_NODEPORT_H

#include "lib/common.h"
#include "lib/maps.h"
#include "lib/flow.h"
#include "lib/drop.h"
#include "lib/segment.h"
#include "lib/policy.h"
#include "lib/conntrack.h"
#include "lib/delivery.h"
#include "lib/srv6.h"
#include "lib/forward.h"
#include "lib/service.h"
#include "lib/reject.h"
#include "lib/masquerade.h"

/* This node's origin SID (8-byte aligned out): its locator with function OUTSIDE; the argument is
 * left 0 (the sender of a reply sets it to its source network). */
static __always_inline void nodeport_origin(const struct lace_config *cfg, __u8 *out)
{
	lace_copy16(out, cfg->locator);
	sid_set_u32(out, sid_offset(cfg), LACE_NETWORK_OUTSIDE);
}

/* Whether an entry keyed under OUTSIDE is a backend node's entry of a flow another node's frontend
 * sent here: no translation of its own, nat_addr the origin SID. */
static __always_inline int nodeport_from_origin(const struct lace_ct_entry *e)
{
	return !(e->flags & LACE_CT_NAT_FLAGS);
}

/* A translated packet of a NodePort or LoadBalancer flow to its backend (d: the delivery entry, or
 * NULL to look it up): into the pod, or over SRv6 to the backend's node from this node's origin SID
 * (see above). */
static __always_inline int nodeport_deliver(struct __sk_buff *skb, struct lace_flow *f,
					    const struct lace_config *cfg, struct lace_delivery *d)
{
	union lace_addr origin;

	nodeport_origin(cfg, origin.b);
	return forward_to_pod(skb, f, cfg, d, origin.b);
}

/* Refuse a flow from the outside for reason, answering its sender back out of the uplink when its
 * protocol has an answer (lib/reject.h). */
static __always_inline int nodeport_reject(struct __sk_buff *skb, struct lace_flow *f, __u16 reason)
{
	lace_drop(skb, f, reason);
	if (reject_answer(skb, f) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

/* A new flow from the outside to the frontend svc (found under key): choose a backend, translate
 * the packet to it, and (a local backend) check its ingress policy; its delivery entry in *d. The
 * caller makes the flow's entries (service_ct_create) and delivers it. Returns 0 or a drop reason
 * (SERVICE_NO_BACKEND: no active backend). */
__lace_subprog int nodeport_new_flow(struct __sk_buff *skb, struct lace_flow *f, struct lace_service_key *key,
				     const struct lace_service *svc, struct lace_delivery **d)
{
	struct lace_delivery *dl;
	int rc;

	f->src_segment = segment_resolve(LACE_NETWORK_OUTSIDE, f->family, f->saddr);
	rc = service_dnat(skb, f, key, svc, LACE_NETWORK_OUTSIDE, 0);
	if (rc)
		return rc;
	f->dst_segment = segment_resolve(f->dst_network, f->family, f->daddr);
	dl = delivery_lookup(f->dst_network, f->family, f->daddr);
	if (!dl)
		return LACE_DROP_NO_DELIVERY;
	f->delivery = dl->kind;
	if (dl->kind == LACE_DELIVERY_LOCAL) {
		rc = policy_ingress(f, f->src_segment);
		if (rc)
			return rc;
	} else if (dl->kind != LACE_DELIVERY_REMOTE) {
		return LACE_DROP_NO_DELIVERY;   /* backends are pods */
	}
	*d = dl;
	return 0;
}

/* The backend node's entry of a new flow another node's frontend sent here (source network
 * OUTSIDE, admitted by the pod's ingress policy): as ct_create, with the sender's origin SID in
 * nat_addr, and the reply alias in the pod's network. Returns 0 or a drop reason. */
__lace_subprog int nodeport_ct_create_remote(const struct lace_flow *f, const __u8 *origin, __u64 now)
{
	struct lace_ct_entry e = {};

	ct_init(&e, f, now);
	lace_copy16(e.nat_addr, origin);
	return ct_record(f, &e, now);
}

/* A backend pod's reply of a flow another node's frontend sent here (its entry e, found through
 * the reply alias): back over SRv6 to that node's origin SID, with the pod's network as the
 * argument, where the translation is undone. */
__lace_subprog int nodeport_return(struct __sk_buff *skb, struct lace_flow *f, const struct lace_config *cfg,
				   const struct lace_ct_entry *e)
{
	union lace_addr origin;

	lace_copy16_a8(&origin, e->nat_addr);
	f->dst_network = LACE_NETWORK_OUTSIDE;
	if (!(origin.w[0] | origin.w[1]))
		return lace_drop(skb, f, LACE_DROP_CT_INVALID);   /* an entry without an origin */
	f->node_id = 0;
	return forward_srv6(skb, f, cfg, origin.b, cfg->underlay_addr);
}

#endif
