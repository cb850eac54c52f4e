/* Internet checksum arithmetic (RFC 1071) for headers the datapath builds from scratch, and the
 * incremental update (RFC 1624) of the IPv4 header checksum for addresses lib/nat.h rewrites in
 * place. Transport checksums are updated by the kernel's helpers (see lib/nat.h). */
#ifndef LACE_LIB_CSUM_H
#define LACE_LIB_CSUM_H

#include "lib/common.h"

/* Fold a 32-bit one's complement sum to 16 bits and complement it: the value a checksum field holds. */
static __always_inline __u16 csum_fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* The checksum field check after the 4-byte word from was replaced by to (RFC 1624, eqn. 3:
 * HC' = ~(~HC + ~m + m')). All three are taken as they sit in the packet: one's complement sums do
 * not depend on byte order. */
static __always_inline __u16 csum_replace4(__u16 check, __u32 from, __u32 to)
{
	__u64 sum = (__u16)~check;

	sum += (__u32)~from;
	sum += to;
	sum = (sum & 0xffffffff) + (sum >> 32);
	return csum_fold((__u32)sum + (__u32)(sum >> 32));
}

/* Add len bytes at buf (stack or map memory, len a multiple of 4) to the running sum seed. */
static __always_inline __u32 csum_add_mem(const void *buf, __u32 len, __u32 seed)
{
	return (__u32)bpf_csum_diff(0, 0, (__be32 *)buf, len, seed);
}

/* The IPv4 pseudo-header sum (RFC 793) of a transport segment of len bytes. */
static __always_inline __u32 csum_pseudo4(const __u8 *saddr, const __u8 *daddr, __u8 proto, __u16 len)
{
	struct {
		__u8   saddr[4];
		__u8   daddr[4];
		__u8   zero;
		__u8   proto;
		__be16 len;
	} ph = { .proto = proto, .len = bpf_htons(len) };

	__builtin_memcpy(ph.saddr, saddr, 4);
	__builtin_memcpy(ph.daddr, daddr, 4);
	return csum_add_mem(&ph, sizeof(ph), 0);
}

/* The IPv6 pseudo-header sum (RFC 8200 section 8.1) of an upper-layer packet of len bytes. */
static __always_inline __u32 csum_pseudo6(const __u8 *saddr, const __u8 *daddr, __u8 nexthdr, __u32 len)
{
	struct {
		__u8   saddr[16];
		__u8   daddr[16];
		__be32 len;
		__u8   zero[3];
		__u8   nexthdr;
	} ph = { .len = bpf_htonl(len), .nexthdr = nexthdr };

	lace_copy16(ph.saddr, saddr);
	lace_copy16(ph.daddr, daddr);
	return csum_add_mem(&ph, sizeof(ph), 0);
}

#endif
