/* Kubelet probes into pods of isolated networks, and nothing else crossing.
 *
 * The problem. The kubelet probes every pod from the node's host namespace. A pod of the default
 * network is reached at its own address through the host device like any host connection. A pod
 * of another network is not: its address means nothing in the host (the host routes the default
 * network only, host.c drops the rest as NO_ROUTE), and it may be the address of a pod of a third
 * network on the same node. Yet the probe must arrive, and the way it arrives must not become a
 * way into the network for anything else.
 *
 * The design (the agent writes the maps; abi/probes.h):
 * - Probe address. The agent gives such a pod a *probe address* per family: an address of the
 *   default network from this node's block, unique in the cluster. The node's routes send it
 *   through lace_host like any pod address, so the kubelet's connect to probe address:port leaves
 *   the host as an ordinary default-network flow and meets lace_from_host. Two pods with the same
 *   address and port in two networks have two probe addresses: the probe address alone says which
 *   pod is meant, no address of an isolated network is ever interpreted in the host.
 * - probes. (probe address, port, proto) -> the pod's network, endpoint, veth and its own address
 *   and port, one entry per port its probes name; plus a marker (probe address, 0, 0) flagged
 *   LACE_PROBE_F_ADDRESS: every other port and protocol of the address is denied. Default-network
 *   pods get entries at their own address (network DEFAULT) for the record only: nothing here
 *   treats them differently from any host flow.
 * - probe-cookie. The host cgroup's connect hook (probe_connect) records, for a socket of the
 *   kubelet's cgroup (config kubelet_cgroup; 0 admits any process of the host cgroup) connecting
 *   to a probe entry, socket cookie -> the destination it asked for. The destination is not
 *   rewritten: the packet carries the probe address to the host device. The socket-release hook
 *   removes the entry (probe_release); the agent collects what a lost release leaves behind.
 * - Host device (probe_new_flow). A new flow to a probe entry of another network passes only if
 *   the packet's own socket (skb->sk: the sending socket's reference survives the veth crossing
 *   inside the host namespace, so its cookie is readable at lace_net's ingress) has a cookie entry
 *   for exactly that destination. Then it is translated like a one-backend service (lib/service.h:
 *   frontend = probe address:port, backend = the pod's own address:port in its network), but with
 *   two entries where a service flow has one: frontend (SERVICE) and backend (DNAT) entries under
 *   the default network, flagged PROBE, and a reply alias under the pod's network (no revnat entry
 *   names a probe target). The pod's ingress policy applies with peer HOST, and the packet
 *   is handed to that pod's veth only (its delivery entry must be local and name the veth the
 *   probe entry names). Later packets follow the frontend entry (service_forward); the pod's
 *   replies find the backend entry through the alias in pod_veth.c and leave with the probe
 *   address as their source, delivered to the host's stack.
 * - Everything else to a probe address is PROBE_DENIED: a host packet without the cookie (another
 *   process, a raw socket, a forwarded packet cannot even pass host.c's source check), another
 *   port or protocol (the marker), a packet from a pod or from another node (the marker, checked
 *   where such a packet would otherwise be dropped as NO_DELIVERY: no cost for other traffic).
 *
 * Why it is safe: nothing enters an isolated network from the host except a connection the kernel
 * attributes to a socket the kubelet's cgroup opened, to an address and port the agent derived
 * from the pod's own probe spec, landing on that pod's veth after its ingress policy. The cookie
 * is the kernel's identity of the sending socket, not a field of the packet, so no packet can
 * claim it; and a socket can only have a cookie entry for the destination it connected to. The pod
 * keeps its single interface and no route to the default network; no address of an isolated
 * network is routed in the host; the reply path exists only as the conntrack entries of an
 * admitted probe. */
#ifndef LACE_LIB_PROBE_H
#define LACE_LIB_PROBE_H

#include "lib/common.h"
#include "lib/maps.h"
#include "lib/flow.h"
#include "lib/drop.h"
#include "lib/segment.h"
#include "lib/policy.h"
#include "lib/conntrack.h"
#include "lib/delivery.h"
#include "lib/forward.h"
#include "lib/service.h"
#include "lib/sock_lb.h"

/* The probes entry of (addr, port, proto) of family, or NULL. port 0 and proto 0: the marker. */
static __always_inline struct lace_probe *probe_lookup(const __u8 *addr, __be16 port, __u8 proto, __u8 family)
{
	struct lace_probe_key k = {};

	lace_copy16(k.addr, addr);
	k.port = port;
	k.proto = proto;
	k.family = family;
	return bpf_map_lookup_elem(&lace_probes, &k);
}

/* Whether addr of family is a probe address of this node (it has a marker). */
static __always_inline int probe_marked(__u8 family, const __u8 *addr)
{
	struct lace_probe *p = probe_lookup(addr, 0, 0, family);

	return p && (p->flags & LACE_PROBE_F_ADDRESS);
}

/* The drop reason for a packet whose destination has no delivery entry in f->dst_network: a probe
 * address of this node is PROBE_DENIED (a pod, another node or the host on a path that is not a
 * probe), anything else NO_DELIVERY. Probe addresses are default-network addresses that only the
 * host device translates, so they have no delivery entry: checking here costs nothing on any path
 * that delivers. */
static __always_inline int probe_no_delivery(const struct lace_flow *f)
{
	if (f->dst_network == LACE_NETWORK_DEFAULT && probe_marked(f->family, f->daddr))
		return LACE_DROP_PROBE_DENIED;
	return LACE_DROP_NO_DELIVERY;
}

/* -- the host cgroup's socket hooks (sock.c) -------------------------------------------------- */

/* connect: a socket of the kubelet's cgroup connecting to a probe target of another network gets
 * its cookie entry, and its destination stays the probe address (the host device translates it).
 * Returns 1 when it recorded one (the caller must not translate the destination as a service), 0
 * for every other connect: another process, another destination, a default-network pod's entry
 * (probed as any host flow, no cookie needed). */
static __always_inline int probe_connect(struct bpf_sock_addr *ctx, int v6)
{
	struct lace_probe_cookie_key ck = {};
	struct lace_probe_cookie c = {};
	struct lace_config *cfg;
	struct lace_probe *p;
	struct sock_lb_addr dst;
	__u32 proto = ctx->protocol, zero = 0;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 0;
	sock_lb_read(ctx, v6, &dst);
	p = probe_lookup(dst.addr, dst.port, proto, dst.family);
	if (!p || (p->flags & LACE_PROBE_F_ADDRESS) || p->network == LACE_NETWORK_DEFAULT)
		return 0;
	cfg = bpf_map_lookup_elem(&lace_config, &zero);
	if (!cfg)
		return 0;
	/* the task connecting, not the socket's cgroup: a socket handed to another process is that
	 * process's connect */
	if (cfg->kubelet_cgroup && bpf_get_current_cgroup_id() != cfg->kubelet_cgroup)
		return 0;
	ck.cookie = bpf_get_socket_cookie(ctx);
	lace_copy16(c.orig_addr, dst.addr);
	c.orig_port = dst.port;
	c.family = dst.family;
	c.proto = proto;
	c.network = p->network;
	c.created_ns = bpf_ktime_get_ns();
	bpf_map_update_elem(&lace_probe_ck, &ck, &c, BPF_ANY);
	return 1;
}

/* sock_release: the socket is closed, its cookie never sends again. A TCP connection that lingers
 * after close (FIN_WAIT, TIME_WAIT) has its conntrack entries: the cookie is needed for a new
 * flow only. */
static __always_inline void probe_release(struct bpf_sock *ctx)
{
	struct lace_probe_cookie_key ck = {};

	if (ctx->protocol != IPPROTO_TCP && ctx->protocol != IPPROTO_UDP)
		return;
	ck.cookie = bpf_get_socket_cookie(ctx);
	bpf_map_delete_elem(&lace_probe_ck, &ck);
}

/* -- the host device (host.c) ----------------------------------------------------------------- */

/* Whether the packet's own socket connected to f's destination, a probe target of network p. A
 * packet without a socket (cookie 0: forwarded, or built by BPF_PROG_TEST_RUN) never is. */
static __always_inline int probe_cookie_valid(struct __sk_buff *skb, const struct lace_flow *f,
					      const struct lace_probe *p)
{
	struct lace_probe_cookie_key ck = {};
	struct lace_probe_cookie *c;

	ck.cookie = bpf_get_socket_cookie(skb);
	if (!ck.cookie)
		return 0;
	c = bpf_map_lookup_elem(&lace_probe_ck, &ck);
	return c && c->family == f->family && c->proto == f->proto && c->orig_port == f->dport &&
	       c->network == p->network && lace_eq16(c->orig_addr, f->daddr);
}

/* A new host flow (no conntrack entry) to the probe target p of another network: the cookie
 * check, the pod's delivery entry (*d), translation to the pod's own address as a one-backend
 * service and its ingress policy for peer HOST. Returns 0 or a drop reason: PROBE_DENIED for every
 * refusal but the pod's own policy (POLICY_INGRESS, as for any host flow). The caller creates the
 * entries (service_ct_create, which flags them PROBE) and hands the packet to d: the frames of this
 * function and of service_ct_create are never on the stack together. */
__lace_subprog int probe_new_flow(struct __sk_buff *skb, struct lace_flow *f, const struct lace_probe *p,
				  struct lace_delivery **d)
{
	union lace_addr target, seen;
	struct lace_delivery *dl;
	__be16 port = p->target_port;
	__u32 network = p->network;
	int rc;

	if (!probe_cookie_valid(skb, f, p))
		return LACE_DROP_PROBE_DENIED;
	lace_copy16(target.b, p->target_addr);   /* unaligned in the entry */
	/* the pod itself, on the veth the probe names: its address reused by another pod of the
	 * network, or the pod gone to another node, is not the probed pod */
	dl = delivery_lookup(network, f->family, target.b);
	if (!dl || dl->kind != LACE_DELIVERY_LOCAL || dl->ifindex != p->ifindex)
		return LACE_DROP_PROBE_DENIED;
	*d = dl;
	f->service_id = 0;
	f->svc_flags |= LACE_SVC_FLOW_PROBE;
	rc = service_translate(skb, f, target.b, port, network, seen.b);
	if (rc)
		return rc;
	f->dst_segment = segment_resolve(network, f->family, f->daddr);
	f->delivery = dl->kind;     /* recorded in the conntrack entries */
	return policy_ingress(f, LACE_SEGMENT_HOST);
}

#endif
