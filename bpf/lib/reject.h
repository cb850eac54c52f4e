/* Refusing a new flow with an answer, as a host without a listener does: a TCP RST for TCP
 * (RFC 9293 section 3.10.7.1), an ICMP / ICMPv6 port unreachable for UDP (RFC 792, RFC 4443). The
 * answer is built in the refused packet's own buffer — resized, every header rewritten, checksums
 * computed in full — addressed from the destination the pod asked for back to the pod, and sent
 * back into the pod through its veth. The refused packet is counted and traced as a drop with its
 * reason before that, so the answer shows up in `node trace` and the metrics under that reason.
 * Anything else (other protocols, a refused RST) is dropped without an answer. */
#ifndef LACE_LIB_REJECT_H
#define LACE_LIB_REJECT_H

#include "lib/common.h"
#include "lib/flow.h"
#include "lib/parse.h"
#include "lib/csum.h"
#include "lib/drop.h"

#define REJECT_TTL 64
/* How much of the refused packet an ICMP error quotes: its IP header and transport header at
 * least (what the receiver matches the error to a socket with), here at most 128 bytes of it. */
#define REJECT_QUOTE_MAX 128
#define REJECT_QUOTE_MIN 28   /* an IPv4 header and a UDP header */

struct reject_tcphdr {
	__be16 sport;
	__be16 dport;
	__be32 seq;
	__be32 ack_seq;
	__u8   doff;      /* data offset in the high nibble */
	__u8   flags;
	__be16 window;
	__u16  check;
	__be16 urg_ptr;
};

struct reject_icmphdr {
	__u8   type;
	__u8   code;
	__u16  check;
	__be32 unused;
};

/* Swap the frame's MAC addresses: the answer goes back to the pod from its gateway. */
static __always_inline int reject_eth(struct __sk_buff *skb)
{
	__u8 macs[12], swapped[12];

	if (bpf_skb_load_bytes(skb, 0, macs, sizeof(macs)) < 0)
		return -1;
	__builtin_memcpy(swapped, macs + 6, 6);
	__builtin_memcpy(swapped + 6, macs, 6);
	return bpf_skb_store_bytes(skb, 0, swapped, sizeof(swapped), 0) < 0 ? -1 : 0;
}

/* Write an IP header from f's destination to f's source carrying payload_len bytes of proto at
 * the start of the (already resized) packet, and the swapped MACs. */
static __always_inline int reject_ip(struct __sk_buff *skb, const struct lace_flow *f, __u8 proto,
				     __u16 payload_len)
{
	if (reject_eth(skb) < 0)
		return -1;
	if (f->family == LACE_FAMILY_IPV4) {
		struct lace_iphdr ip = {
			.ver_ihl = 0x45,
			.tot_len = bpf_htons(sizeof(ip) + payload_len),
			.frag_off = bpf_htons(0x4000),   /* DF */
			.ttl = REJECT_TTL,
			.protocol = proto,
		};

		__builtin_memcpy(ip.saddr, f->daddr, 4);
		__builtin_memcpy(ip.daddr, f->saddr, 4);
		ip.check = csum_fold(csum_add_mem(&ip, sizeof(ip), 0));
		return bpf_skb_store_bytes(skb, ETH_HLEN, &ip, sizeof(ip), 0) < 0 ? -1 : 0;
	}
	struct lace_ip6hdr ip6 = {
		.ver_tc_flow = bpf_htonl(0x60000000),
		.payload_len = bpf_htons(payload_len),
		.nexthdr = proto,
		.hop_limit = REJECT_TTL,
	};

	lace_copy16(ip6.saddr, f->daddr);
	lace_copy16(ip6.daddr, f->saddr);
	return bpf_skb_store_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6), 0) < 0 ? -1 : 0;
}

static __always_inline __u32 reject_ip_hlen(__u8 family)
{
	return family == LACE_FAMILY_IPV4 ? sizeof(struct lace_iphdr) : sizeof(struct lace_ip6hdr);
}

/* The RST for a refused TCP segment: one that acknowledges the segment when it carried no ACK,
 * else one whose sequence number is the segment's ACK. */
static __always_inline int reject_tcp(struct __sk_buff *skb, const struct lace_flow *f)
{
	struct reject_tcphdr in, th = {};
	__u32 hlen = reject_ip_hlen(f->family), end, seg_len, sum;

	if (bpf_skb_load_bytes(skb, f->l4_off, &in, sizeof(in)) < 0)
		return -1;
	end = ETH_HLEN + f->l3_len;
	seg_len = f->l4_off + (in.doff >> 4) * 4;
	seg_len = end > seg_len ? end - seg_len : 0;    /* payload bytes */
	th.sport = f->dport;
	th.dport = f->sport;
	th.doff = 5 << 4;
	if (in.flags & TCP_F_ACK) {
		th.seq = in.ack_seq;
		th.flags = TCP_F_RST;
	} else {
		seg_len += !!(in.flags & TCP_F_SYN) + !!(in.flags & TCP_F_FIN);
		th.ack_seq = bpf_htonl(bpf_ntohl(in.seq) + seg_len);
		th.flags = TCP_F_RST | TCP_F_ACK;
	}
	if (f->family == LACE_FAMILY_IPV4)
		sum = csum_pseudo4(f->daddr, f->saddr, IPPROTO_TCP, sizeof(th));
	else
		sum = csum_pseudo6(f->daddr, f->saddr, IPPROTO_TCP, sizeof(th));
	th.check = csum_fold(csum_add_mem(&th, sizeof(th), sum));

	if (bpf_skb_change_tail(skb, ETH_HLEN + hlen + sizeof(th), 0) < 0)
		return -1;
	if (reject_ip(skb, f, IPPROTO_TCP, sizeof(th)) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, ETH_HLEN + hlen, &th, sizeof(th), 0) < 0 ? -1 : 0;
}

/* The port unreachable for a refused UDP datagram, quoting its start. */
static __always_inline int reject_icmp(struct __sk_buff *skb, const struct lace_flow *f)
{
	__u8 quote[REJECT_QUOTE_MAX] = {};    /* zeros past the quote add nothing to the checksum */
	struct reject_icmphdr ic = {};
	__u32 hlen = reject_ip_hlen(f->family), qlen = f->l3_len, sum = 0;

	if (qlen > skb->len - ETH_HLEN)
		qlen = skb->len - ETH_HLEN;
	if (qlen > REJECT_QUOTE_MAX)
		qlen = REJECT_QUOTE_MAX;
	if (qlen < REJECT_QUOTE_MIN)
		return -1;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, quote, qlen) < 0)
		return -1;
	if (f->family == LACE_FAMILY_IPV4) {
		ic.type = 3;    /* destination unreachable */
		ic.code = 3;    /* port unreachable */
	} else {
		ic.type = 1;    /* destination unreachable */
		ic.code = 4;    /* port unreachable */
		sum = csum_pseudo6(f->daddr, f->saddr, IPPROTO_ICMPV6, sizeof(ic) + qlen);
	}
	sum = csum_add_mem(&ic, sizeof(ic), sum);
	ic.check = csum_fold(csum_add_mem(quote, sizeof(quote), sum));

	if (bpf_skb_change_tail(skb, ETH_HLEN + hlen + sizeof(ic) + qlen, 0) < 0)
		return -1;
	if (reject_ip(skb, f, f->family == LACE_FAMILY_IPV4 ? IPPROTO_ICMP : IPPROTO_ICMPV6, sizeof(ic) + qlen) < 0)
		return -1;
	if (bpf_skb_store_bytes(skb, ETH_HLEN + hlen, &ic, sizeof(ic), 0) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, ETH_HLEN + hlen + sizeof(ic), quote, qlen, 0) < 0 ? -1 : 0;
}

/* Turn the packet of f into its answer: 0, or -1 when it has none (or it could not be built). */
__lace_subprog int reject_answer(struct __sk_buff *skb, const struct lace_flow *f)
{
	if (f->proto == IPPROTO_TCP && !(f->tcp_flags & TCP_F_RST))
		return reject_tcp(skb, f);
	if (f->proto == IPPROTO_UDP)
		return reject_icmp(skb, f);
	return -1;
}

/* Drop the packet of f for reason and answer its sender, when its protocol has an answer. */
static __always_inline int lace_reject(struct __sk_buff *skb, struct lace_flow *f, __u16 reason)
{
	lace_drop(skb, f, reason);
	if (reject_answer(skb, f) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect_peer(skb->ifindex, 0);
}

#endif
