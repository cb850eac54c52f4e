/* SRv6 between nodes: encapsulate in an outer IPv6 header addressed to the remote locator SID
 * (function = destination network, argument = source network), route it on the underlay with a
 * fib lookup, and decapsulate what arrives for this node's own locator. */
#ifndef LACE_LIB_SRV6_H
#define LACE_LIB_SRV6_H

#include "lib/maps.h"
#include "lib/flow.h"
#include "lib/parse.h"
#include "lib/delivery.h"

#define LACE_OUTER_HLEN 40
#define LACE_HOP_LIMIT  64

static __always_inline __u32 sid_offset(const struct lace_config *cfg)
{
	__u32 off = cfg->locator_len >> 3;

	return off > 8 ? 8 : off;
}

static __always_inline int in_locator(const struct lace_config *cfg, const __u8 *addr)
{
	__u32 n = sid_offset(cfg);
	int i;

#pragma unroll
	for (i = 0; i < 8; i++) {
		if (i >= n)
			break;
		if (addr[i] != cfg->locator[i])
			return 0;
	}
	return n > 0;
}

static __always_inline void sid_set_u32(__u8 *sid, __u32 off, __u32 value)
{
	sid[(off + 0) & 15] = value >> 24;
	sid[(off + 1) & 15] = value >> 16;
	sid[(off + 2) & 15] = value >> 8;
	sid[(off + 3) & 15] = value;
}

static __always_inline __u32 sid_get_u32(const __u8 *sid, __u32 off)
{
	return ((__u32)sid[(off + 0) & 15] << 24) | ((__u32)sid[(off + 1) & 15] << 16) |
	       ((__u32)sid[(off + 2) & 15] << 8) | (__u32)sid[(off + 3) & 15];
}

/* Push the outer header to sid (a node's locator and function; the argument is set here to f's
 * source network) from src; the packet must still start with its Ethernet header. */
static __always_inline int srv6_encap_to(struct __sk_buff *skb, struct lace_flow *f,
					 const struct lace_config *cfg, const __u8 *sid, __u32 node_id,
					 const __u8 *src)
{
	struct lace_ip6hdr outer = {};
	__be16 eth_proto = bpf_htons(ETH_P_IPV6);
	__u32 inner_len = skb->len - ETH_HLEN;

	lace_copy16(f->sid, sid);
	sid_set_u32(f->sid, sid_offset(cfg) + 4, f->src_network);
	f->node_id = node_id;

	/* the flow label carries the flow hash so that the underlay can spread flows */
	outer.ver_tc_flow = bpf_htonl(0x60000000 | (bpf_get_hash_recalc(skb) & 0xfffff));
	outer.payload_len = bpf_htons(inner_len);
	outer.nexthdr = f->family == LACE_FAMILY_IPV4 ? IPPROTO_IPIP : IPPROTO_IPV6;
	outer.hop_limit = LACE_HOP_LIMIT;
	lace_copy16(outer.saddr, src);
	lace_copy16(outer.daddr, f->sid);

	if (bpf_skb_adjust_room(skb, LACE_OUTER_HLEN, BPF_ADJ_ROOM_MAC,
				BPF_F_ADJ_ROOM_ENCAP_L3_IPV6) < 0)
		return LACE_DROP_ENCAP_FAILED;
	/* the room adjust_room made is in the linear area: write the headers in place */
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;

	if (data + ETH_HLEN + sizeof(outer) > data_end)
		return LACE_DROP_ENCAP_FAILED;
	eth->h_proto = eth_proto;
	__builtin_memcpy(data + ETH_HLEN, &outer, sizeof(outer));
	return 0;
}

/* The outer header's MACs and the redirect out of the interface the underlay names for f->sid. */
static __always_inline int srv6_send(struct __sk_buff *skb, const __u8 *dmac, const __u8 *smac, __u32 ifindex,
				     int *reason)
{
	if (set_macs(skb, dmac, smac) < 0) {
		*reason = LACE_DROP_ENCAP_FAILED;
		return -1;
	}
	return bpf_redirect(ifindex, 0);
}

/* Route the encapsulated packet on the underlay and redirect it out; < 0 with *reason set on failure.
 * The node's FIB is asked once per SID and LACE_NEXTHOP_TTL_NS (an IPv6 FIB lookup with its
 * neighbour is about half of what a packet to another node costs the sending program on its own):
 * the answer is kept in nexthops, and a packet that finds a fresh entry there is sent as the FIB
 * said, after the MTU check the lookup makes (bpf_skb_fib_lookup: a packet longer than the
 * interface takes, GSO aside, is refused; here it goes on to the lookup, which refuses it as
 * before). A change on the underlay (its route, its neighbour's MAC) is followed within the TTL. */
static __always_inline int srv6_forward(struct __sk_buff *skb, struct lace_flow *f,
					const struct lace_config *cfg, int *reason)
{
	struct bpf_fib_lookup p = {};
	struct lace_nexthop *nh;
	/* the clock the walk read for conntrack; read here only on a walk that took none */
	__u64 now = f->now_ns ? f->now_ns : bpf_ktime_get_coarse_ns();
	long rc;

	nh = bpf_map_lookup_elem(&lace_nexthops, f->sid);
	if (nh && nh->expires_ns > now && (skb->len <= nh->mtu + ETH_HLEN + LACE_VLAN_HLEN || skb->gso_size))
		return srv6_send(skb, nh->dmac, nh->smac, nh->ifindex, reason);

	p.family = AF_INET6;
	p.ifindex = cfg->uplink_ifindex;
	p.l4_protocol = f->family == LACE_FAMILY_IPV4 ? IPPROTO_IPIP : IPPROTO_IPV6;
	__builtin_memcpy(p.ipv6_src, cfg->underlay_addr, 16);
	__builtin_memcpy(p.ipv6_dst, f->sid, 16);

	rc = bpf_fib_lookup(skb, &p, sizeof(p), 0);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS) {
		struct lace_nexthop fresh = {
			.expires_ns = now + LACE_NEXTHOP_TTL_NS, .ifindex = p.ifindex, .mtu = p.mtu_result,
		};

		__builtin_memcpy(fresh.smac, p.smac, 6);
		__builtin_memcpy(fresh.dmac, p.dmac, 6);
		bpf_map_update_elem(&lace_nexthops, f->sid, &fresh, BPF_ANY);
		return srv6_send(skb, p.dmac, p.smac, p.ifindex, reason);
	}
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH)
		return bpf_redirect_neigh(p.ifindex, 0, 0, 0);
	*reason = LACE_DROP_FIB_LOOKUP_FAILED;
	return -1;
}

/* Pop the outer header; the inner packet then follows the Ethernet header. */
static __always_inline int srv6_decap(struct __sk_buff *skb, __u8 inner_nexthdr)
{
	__be16 eth_proto;
	__u64 flags;

	if (inner_nexthdr == IPPROTO_IPIP) {
		eth_proto = bpf_htons(ETH_P_IP);
		flags = BPF_F_ADJ_ROOM_DECAP_L3_IPV4;
	} else {
		eth_proto = bpf_htons(ETH_P_IPV6);
		flags = BPF_F_ADJ_ROOM_DECAP_L3_IPV6;
	}
	if (bpf_skb_adjust_room(skb, -LACE_OUTER_HLEN, BPF_ADJ_ROOM_MAC, flags) < 0)
		return LACE_DROP_DECAP_FAILED;

	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end)
		return LACE_DROP_DECAP_FAILED;
	eth->h_proto = eth_proto;
	return 0;
}

#endif
