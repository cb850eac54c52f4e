/* Service load balancing on the packet path: a pod's flow to a frontend (VIP:port/proto in its
 * source network) is translated to a backend, and the backend's replies back to the frontend.
 *
 * A new flow (no conntrack entry) to a frontend gets a backend by lib/backend_select.h's rules
 * (ClientIP affinity, else the Maglev table, else an active slot) on service_flow_hash, its
 * destination is rewritten to the backend and the walk continues in the backend's network with
 * the translated packet: segment, egress policy of the source and ingress policy of the backend
 * see the backend's address and port (policy after DNAT, as in Kubernetes). Once it is forwarded,
 * the flow gets ONE conntrack entry (abi/conntrack.h), keyed by its frontend:
 *   (src network, client -> VIP:port), SERVICE, nat = backend:port, dst_network = the backend's
 *   network, rev_nat_id = service ID
 * Later packets to the VIP find it and go to its backend whatever the services map says by then
 * (a deleted, changed or terminating backend keeps its established flows). The entry sees both
 * directions: a reply comes from backend:port to the client, which names no frontend; after its
 * own tuple misses, service_classify looks the backend up in the revnat map
 * (abi/services.h: backend -> the frontends that send flows to it, written by the agent, which
 * keeps a frontend there while conntrack may still hold flows through it) and tries those
 * frontends' entries until the one holding this backend. The reply leaves with the frontend as
 * its source — in pod_veth.c for a local backend, in uplink.c after decapsulation for a backend
 * on another node. ICMP errors quoting a client -> backend packet are written back to the
 * frontend the same way (service_ct_related).
 *
 * Why one entry: a second one (the backend's tuple, as Cilium's CT_SERVICE + backend entries) is a
 * second insert into a large LRU table, another cold bucket and a preallocated LRU node: ~550 ns
 * of a new service flow (bench/datapath.py's stage table), and every established packet advanced
 * both. What it bought was a direct reply lookup; the revnat map gives the reply the same in one
 * small, warm hash lookup plus the frontend entry's (a reply alias for a backend in another
 * network is not needed either: the revnat entry names the network the flow is keyed under). The
 * rest of the path stays lean: one frontend lookup, one Maglev slot, one backend lookup, no
 * conntrack read-back, and the translation written in place (lib/nat.h).
 *
 * Hairpin (the backend is the client pod itself): the translated packet also gets the reserved
 * source LACE_HAIRPIN_* (abi/services.h); a reply addressed to it is the pod's own flow (its
 * frontend entry is keyed by the pod's address) and goes back to the pod's own address from the VIP.
 *
 * A backend in network OUTSIDE (no pod: the agent's rule in lace/services/model.py; the apiserver
 * behind default/kubernetes) has no delivery entry in any pod network: a pod's flow to it is
 * translated here and then masqueraded out of the node as a pod's flow straight to that address
 * would be, whatever the routes say (lib/masquerade.h, service_masq_*): the frontend entry comes
 * with a pod entry and a port reservation keyed by the translated flow (LACE_CT_F2_MASQ,
 * abi/conntrack.h). Its trace events are a service flow's (DNAT, the frontend in nat_*); the
 * masquerade port shows in the entries only.
 *
 * Kubelet probes into another network (lib/probe.h) are translated as a one-backend service but
 * keep two entries, frontend (SERVICE) and backend (DNAT), and a reply alias: the agent writes no
 * revnat entry for a probe target, and a probe's cost does not matter.
 *
 * Trace events of a translated packet carry nat_kind DNAT, and in both directions the event's
 * addresses are the backend side of the flow while nat_addr:nat_port is the frontend it stands
 * for: forward saddr:sport = client, daddr:dport = backend; reply saddr:sport = backend,
 * daddr:dport = client; nat_addr:nat_port = VIP:port. (A hairpin flow shows the client's own
 * address, not the reserved source.)
 *
 * Only TCP and UDP frontends are looked up: SCTP's CRC32c cannot be updated incrementally. */
#ifndef LACE_LIB_SERVICE_H
#define LACE_LIB_SERVICE_H

#include "lib/common.h"
#include "lib/maps.h"
#include "lib/flow.h"
#include "lib/conntrack.h"
#include "lib/nat.h"
#include "lib/backend_select.h"

/* lace_flow.svc_flags of a new service flow */
#define LACE_SVC_FLOW_HAIRPIN  0x1   /* its source is translated to the hairpin address */
#define LACE_SVC_FLOW_AFFINITY 0x2   /* a new ClientIP affinity choice, remembered once admitted */
#define LACE_SVC_FLOW_PROBE    0x4   /* a kubelet probe into another network (lib/probe.h): its
				      * entries are flagged LACE_CT_F_PROBE */
#define LACE_SVC_FLOW_REOPEN   0x8   /* a new flow on the tuple of a service flow's stale entry
				      * (closed, or collided: service_ct_reply): its backend's tuple
				      * is looked at before it is taken (service_direct_live) */
#define LACE_SVC_FLOW_BACKEND_ENTRY 0x10 /* its backend is flagged REPLY_ENTRY: the flow keeps a
				      * backend entry for its replies (LACE_CT_F2_BACKEND_ENTRY) */
#define LACE_SVC_FLOW_MASQ     0x20   /* its backend is in network OUTSIDE: masqueraded too
				      * (LACE_CT_F2_MASQ; lib/masquerade.h service_masq_new_flow) */

/* Fixed, never random per boot: a flow must hash the same on every node and after a restart, so
 * that a flow whose conntrack entry was lost lands on the same backend. */
#define LACE_FLOW_HASH_SEED 0x6c61636500000000ull

/* The hash a new flow picks its backend with; lace.datapath.maglev.flow_hash is the same
 * function in Python. Input: 40 bytes — source address, destination address (16 bytes each, IPv4
 * in the first 4), source and destination port (network order), the source network (u32, host
 * order) — read as five little-endian u64 words w0..w4 (the host order of every machine lace
 * runs on); then h = SEED ^ proto, h = fmix64(h ^ w) for each word, hash = low 32 bits of
 * h ^ (h >> 32). Five multiply-xorshift rounds: a few ns, and every input bit reaches every
 * output bit, so hash % LACE_MAGLEV_SIZE and hash % active_count are both evenly spread. */
static __always_inline __u32 service_flow_hash(const struct lace_flow *f, __u32 network)
{
	/* direct 8-byte loads: struct lace_flow keeps its addresses 8-byte aligned (a byte-wise
	 * copy would spill 32 bytes to the stack) */
	const __u64 *s = (const __u64 *)f->saddr, *d = (const __u64 *)f->daddr;
	/* word 4: sport and dport as they sit in the packet, then the network, read little-endian */
	__u64 ports = (__u64)f->sport | (__u64)f->dport << 16 | (__u64)network << 32;
	__u64 h = LACE_FLOW_HASH_SEED ^ f->proto;

	h = lb_mix64(h ^ s[0]);
	h = lb_mix64(h ^ s[1]);
	h = lb_mix64(h ^ d[0]);
	h = lb_mix64(h ^ d[1]);
	h = lb_mix64(h ^ ports);
	return (__u32)(h ^ (h >> 32));
}

/* The reserved hairpin source of family (abi/services.h), into an 8-byte aligned address. */
static __always_inline void service_hairpin_addr(__u8 family, __u8 *out)
{
	__u64 *w = (__u64 *)out;

	if (family == LACE_FAMILY_IPV4) {
		w[0] = bpf_htonl(LACE_HAIRPIN_IPV4);   /* the address in the first 4 bytes */
		w[1] = 0;
	} else {
		w[0] = bpf_cpu_to_be64(LACE_HAIRPIN_IPV6_HIGH);
		w[1] = bpf_cpu_to_be64(LACE_HAIRPIN_IPV6_LOW);
	}
}

/* The frontend f's destination is in network (filling key for the backend choice), or NULL. */
static __always_inline struct lace_service *service_frontend(const struct lace_flow *f, __u32 network,
							     struct lace_service_key *key)
{
	if (f->proto != IPPROTO_TCP && f->proto != IPPROTO_UDP)
		return 0;
	__builtin_memset(key, 0, sizeof(*key));
	key->network = network;
	lace_copy16(key->addr, f->daddr);
	key->port = f->dport;
	key->proto = f->proto;
	key->family = f->family;
	return lb_frontend(key);
}

/* The ClientIP affinity key of f's source for service_id. */
static __always_inline void service_client(struct lace_affinity_key *k, __u32 service_id,
					   const struct lace_flow *f)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->service_id = service_id;
	k->network = f->src_network;
	lace_copy16(k->addr, f->saddr);
	k->family = f->family;
}

/* Whether a flow from f's source to backend (in backend_network) comes back to its own pod. */
static __always_inline int service_is_hairpin(const struct lace_flow *f, const __u8 *backend,
					      __u32 backend_network)
{
	return backend_network == f->src_network && lace_eq16_a8(backend, f->saddr);
}

/* Translate the packet of f to backend:bport: its destination, and its source to the hairpin
 * address when it comes back to its own pod (LACE_SVC_FLOW_HAIRPIN set in f, seen = the source the
 * backend sees). f becomes the backend flow: daddr:dport = backend, nat_addr:nat_port = the
 * frontend. */
static __always_inline int service_translate(struct __sk_buff *skb, struct lace_flow *f, const __u8 *backend,
					     __be16 bport, __u32 backend_network, __u8 *seen)
{
	int rc;

	rc = nat_rewrite(skb, f, NAT_DST, f->daddr, backend, f->dport, bport);
	if (rc)
		return rc;
	if (service_is_hairpin(f, backend, backend_network)) {
		f->svc_flags |= LACE_SVC_FLOW_HAIRPIN;
		service_hairpin_addr(f->family, seen);
		rc = nat_rewrite_addr(skb, f->family, f->proto, f->l4_off, NAT_SRC, f->saddr, seen);
		if (rc)
			return rc;
	} else {
		lace_copy16_a8(seen, f->saddr);
	}
	lace_copy16_a8(f->nat_addr, f->daddr);
	f->nat_port = f->dport;
	f->nat_kind = LACE_NAT_DNAT;
	lace_copy16_a8(f->daddr, backend);
	f->dport = bport;
	f->dst_network = backend_network;
	return 0;
}

/* How many other active slots a new service flow tries when its backend's tuple is held
 * (service_free_backend): every backend of a service with up to five. */
#define LACE_SVC_TUPLE_TRIES 4

/* Whether a live connection straight from f's source port to backend b holds the tuple the new
 * service flow f would have there: client:sport -> b's address:port (its entry under f's source
 * network; a hairpin flow reaches its own pod from the reserved address: never held). Asked only
 * for a flow reopening a service flow's tuple (LACE_SVC_FLOW_REOPEN): a first SYN pays nothing,
 * and a collision shows itself in the backend's answer (service_ct_reply). */
static __always_inline int service_direct_live(const struct lace_flow *f, const struct lace_backend *b)
{
	union lace_ct_key k;
	struct lace_ct_entry *e;

	if (service_is_hairpin(f, b->addr, b->network))
		return 0;
	ct_key(&k, f->family, f->src_network, f->proto, f->saddr, b->addr, f->sport, b->port);
	e = ct_lookup(f->family, f->proto, &k);
	return e && ct_live(e, f->proto, f->now_ns);
}

/* Another active backend of frontend svc (found under key) for the new flow f, whose first choice
 * f->backend_id is held (service_direct_live): the first of the active slots after hash's whose
 * backend is neither that one nor held too, at most LACE_SVC_TUPLE_TRIES of them. Returns its ID;
 * 0 when none is. A global function: its loop is verified once, on its own, and the walk gets a
 * scalar back. */
__attribute__((noinline)) __u32 service_free_backend(const struct lace_flow *f, struct lace_service_key *key,
						     const struct lace_service *svc, __u32 hash)
{
	struct lace_service *slot;
	struct lace_backend *b;
	__u32 i, id, active;

	if (!f || !key || !svc)
		return 0;
	active = svc->active_count;
	for (i = 1; i <= LACE_SVC_TUPLE_TRIES && i <= active; i++) {
		key->slot = 1 + (hash + i) % active;
		slot = bpf_map_lookup_elem(&lace_services, key);
		key->slot = 0;
		id = slot ? slot->backend_id : 0;
		if (!id || id == f->backend_id)
			continue;
		b = lb_backend(id, key->family);
		if (b && !service_direct_live(f, b))
			return id;
	}
	return 0;
}

/* A new flow to the frontend svc (found under key), hashed as a flow of network hash_net: its
 * backend (ClientIP affinity, Maglev table, active slot) chosen and the packet translated to it.
 * With check_held (a pod's flow), a flow reopening a service flow's tuple (LACE_SVC_FLOW_REOPEN:
 * after a collision its SYN comes again) does not take a backend whose tuple a live connection
 * from the same source port holds (service_direct_live): another active one whose tuple is free
 * takes it, and the choice is then not remembered as the client's affinity. So does every flow to a
 * backend flagged REPLY_ENTRY or outside, whose backend entry or pod entry takes that tuple. Returns
 * 0 or a drop reason: SERVICE_NO_BACKEND when no backend is active, TUPLE_IN_USE when each one
 * tried is held. */
static __always_inline int service_dnat(struct __sk_buff *skb, struct lace_flow *f, struct lace_service_key *key,
					const struct lace_service *svc, __u32 hash_net, int check_held)
{
	struct lace_affinity_key client;
	struct lace_backend *b;
	union lace_addr backend, seen;
	__u32 hash, id;
	int pinned;

	f->service_id = svc->service_id;
	service_client(&client, f->service_id, f);
	hash = service_flow_hash(f, hash_net);
	b = lb_choose(key, svc, &client, hash, &f->backend_id, &pinned);
	if (!b)
		return LACE_DROP_SERVICE_NO_BACKEND;
	/* a backend entry (or an outside backend's pod entry) takes the backend's tuple: a live
	 * direct connection there keeps it */
	if (check_held && ((f->svc_flags & LACE_SVC_FLOW_REOPEN) || (b->flags & LACE_BACKEND_F_REPLY_ENTRY) ||
			   b->network == LACE_NETWORK_OUTSIDE) &&
	    service_direct_live(f, b)) {
		id = service_free_backend(f, key, svc, hash);
		b = lb_backend(id, f->family);
		if (!b)
			return LACE_DROP_TUPLE_IN_USE;
		f->backend_id = id;
		pinned = 1;
	}
	if (!pinned && (svc->flags & LACE_SVC_F_AFFINITY))
		f->svc_flags |= LACE_SVC_FLOW_AFFINITY;
	/* an outside backend's pod entry holds the tuple a backend entry would: it has none, and its
	 * replies find the frontend through the revnat entry under OUTSIDE */
	if (b->network == LACE_NETWORK_OUTSIDE)
		f->svc_flags |= LACE_SVC_FLOW_MASQ;
	else if (b->flags & LACE_BACKEND_F_REPLY_ENTRY)
		f->svc_flags |= LACE_SVC_FLOW_BACKEND_ENTRY;
	lace_copy16_a8(&backend, b->addr);
	return service_translate(skb, f, backend.b, b->port, b->network, seen.b);
}

/* The entry of a new service flow, once it is admitted and translated (f is the backend flow,
 * nat_addr:nat_port the frontend): keyed by the frontend, holding the backend; and its affinity
 * choice. A kubelet probe (LACE_SVC_FLOW_PROBE) and a flow to a backend flagged REPLY_ENTRY
 * (LACE_SVC_FLOW_BACKEND_ENTRY) also get the backend entry and its reply alias: their replies find
 * the frontend through them (the agent writes no revnat entry for a probe target, and the backend's
 * revnat entry does not name every frontend of the other). */
__lace_subprog int service_ct_create(const struct lace_flow *f, __u64 now)
{
	struct lace_ct_entry e = {};
	int rc;

	ct_init(&e, f, now);
	e.rev_nat_id = f->service_id;
	e.flags |= LACE_CT_F_SERVICE;
	if (f->svc_flags & LACE_SVC_FLOW_PROBE)
		e.flags |= LACE_CT_F_PROBE;
	if (f->svc_flags & (LACE_SVC_FLOW_PROBE | LACE_SVC_FLOW_BACKEND_ENTRY))
		e.flags2 |= LACE_CT_F2_BACKEND_ENTRY;
	if (f->svc_flags & LACE_SVC_FLOW_MASQ)
		e.flags2 |= LACE_CT_F2_MASQ;   /* its masquerade entries come next (service_masq_new_flow) */
	lace_copy16_a8(e.nat_addr, f->daddr);
	e.nat_port = f->dport;
	rc = ct_store(f, f->src_network, f->saddr, f->nat_addr, f->sport, f->nat_port, &e);
	if (rc)
		return rc;
	if (e.flags2 & LACE_CT_F2_BACKEND_ENTRY) {
		e.flags = (e.flags & ~LACE_CT_F_SERVICE) | LACE_CT_F_DNAT;
		e.flags2 = 0;
		lace_copy16_a8(e.nat_addr, f->nat_addr);
		e.nat_port = f->nat_port;
		rc = ct_store(f, f->src_network, f->saddr, f->daddr, f->sport, f->dport, &e);
		if (!rc && ct_needs_alias(f)) {
			ct_make_alias(&e, f, now);
			rc = ct_store(f, f->dst_network, f->saddr, f->daddr, f->sport, f->dport, &e);
		}
		if (rc)
			return rc;
	}
	/* remembered once every entry is stored: a flow to a REPLY_ENTRY backend pins the client
	 * like any other, a refused one pins nobody */
	if (f->svc_flags & LACE_SVC_FLOW_AFFINITY) {
		struct lace_affinity_key client;

		service_client(&client, f->service_id, f);
		lb_affinity_set(&client, f->backend_id);
	}
	return 0;
}

/* Take back the entries a new flow f wrote (ct_create, service_ct_create, masq_new_flow,
 * nodeport_ct_create_remote) when its packet is dropped after all, on its way out: a flow that
 * never got anywhere leaves no state behind (and takes no masquerade port). Which entries follows
 * from f as its creation left it: translated by a service (DNAT) — the frontend entry (a probe or
 * a flow that keeps a backend entry: also the backend entry and the reply alias); masqueraded
 * (SNAT) — the pod entry and the port reservation (masq_key: OUTSIDE, node address:port -> remote,
 * an echo's identifier as both ports); plain — the entry and the reply alias. A service flow masqueraded to a backend outside
 * (LACE_SVC_FLOW_MASQ: DNAT in f) — the frontend entry, and the pod entry (keyed by the
 * translated flow) with the reservation it names, when they are there and flagged its. A ClientIP
 * affinity choice stays: it is a preference for the client's next flow, not state of this one. */
__lace_subprog int ct_forget_new(const struct lace_flow *f)
{
	union lace_ct_key k, rk;
	struct lace_ct_entry *pe;
	__be16 dport;

	if (f->nat_kind == LACE_NAT_SNAT) {
		ct_forget(f, f->src_network, f->saddr, f->daddr, f->sport, f->dport);
		dport = f->proto == IPPROTO_TCP || f->proto == IPPROTO_UDP ? f->dport : f->nat_port;
		ct_forget(f, LACE_NETWORK_OUTSIDE, f->nat_addr, f->daddr, f->nat_port, dport);
		return 0;
	}
	if (f->nat_kind == LACE_NAT_DNAT) {
		ct_forget(f, f->src_network, f->saddr, f->nat_addr, f->sport, f->nat_port);
		if (f->svc_flags & LACE_SVC_FLOW_MASQ) {
			/* the port is in the pod entry alone (f keeps the frontend) */
			ct_key(&k, f->family, f->src_network, f->proto, f->saddr, f->daddr, f->sport, f->dport);
			pe = ct_lookup(f->family, f->proto, &k);
			if (pe && (pe->flags & LACE_CT_F_SNAT) && (pe->flags2 & LACE_CT_F2_MASQ)) {
				ct_key(&rk, f->family, LACE_NETWORK_OUTSIDE, f->proto, pe->nat_addr, f->daddr,
				       pe->nat_port, f->dport);
				ct_delete(f->family, f->proto, &rk);
				ct_delete(f->family, f->proto, &k);
			}
			return 0;
		}
		if (!(f->svc_flags & (LACE_SVC_FLOW_PROBE | LACE_SVC_FLOW_BACKEND_ENTRY)))
			return 0;
	}
	ct_forget(f, f->src_network, f->saddr, f->daddr, f->sport, f->dport);
	if (ct_needs_alias(f))
		ct_forget(f, f->dst_network, f->saddr, f->daddr, f->sport, f->dport);
	return 0;
}

/* The verdict of a new flow's delivery, its entries taken back when it dropped the packet
 * (ct_forget_new). */
static __always_inline int ct_forget_if_shot(const struct lace_flow *f, int verdict)
{
	if (verdict == TC_ACT_SHOT)
		ct_forget_new(f);
	return verdict;
}

/* A probe's frontend entry follows its backend entry, which sees both directions of the flow. */
static __always_inline void service_follow(struct lace_ct_entry *fe, const struct lace_ct_entry *be)
{
	fe->state = be->state;
	fe->expires_ns = be->expires_ns;
	fe->flags |= be->flags & LACE_CT_F_SEEN_REPLY;
}

/* An established packet to a frontend, found by its frontend entry fe (already advanced): send it
 * to fe's backend. Sets the flow's destination network and segment; returns 0 or a drop reason.
 * A flow that keeps a backend entry (a probe, a backend flagged REPLY_ENTRY) also advances it
 * (rebuilt from fe if it was evicted). */
__lace_subprog int service_forward(struct __sk_buff *skb, struct lace_flow *f, struct lace_ct_entry *fe,
				   __u64 now)
{
	union lace_ct_key k;
	struct lace_ct_entry *be;
	union lace_addr backend, seen;
	int rc;

	lace_copy16_a8(&backend, fe->nat_addr);
	rc = service_translate(skb, f, backend.b, fe->nat_port, fe->dst_network, seen.b);
	if (rc)
		return rc;
	f->dst_segment = fe->dst_segment;
	if (!(fe->flags2 & LACE_CT_F2_BACKEND_ENTRY) && !(fe->flags & LACE_CT_F_PROBE))
		return 0;
	ct_key(&k, f->family, f->src_network, f->proto, seen.b, f->daddr, f->sport, f->dport);
	be = ct_lookup(f->family, f->proto, &k);
	if (be) {
		ct_advance(be, f, 0, now);
		service_follow(fe, be);
		return 0;
	}
	/* the backend entry was evicted: rebuild it from the frontend entry (copied map to map, then
	 * turned into a backend entry in place: no 100-byte copy on the stack) */
	if (ct_insert(f->family, f->proto, &k, fe, BPF_ANY) < 0)
		return LACE_DROP_CT_FULL;
	be = ct_lookup(f->family, f->proto, &k);
	if (be) {
		be->flags = (be->flags & ~LACE_CT_F_SERVICE) | LACE_CT_F_DNAT;
		be->flags2 = 0;
		lace_copy16_a8(be->nat_addr, f->nat_addr);
		be->nat_port = f->nat_port;
	}
	return 0;
}

/* The two ends of a service flow as a packet through its backend shows them: for a reply
 * (related = 0: f's source is the backend, its destination the client, or the hairpin address
 * when the client is the backend pod itself) or an ICMP error (related = 1: the quoted packet's
 * source is the client, its destination the backend). Returns the protocol. */
static __always_inline __u8 service_ends(const struct lace_flow *f, int related, const __u8 **client,
					 __be16 *cport, const __u8 **backend, __be16 *bport)
{
	union lace_addr hairpin;

	if (related) {
		*client = f->inner_saddr;
		*cport = f->inner_sport;
		*backend = f->inner_daddr;
		*bport = f->inner_dport;
		return f->inner_proto;
	}
	service_hairpin_addr(f->family, hairpin.b);
	*client = lace_eq16_a8(f->daddr, &hairpin) ? f->saddr : f->daddr;
	*cport = f->dport;
	*backend = f->saddr;
	*bport = f->sport;
	return f->proto;
}

/* Which frontend a service flow through its backend was sent to (service_ends: a reply or an
 * ICMP error): the backend's revnat entry, under backend_net, names the frontends to try
 * (abi/services.h); the one whose entry of client:port -> frontend has this backend in
 * nat_addr:nat_port and dst_network is the flow's. only_net, unless NONE, admits the frontends keyed under that
 * network only. Returns 0 with f's nat_addr:nat_port the frontend, nat_kind DNAT and ct_network
 * the network the entry is keyed under; -1 when none is.
 * A global function: the verifier checks its loop once, on its own, instead of in every path
 * that reaches a call (that cost each program hundreds of thousands of instructions to verify). */
__attribute__((noinline)) int service_revnat_find(struct lace_flow *f, __u32 backend_net, __u32 only_net,
						  int related)
{
	struct lace_revnat_key rk;
	struct lace_revnat *r;
	struct lace_ct_entry *e;
	union lace_ct_key k;
	const __u8 *client, *backend;
	__be16 cport, bport;
	__u8 family, proto;
	__u32 i, n;

	if (!f)
		return -1;
	/* one of two known values from here on: the verifier follows one family through the whole
	 * loop (f->family read again in each round, or a value only known "not IPv4", would be
	 * unknown again: every round two ways more) */
	family = f->family == LACE_FAMILY_IPV4 ? LACE_FAMILY_IPV4 : LACE_FAMILY_IPV6;
	proto = service_ends(f, related, &client, &cport, &backend, &bport);
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return -1;
	__builtin_memset(&rk, 0, sizeof(rk));
	rk.network = backend_net;
	lace_copy16(rk.addr, backend);
	rk.port = bport;
	rk.proto = proto;
	rk.family = family;
	r = bpf_map_lookup_elem(&lace_revnat, &rk);
	if (!r)
		return -1;
	n = r->count;
	if (n > LACE_REVNAT_FRONTENDS)
		n = LACE_REVNAT_FRONTENDS;
	for (i = 0; i < n; i++) {
		const struct lace_revnat_frontend *fr = &r->frontends[i];

		if (only_net != LACE_NETWORK_NONE && fr->network != only_net)
			continue;
		ct_key(&k, family, fr->network, proto, client, fr->addr, cport, fr->port);
		e = ct_lookup(family, proto, &k);
		/* the backend in its network: isolated networks may reuse an address and port */
		if (!e || !(e->flags & LACE_CT_F_SERVICE) || e->dst_network != backend_net || e->nat_port != bport ||
		    !lace_eq16(e->nat_addr, backend))
			continue;
		/* a flow that keeps a backend entry is found by it (its reversed tuple, after this):
		 * that entry follows both directions */
		if (e->flags2 & LACE_CT_F2_BACKEND_ENTRY)
			return -1;
		f->ct_network = fr->network;
		lace_copy16_a8(f->nat_addr, fr->addr);
		f->nat_port = fr->port;
		f->nat_kind = LACE_NAT_DNAT;
		return 0;
	}
	return -1;
}

/* The frontend entry of a service flow through its backend (service_revnat_find), or NULL. */
__lace_subprog struct lace_ct_entry *service_lookup(struct lace_flow *f, __u32 backend_net, __u32 only_net,
						    int related)
{
	union lace_ct_key k;
	const __u8 *client, *backend;
	__be16 cport, bport;
	__u8 proto;

	if (service_revnat_find(f, backend_net, only_net, related))
		return 0;
	/* found in there already: this lookup hits a warm bucket */
	proto = service_ends(f, related, &client, &cport, &backend, &bport);
	ct_key(&k, f->family, f->ct_network, proto, client, f->nat_addr, cport, f->nat_port);
	return ct_lookup(f->family, proto, &k);
}

/* A reply of a service flow, from its backend (f's source, in backend_net) to its client: its
 * frontend entry, advanced as a reply (service_lookup; only_net as there). NULL: not a reply of a
 * service flow. Tried after the ordinary reply lookup missed: a service flow's reply has no entry
 * of its own. */
static __always_inline struct lace_ct_entry *service_ct_reply(struct lace_flow *f, __u32 backend_net,
							      __u32 only_net, __u64 now)
{
	struct lace_ct_entry *e, *plain;

	if (!ct_may_be_reply(f))
		return 0;
	e = service_lookup(f, backend_net, only_net, 0);
	if (e && !ct_usable(e, f, 1, now)) {
		f->nat_kind = LACE_NAT_NONE;
		e = 0;
	}
	if (e && f->proto == IPPROTO_TCP && ((e->state >= LACE_CT_FIN_WAIT && e->state <= LACE_CT_CLOSED) ||
					      (e->state == LACE_CT_SYN_SENT && !(f->tcp_flags & (TCP_F_SYN | TCP_F_RST))))) {
		/* A service flow may share its backend tuple with a connection straight to the
		 * backend: the client's kernel keeps only its own tuples apart, and client:p -> VIP
		 * differs from client:p -> backend. The backend holds one connection per tuple, and
		 * their replies are the same packets; when the plain flow has an entry, they are its
		 * replies in two cases. A port the service flow just closed may open a connection
		 * straight to the backend. And a new service flow may take the port of a live direct
		 * connection to the backend it was sent to: its SYN meets that connection there, which
		 * answers it with an ACK (RFC 5961's challenge ACK) and goes on sending, never a SYN-ACK
		 * — an answer without SYN to a service flow that has sent only its SYN is no answer of
		 * its. Taken for its own, the live connection's packets would reach the client from the
		 * VIP, and the client's reset would end it. The service flow has collided: it is closed
		 * here, so its SYN, sent again, is a new flow that looks for a backend whose tuple is
		 * free (LACE_SVC_FLOW_REOPEN). Nothing on the way of other packets: a state compare. */
		plain = ct_reply(f, backend_net, now);
		if (!plain && only_net != LACE_NETWORK_NONE && only_net != backend_net)
			plain = ct_reply(f, only_net, now);
		if (plain) {
			if (e->state == LACE_CT_SYN_SENT) {
				e->state = LACE_CT_CLOSED;
				e->expires_ns = now + ct_timeout_ns(LACE_CT_CLOSED);
			}
			f->nat_kind = LACE_NAT_NONE;
			return plain;
		}
	}
	if (e) {
		f->ct_status = LACE_CT_STATUS_REPLY;
		ct_advance(e, f, 1, now);
	}
	return e;
}

/* ct_classify for a packet that may be a service flow's reply from its backend (f's source, in
 * src_network): its original direction, then the revnat map (service_ct_reply; only_net as
 * there), then the ordinary reversed tuple. The revnat lookup comes before the reversed one: a
 * service flow's reply would otherwise pay a reversed lookup that always misses, a cold bucket of
 * a large table; a packet whose source is no backend port pays one small, warm lookup. */
static __always_inline struct lace_ct_entry *service_classify(struct lace_flow *f, __u32 src_network,
							      __u32 only_net, __u64 now)
{
	struct lace_ct_entry *e;
	int stale;

	e = ct_forward(f, src_network, now, &stale);
	if (stale == 2)
		f->svc_flags |= LACE_SVC_FLOW_REOPEN;
	if (e || stale)
		return e;
	e = service_ct_reply(f, src_network, only_net, now);
	if (!e)
		e = ct_reply(f, src_network, now);
	if (!e)
		f->ct_status = LACE_CT_STATUS_NEW;
	return e;
}

/* An ICMP error sent from backend_net (by a service backend, or a hop on its way) that quotes a
 * client -> backend packet of a service flow: the flow's frontend entry (service_lookup), the
 * error RELATED to it. Tried after ct_related missed. */
static __always_inline struct lace_ct_entry *service_ct_related(struct lace_flow *f, __u32 backend_net,
								__u64 now)
{
	struct lace_ct_entry *e = service_lookup(f, backend_net, LACE_NETWORK_NONE, 1);

	if (e && e->expires_ns < now) {
		f->nat_kind = LACE_NAT_NONE;
		e = 0;
	}
	if (e) {
		f->ct_status = LACE_CT_STATUS_RELATED;
		e->last_seen_ns = now;
	}
	return e;
}

/* A reply found by entry e under network: the frontend written back as its source (and the
 * client's own address as the destination of a hairpin flow). e is either a frontend entry that
 * service_ct_reply found (f's nat_addr:nat_port: the frontend; e already advanced) or a probe's
 * backend entry (DNAT; its frontend entry follows it). Other entries: nothing to do. Returns 0 or
 * a drop reason. */
__lace_subprog int service_reply(struct __sk_buff *skb, struct lace_flow *f, struct lace_ct_entry *e,
				 __u32 network, __u64 now)
{
	union lace_ct_key k;
	struct lace_ct_entry *fe;
	union lace_addr hairpin;
	int rc;

	if (e->flags & LACE_CT_F_DNAT) {
		lace_copy16_a8(f->nat_addr, e->nat_addr);
		f->nat_port = e->nat_port;
	} else if (!(e->flags & LACE_CT_F_SERVICE) || f->nat_kind != LACE_NAT_DNAT) {
		return 0;
	}
	service_hairpin_addr(f->family, hairpin.b);
	if (lace_eq16_a8(f->daddr, &hairpin)) {
		rc = nat_rewrite_addr(skb, f->family, f->proto, f->l4_off, NAT_DST, hairpin.b, f->saddr);
		if (rc)
			return rc;
		lace_copy16_a8(f->daddr, f->saddr);
	}
	rc = nat_rewrite(skb, f, NAT_SRC, f->saddr, f->nat_addr, f->sport, f->nat_port);
	if (rc)
		return rc;
	f->nat_kind = LACE_NAT_DNAT;
	if (!(e->flags & LACE_CT_F_DNAT))
		return 0;
	ct_key(&k, f->family, network, f->proto, f->daddr, f->nat_addr, f->dport, f->nat_port);
	fe = ct_lookup(f->family, f->proto, &k);
	if (fe && (fe->flags & LACE_CT_F_SERVICE)) {
		service_follow(fe, e);
		fe->last_seen_ns = now;
		fe->packets_rev++;
		fe->bytes_rev += f->l3_len;
	}
	return 0;
}

/* An ICMP error related to a service flow through a quoted client -> backend packet (sent by the
 * backend or a hop on its way; e: the frontend entry service_ct_related found, f's nat_addr:nat_port
 * the frontend, or a probe's backend entry): the quoted destination becomes the frontend again,
 * and so does the error's source when the backend itself sent it — the client's socket knows only
 * the VIP (nat_rewrite_quoted). Returns 0 or a drop reason. */
__lace_subprog int service_icmp_error(struct __sk_buff *skb, struct lace_flow *f, const struct lace_ct_entry *e)
{
	union lace_addr vip;
	__be16 port;
	int rc;

	if (e->flags & LACE_CT_F_DNAT) {
		lace_copy16_a8(&vip, e->nat_addr);
		port = e->nat_port;
	} else if ((e->flags & LACE_CT_F_SERVICE) && f->nat_kind == LACE_NAT_DNAT) {
		lace_copy16_a8(&vip, f->nat_addr);
		port = f->nat_port;
	} else {
		return 0;
	}
	rc = nat_rewrite_quoted(skb, f, NAT_DST, f->inner_daddr, vip.b, f->inner_dport, port);
	if (rc)
		return rc;
	if (lace_eq16_a8(f->saddr, f->inner_daddr)) {
		rc = nat_rewrite_addr(skb, f->family, f->proto, f->l4_off, NAT_SRC, f->saddr, vip.b);
		if (rc)
			return rc;
	}
	lace_copy16_a8(f->nat_addr, &vip);
	f->nat_port = port;
	f->nat_kind = LACE_NAT_DNAT;
	return 0;
}

#endif
