/* Delivery: where a destination in a network goes, and handing the packet to a local pod. */
#ifndef LACE_LIB_DELIVERY_H
#define LACE_LIB_DELIVERY_H

#include "lib/maps.h"
#include "lib/flow.h"

static __always_inline struct lace_delivery *delivery_lookup(__u32 network, __u8 family,
							     const __u8 *daddr)
{
	struct lace_delivery_key k = {
		.prefixlen = LACE_DELIVERY_PREFIX_BASE + (family == LACE_FAMILY_IPV4 ? 32 : 128),
		.network = network,
		.family = family,
	};

	lace_copy16(k.addr, daddr);
	return bpf_map_lookup_elem(&lace_delivery, &k);
}

/* Routed hop: decrement the IPv4 TTL (with checksum) or the IPv6 hop limit. */
static __always_inline int ttl_decrement(struct __sk_buff *skb, __u8 family)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;

	if (family == LACE_FAMILY_IPV4) {
		__u8 *ttl = data + ETH_HLEN + 8;
		__be16 old_word, new_word;

		if ((void *)(ttl + 2) > data_end)
			return LACE_DROP_PKT_TRUNCATED;
		if (*ttl <= 1)
			return LACE_DROP_TTL_EXCEEDED;
		__builtin_memcpy(&old_word, ttl, 2);
		*ttl -= 1;
		__builtin_memcpy(&new_word, ttl, 2);
		bpf_l3_csum_replace(skb, ETH_HLEN + 10, old_word, new_word, 2);
		return 0;
	}
	__u8 *hl = data + ETH_HLEN + 7;

	if ((void *)(hl + 1) > data_end)
		return LACE_DROP_PKT_TRUNCATED;
	if (*hl <= 1)
		return LACE_DROP_TTL_EXCEEDED;
	*hl -= 1;
	return 0;
}

/* Rewrite the MACs for the pod (gateway -> pod) and redirect into its namespace. */
static __always_inline int deliver_local(struct __sk_buff *skb, struct lace_flow *f,
					 const struct lace_delivery *d)
{
	__u8 macs[12];

	__builtin_memcpy(macs, d->mac, 6);
	__builtin_memcpy(macs + 6, d->host_mac, 6);
	if (bpf_skb_store_bytes(skb, 0, macs, sizeof(macs), 0) < 0)
		return -1;
	f->delivery_ifindex = d->ifindex;
	return bpf_redirect_peer(d->ifindex, 0);
}

#endif
