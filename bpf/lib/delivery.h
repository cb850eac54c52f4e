/* Delivery: where a destination in a network goes, and handing the packet to a local pod.
 *
 * Every packet, established flows included, looks its destination up. The LPM trie (lace_delivery)
 * costs what its depth costs: ~25 ns with a test bed's dozen entries, ~85 with the 1,200 a node of
 * a large cluster holds around the address (its block's pods, the other nodes' blocks of the same
 * network: bench/datapath.py --delivery-fill). Most destinations are full-length entries (a local
 * pod, a host address), so the agent writes each of those a second time into an exact-match hash
 * (lace_dlv_exact, same value), probed first: ~25 ns on a 2-core VM however full the map is (the
 * kernel's jhash, bucket walk and key compare). The trie is asked on a miss (a remote node's
 * block), and at once for an established flow whose conntrack entry recorded a remote delivery
 * (delivery_lookup_expect), which spares it the hash's miss.
 *
 * Correctness does not depend on the hash: it holds only entries the trie has, with the same
 * value, and a full-length entry is the longest match the trie could give, so a hit is the trie's
 * answer. The agent keeps the two in step in one reconcile pass: it writes the trie before the
 * hash and deletes from the hash before the trie, so the hash never holds an entry the trie lacks
 * (lace/agent/desired.py OWNED_MAPS).
 *
 * Caching the target in the conntrack entry was evaluated and not done: lace_ct_entry has no room
 * (an ABI change to 112 B and a migration of every pinned CT table), and a trusted cache is unsafe:
 * the agent flushes on CNI DEL only the entries keyed by the pod's own network, so a flow routed in
 * from another network would keep an ifindex that a new veth may reuse (delivery into the wrong pod,
 * past policy), and a cached remote SID would blackhole a fixed-port UDP flow to a pod that moved
 * nodes for as long as it keeps sending. The hash has neither problem: the agent writes it with the
 * trie. The kind the entry already records is only a hint of where to look first. */
#ifndef LACE_LIB_DELIVERY_H
#define LACE_LIB_DELIVERY_H

#include "lib/maps.h"
#include "lib/flow.h"
#include "lib/drop.h"
#include "lib/parse.h"

/* Where daddr in network goes: the exact-match hash's full-length entry, else the trie's longest
 * match. expect is what the caller knows of the destination already (an established flow's
 * conntrack entry records its delivery kind): LACE_DELIVERY_REMOTE goes to the trie at once, where
 * a remote node's block is, sparing the hash's miss (~25 ns). An expectation gone stale (the
 * address now a local pod's) costs the hash's saving, never the answer: the trie has every entry. */
static __always_inline struct lace_delivery *delivery_lookup_expect(__u32 network, __u8 family,
								    const __u8 *daddr, __u8 expect)
{
	struct lace_delivery_key k = {
		.prefixlen = LACE_DELIVERY_PREFIX_BASE + (family == LACE_FAMILY_IPV4 ? 32 : 128),
		.network = network,
		.family = family,
	};
	struct lace_delivery *d;

	lace_copy16(k.addr, daddr);
	if (expect != LACE_DELIVERY_REMOTE) {
		/* the exact key is this key past its prefixlen (abi/delivery.h): a hit is the
		 * full-length entry the trie would find */
		d = bpf_map_lookup_elem(&lace_dlv_exact, &k.network);
		if (d)
			return d;
	}
	return bpf_map_lookup_elem(&lace_delivery, &k);
}

static __always_inline struct lace_delivery *delivery_lookup(__u32 network, __u8 family,
							     const __u8 *daddr)
{
	return delivery_lookup_expect(network, family, daddr, LACE_DELIVERY_NONE);
}

/* Routed hop: decrement the IPv4 TTL or the IPv6 hop limit, by direct packet writes. The IPv4
 * header checksum is updated incrementally (RFC 1624, as the kernel's ip_decrease_ttl does): the
 * TTL is the high byte of its 16-bit word, so that word drops by 0x0100 and the one's-complement
 * checksum rises by as much, with the end-around carry. */
static __always_inline int ttl_decrement(struct __sk_buff *skb, __u8 family)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;

	if (family == LACE_FAMILY_IPV4) {
		struct lace_iphdr *ip = data + ETH_HLEN;
		__u32 check;

		if ((void *)(ip + 1) > data_end)
			return LACE_DROP_PKT_TRUNCATED;
		if (ip->ttl <= 1)
			return LACE_DROP_TTL_EXCEEDED;
		ip->ttl -= 1;
		check = ip->check + (__u32)bpf_htons(0x0100);
		ip->check = (__u16)(check + (check >= 0xffff));
		return 0;
	}
	struct lace_ip6hdr *ip6 = data + ETH_HLEN;

	if ((void *)(ip6 + 1) > data_end)
		return LACE_DROP_PKT_TRUNCATED;
	if (ip6->hop_limit <= 1)
		return LACE_DROP_TTL_EXCEEDED;
	ip6->hop_limit -= 1;
	return 0;
}

/* Write the frame's destination and source MAC in place; < 0 if the header is not linear. */
static __always_inline int set_macs(struct __sk_buff *skb, const __u8 *dst, const __u8 *src)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u8 *eth = data;

	if ((void *)(eth + 12) > data_end)
		return -1;
	__builtin_memcpy(eth, dst, 6);
	__builtin_memcpy(eth + 6, src, 6);
	return 0;
}

/* Rewrite the MACs for the pod (gateway -> pod) and redirect into its namespace. */
static __always_inline int deliver_local(struct __sk_buff *skb, struct lace_flow *f,
					 const struct lace_delivery *d)
{
	if (set_macs(skb, d->mac, d->host_mac) < 0)
		return -1;
	f->delivery_ifindex = d->ifindex;
	return bpf_redirect_peer(d->ifindex, 0);
}

/* The last step of every local delivery: count and trace the forward, then hand it over. */
static __always_inline int deliver_to_pod(struct __sk_buff *skb, struct lace_flow *f,
					  const struct lace_config *cfg, const struct lace_delivery *d)
{
	int rc;

	f->delivery_ifindex = d->ifindex;
	lace_forwarded(skb, f, cfg->flags & LACE_CFG_F_TRACE_ALL);
	rc = deliver_local(skb, f, d);
	if (rc < 0)
		return lace_drop(skb, f, LACE_DROP_REDIRECT_FAILED);
	return rc;
}

#endif
