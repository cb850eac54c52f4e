/* Address and port translation in place: rewrite a packet's source or destination address and
 * port, keeping the IPv4 header checksum and the TCP/UDP (and ICMPv6) checksum valid.
 *
 * The IP header is in the linear area (parse_packet reads it there): its addresses are written by
 * direct packet access and the IPv4 header checksum is updated inline (csum_replace4), where a
 * helper call each would cost more than the write. So are ports whose transport header is linear
 * (bpf_skb_store_bytes otherwise). Transport checksums are updated incrementally by the kernel's
 * helpers, which know what the program cannot see (the skb's checksum state) and so get partial
 * checksums right: a pod's stack hands over TCP/UDP with CHECKSUM_PARTIAL (the field holds only the
 * pseudo-header sum and the device completes it), so an address change — part of the pseudo
 * header — is applied with BPF_F_PSEUDO_HDR, while a port change is applied only when the
 * checksum is complete (the helpers skip it for a partial one; the final sum will cover the new
 * port anyway). UDP over IPv4 may carry no checksum (0): BPF_F_MARK_MANGLED_0 leaves it at 0 and
 * writes an update that comes out 0 as 0xffff. ICMPv4 has no pseudo header: an address change
 * leaves it alone. SCTP (CRC32c over the whole packet, no incremental update) is not translated. */
#ifndef LACE_LIB_NAT_H
#define LACE_LIB_NAT_H

#include "lib/common.h"
#include "lib/csum.h"
#include "lib/parse.h"

#define NAT_SRC 0
#define NAT_DST 1

/* The offset of the checksum covering the transport header at l4_off, 0 when proto has none
 * that lace updates. */
static __always_inline __u32 nat_l4_csum_off(__u8 proto, __u32 l4_off)
{
	switch (proto) {
	case IPPROTO_TCP:    return l4_off + 16;
	case IPPROTO_UDP:    return l4_off + 6;
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6: return l4_off + 2;
	default:             return 0;
	}
}

static __always_inline __u64 nat_l4_flags(__u8 proto)
{
	return proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
}

/* Write the 2 bytes v at off: in place when they are in the linear area, else by the helper. */
static __always_inline int pkt_store16(struct __sk_buff *skb, __u32 off, __be16 v)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;

	if (off <= LACE_PKT_DIRECT_MAX && data + off + sizeof(v) <= data_end) {
		*(__be16 *)(data + off) = v;
		return 0;
	}
	if (bpf_skb_store_bytes(skb, off, &v, sizeof(v), 0) < 0)
		return LACE_DROP_NAT_FAILED;
	return 0;
}

/* Write to (4 or 16 bytes by family) over the source (NAT_SRC) or destination (NAT_DST) address,
 * which holds from; both are 8-byte aligned addresses (union lace_addr in common.h). 0, or
 * LACE_DROP_NAT_FAILED when a helper refuses (or the IP header is no longer linear). */
static __always_inline int nat_rewrite_addr(struct __sk_buff *skb, __u8 family, __u8 proto, __u32 l4_off,
					    int dst, const __u8 *from, const __u8 *to)
{
	__u32 csum_off = nat_l4_csum_off(proto, l4_off);
	__u64 l4flags = nat_l4_flags(proto) | BPF_F_PSEUDO_HDR;
	void *data, *data_end;

	if (family == LACE_FAMILY_IPV4) {
		struct lace_iphdr *ip;
		__be32 old, new;

		__builtin_memcpy(&old, from, 4);
		__builtin_memcpy(&new, to, 4);
		if (old == new)
			return 0;
		/* the helper may move the packet: pointers into it are taken after it */
		if (csum_off && proto != IPPROTO_ICMP &&
		    bpf_l4_csum_replace(skb, csum_off, old, new, l4flags | sizeof(new)) < 0)
			return LACE_DROP_NAT_FAILED;
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
		ip = data + ETH_HLEN;
		if ((void *)(ip + 1) > data_end)
			return LACE_DROP_NAT_FAILED;
		ip->check = csum_replace4(ip->check, old, new);
		__builtin_memcpy(dst ? ip->daddr : ip->saddr, &new, sizeof(new));
		return 0;
	}
	union lace_addr new6;
	struct lace_ip6hdr *ip6;
	__s64 diff;

	lace_copy16_a8(&new6, to);
	if (lace_eq16_a8(from, &new6))
		return 0;
	if (csum_off) {
		/* a 16-byte change: the helper takes the precomputed difference (size 0) */
		diff = bpf_csum_diff((__be32 *)from, 16, (__be32 *)new6.b, 16, 0);
		if (diff < 0 || bpf_l4_csum_replace(skb, csum_off, 0, diff, l4flags) < 0)
			return LACE_DROP_NAT_FAILED;
	}
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	ip6 = data + ETH_HLEN;
	if ((void *)(ip6 + 1) > data_end)
		return LACE_DROP_NAT_FAILED;
	lace_copy16(dst ? ip6->daddr : ip6->saddr, new6.b);
	return 0;
}

/* Write to over the source or destination port of the TCP/UDP header at l4_off, which holds from. */
static __always_inline int nat_rewrite_port(struct __sk_buff *skb, __u8 proto, __u32 l4_off, int dst,
					    __be16 from, __be16 to)
{
	__u32 csum_off = nat_l4_csum_off(proto, l4_off);

	if (from == to)
		return 0;
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return LACE_DROP_NAT_FAILED;
	if (bpf_l4_csum_replace(skb, csum_off, from, to, nat_l4_flags(proto) | sizeof(to)) < 0)
		return LACE_DROP_NAT_FAILED;
	return pkt_store16(skb, l4_off + (dst ? 2 : 0), to);
}

/* Write to over the identifier of the ICMP or ICMPv6 echo header at l4_off, which holds from (the
 * identifier is not part of ICMPv6's pseudo header: a plain checksum update). */
static __always_inline int nat_rewrite_echo_id(struct __sk_buff *skb, __u32 l4_off, __be16 from, __be16 to)
{
	if (from == to)
		return 0;
	if (bpf_l4_csum_replace(skb, l4_off + 2, from, to, sizeof(to)) < 0)
		return LACE_DROP_NAT_FAILED;
	return pkt_store16(skb, l4_off + 4, to);
}

/* In an ICMP error (f: the error, its transport header at l4_off), rewrite one side (NAT_SRC or
 * NAT_DST) of the packet it quotes: the address from -> to and the port (a quoted echo: its
 * identifier) pfrom -> pto. The quoted IPv4 header checksum is updated, which leaves the ICMP
 * checksum's sum unchanged (ICMPv6's pseudo-header-free sum takes the address change); the quoted
 * transport checksum is left as it was: receivers match errors on addresses and ports. */
static __always_inline int nat_rewrite_quoted(struct __sk_buff *skb, const struct lace_flow *f, int dst,
					      const __u8 *from, const __u8 *to, __be16 pfrom, __be16 pto)
{
	__u32 inner = f->l4_off + 8, csum_off = f->l4_off + 2, inner_l4, addr_off, port_off;
	int echo = f->inner_proto == IPPROTO_ICMP || f->inner_proto == IPPROTO_ICMPV6;

	if (f->family == LACE_FAMILY_IPV4) {
		__be32 a, b;
		__u8 ver_ihl;

		if (bpf_skb_load_bytes(skb, inner, &ver_ihl, 1) < 0)
			return LACE_DROP_PKT_TRUNCATED;
		inner_l4 = inner + (ver_ihl & 0xf) * 4;
		addr_off = inner + (dst ? 16 : 12);
		__builtin_memcpy(&a, from, 4);
		__builtin_memcpy(&b, to, 4);
		if (bpf_l3_csum_replace(skb, inner + 10, a, b, sizeof(b)) < 0 ||
		    bpf_skb_store_bytes(skb, addr_off, &b, sizeof(b), 0) < 0)
			return LACE_DROP_NAT_FAILED;
	} else {
		union lace_addr b;
		__s64 diff;

		inner_l4 = inner + sizeof(struct lace_ip6hdr);
		addr_off = inner + (dst ? 24 : 8);
		lace_copy16_a8(&b, to);
		diff = bpf_csum_diff((__be32 *)from, 16, (__be32 *)b.b, 16, 0);
		if (diff < 0 || bpf_l4_csum_replace(skb, csum_off, 0, diff, 0) < 0 ||
		    bpf_skb_store_bytes(skb, addr_off, b.b, 16, 0) < 0)
			return LACE_DROP_NAT_FAILED;
	}
	port_off = inner_l4 + (echo ? 4 : dst ? 2 : 0);
	if (pfrom != pto &&
	    (bpf_l4_csum_replace(skb, csum_off, pfrom, pto, sizeof(pto)) < 0 ||
	     bpf_skb_store_bytes(skb, port_off, &pto, sizeof(pto), 0) < 0))
		return LACE_DROP_NAT_FAILED;
	return 0;
}

/* Both at once: address and port of one side of the packet's tuple. */
static __always_inline int nat_rewrite(struct __sk_buff *skb, const struct lace_flow *f, int dst,
				       const __u8 *from_addr, const __u8 *to_addr, __be16 from_port, __be16 to_port)
{
	int rc = nat_rewrite_addr(skb, f->family, f->proto, f->l4_off, dst, from_addr, to_addr);

	if (rc)
		return rc;
	return nat_rewrite_port(skb, f->proto, f->l4_off, dst, from_port, to_port);
}

#endif
