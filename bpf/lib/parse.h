/* Packet parsing: Ethernet, IPv4/IPv6 (extension headers, fragments), TCP/UDP/SCTP/ICMP and the
 * packet embedded in ICMP errors. Returns a drop reason, LACE_PARSE_PASS for control traffic the
 * node's stack must see (ARP, neighbour discovery), or 0. */
#ifndef LACE_LIB_PARSE_H
#define LACE_LIB_PARSE_H

#include "lib/common.h"
#include "lib/flow.h"

#define LACE_PARSE_PASS 0xffff

struct lace_iphdr {
	__u8   ver_ihl;
	__u8   tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8   ttl;
	__u8   protocol;
	__u16  check;
	__u8   saddr[4];
	__u8   daddr[4];
};

struct lace_ip6hdr {
	__be32 ver_tc_flow;
	__be16 payload_len;
	__u8   nexthdr;
	__u8   hop_limit;
	__u8   saddr[16];
	__u8   daddr[16];
};

static __always_inline int icmp4_is_error(__u8 type)
{
	return type == 3 || type == 11 || type == 12;
}

static __always_inline int icmp6_is_error(__u8 type)
{
	return type >= 1 && type <= 4;
}

/* Link-local control the pod's kernel sends on its own (neighbour discovery, multicast listener
 * reports): handed to the node's stack, which ignores it — not routed, not a spoofing attempt. */
static __always_inline int icmp6_is_nd(__u8 type)
{
	return (type >= 133 && type <= 137) || (type >= 130 && type <= 132) || type == 143;
}

/* The leading bytes of the L4 headers the datapath reads (2-byte aligned, no padding). */
struct lace_l4_ports {
	__be16 sport;
	__be16 dport;
};

struct lace_tcp_head {
	__be16 sport;
	__be16 dport;
	__be16 seq[2];
	__be16 ack_seq[2];
	__u8   doff;
	__u8   flags;
};

struct lace_icmp_head {
	__u8   type;
	__u8   code;
	__be16 checksum;
	__be16 id;
	__be16 seq;
};

/* Upper bound on header offsets read through direct packet access: keeps data + off in the range
 * the verifier accepts; anything deeper goes through bpf_skb_load_bytes. */
#define LACE_PKT_DIRECT_MAX 512

/* len bytes at off: a pointer into the linear area when they are in it (the caller reads the
 * fields it needs, nothing is copied), else copied into buf through bpf_skb_load_bytes
 * (non-linear skbs). NULL when the packet is shorter. */
static __always_inline const void *pkt_ptr(struct __sk_buff *skb, __u32 off, void *buf, const __u32 len)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;

	if (off <= LACE_PKT_DIRECT_MAX && data + off + len <= data_end)
		return data + off;
	if (bpf_skb_load_bytes(skb, off, buf, len) < 0)
		return 0;
	return buf;
}

/* Ports (or the ICMP echo identifier) at off for proto. */
static __always_inline int parse_ports(struct __sk_buff *skb, __u32 off, __u8 proto,
				       __be16 *sport, __be16 *dport)
{
	struct lace_l4_ports buf;
	const struct lace_l4_ports *p = pkt_ptr(skb, off, &buf, sizeof(buf));

	if (!p)
		return LACE_DROP_PKT_TRUNCATED;
	*sport = p->sport;
	*dport = p->dport;
	return 0;
}

/* The packet quoted by an ICMP error, starting at off (its IP header). */
static __always_inline int parse_icmp_inner(struct __sk_buff *skb, struct lace_flow *f, __u32 off)
{
	__be16 ports[2];

	if (f->family == LACE_FAMILY_IPV4) {
		struct lace_iphdr in;
		__u32 ihl;

		if (bpf_skb_load_bytes(skb, off, &in, sizeof(in)) < 0)
			return LACE_DROP_PKT_TRUNCATED;
		ihl = (in.ver_ihl & 0xf) * 4;
		if (ihl < 20)
			return LACE_DROP_BAD_IHL;
		lace_zero16(f->inner_saddr);
		lace_zero16(f->inner_daddr);
		__builtin_memcpy(f->inner_saddr, in.saddr, 4);
		__builtin_memcpy(f->inner_daddr, in.daddr, 4);
		f->inner_proto = in.protocol;
		off += ihl;
	} else {
		struct lace_ip6hdr in6;

		if (bpf_skb_load_bytes(skb, off, &in6, sizeof(in6)) < 0)
			return LACE_DROP_PKT_TRUNCATED;
		lace_copy16(f->inner_saddr, in6.saddr);
		lace_copy16(f->inner_daddr, in6.daddr);
		f->inner_proto = in6.nexthdr;
		off += sizeof(in6);
	}
	if (bpf_skb_load_bytes(skb, off, ports, sizeof(ports)) < 0)
		return LACE_DROP_PKT_TRUNCATED;
	if (f->inner_proto == IPPROTO_ICMP || f->inner_proto == IPPROTO_ICMPV6) {
		/* quoted echo: identifier is the second half-word pair */
		__be16 id;

		if (bpf_skb_load_bytes(skb, off + 4, &id, sizeof(id)) < 0)
			return LACE_DROP_PKT_TRUNCATED;
		f->inner_sport = id;
		f->inner_dport = id;
	} else {
		f->inner_sport = ports[0];
		f->inner_dport = ports[1];
	}
	f->icmp_error = 1;
	return 0;
}

static __always_inline int parse_l4(struct __sk_buff *skb, struct lace_flow *f, __u32 off)
{
	f->l4_off = off;
	switch (f->proto) {
	case IPPROTO_TCP: {
		struct lace_tcp_head buf;
		const struct lace_tcp_head *th = pkt_ptr(skb, off, &buf, sizeof(buf));

		if (!th)
			return LACE_DROP_PKT_TRUNCATED;
		f->sport = th->sport;
		f->dport = th->dport;
		f->tcp_flags = th->flags;
		return 0;
	}
	case IPPROTO_UDP:
	case IPPROTO_SCTP:
		return parse_ports(skb, off, f->proto, &f->sport, &f->dport);
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6: {
		struct lace_icmp_head buf;
		const struct lace_icmp_head *ih;
		__u8 type;
		__be16 id;

		if ((f->proto == IPPROTO_ICMP) != (f->family == LACE_FAMILY_IPV4))
			return LACE_DROP_UNSUPPORTED_L4;
		ih = pkt_ptr(skb, off, &buf, sizeof(buf));
		if (!ih)
			return LACE_DROP_PKT_TRUNCATED;
		f->icmp_type = type = ih->type;
		id = ih->id;
		if (f->proto == IPPROTO_ICMP) {
			if (icmp4_is_error(type))
				return parse_icmp_inner(skb, f, off + 8);
			if (type == 8 || type == 0) {  /* echo request / reply */
				f->sport = id;
				f->dport = id;
			}
		} else {
			if (icmp6_is_nd(type))
				return LACE_PARSE_PASS;
			if (icmp6_is_error(type))
				return parse_icmp_inner(skb, f, off + 8);
			if (type == 128 || type == 129) {
				f->sport = id;
				f->dport = id;
			}
		}
		return 0;
	}
	default:
		return LACE_DROP_UNSUPPORTED_L4;
	}
}

/* Parse from the Ethernet header on. */
static __always_inline int parse_packet(struct __sk_buff *skb, struct lace_flow *f)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	__u32 off = ETH_HLEN;

	if ((void *)(eth + 1) > data_end)
		return LACE_DROP_PKT_TRUNCATED;

	switch (bpf_ntohs(eth->h_proto)) {
	case ETH_P_ARP:
		return LACE_PARSE_PASS;
	case ETH_P_IP: {
		struct lace_iphdr *ip = data + ETH_HLEN;
		__u32 ihl;

		if ((void *)(ip + 1) > data_end)
			return LACE_DROP_PKT_TRUNCATED;
		ihl = (ip->ver_ihl & 0xf) * 4;
		if ((ip->ver_ihl >> 4) != 4 || ihl < 20)
			return LACE_DROP_BAD_IHL;
		if (ETH_HLEN + ihl > skb->len)
			return LACE_DROP_PKT_TRUNCATED;
		if (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET))
			return LACE_DROP_FRAGMENT;
		f->family = LACE_FAMILY_IPV4;
		f->proto = ip->protocol;
		lace_zero16(f->saddr);
		lace_zero16(f->daddr);
		__builtin_memcpy(f->saddr, ip->saddr, 4);
		__builtin_memcpy(f->daddr, ip->daddr, 4);
		f->l3_len = bpf_ntohs(ip->tot_len);
		off += ihl;
		break;
	}
	case ETH_P_IPV6: {
		struct lace_ip6hdr *ip6 = data + ETH_HLEN;
		__u8 nh;
		int i;

		if ((void *)(ip6 + 1) > data_end)
			return LACE_DROP_PKT_TRUNCATED;
		f->family = LACE_FAMILY_IPV6;
		lace_copy16(f->saddr, ip6->saddr);
		lace_copy16(f->daddr, ip6->daddr);
		f->l3_len = bpf_ntohs(ip6->payload_len) + sizeof(*ip6);
		nh = ip6->nexthdr;
		off += sizeof(*ip6);
#pragma unroll
		for (i = 0; i < 4; i++) {
			__u8 buf[2];
			const __u8 *ext;

			if (nh == IPPROTO_FRAGMENT)
				return LACE_DROP_FRAGMENT;
			if (nh != IPPROTO_HOPOPTS && nh != IPPROTO_ROUTING && nh != IPPROTO_DSTOPTS)
				break;
			ext = pkt_ptr(skb, off, buf, sizeof(buf));
			if (!ext)
				return LACE_DROP_PKT_TRUNCATED;
			nh = ext[0];
			off += (ext[1] + 1) * 8;
		}
		f->proto = nh;
		break;
	}
	default:
		return LACE_DROP_UNSUPPORTED_L3;
	}
	return parse_l4(skb, f, off);
}

#endif
