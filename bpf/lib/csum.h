/* Internet checksum arithmetic (RFC 1071) for headers the datapath builds from scratch; headers it
 * rewrites in place are updated incrementally by lib/nat.h through the kernel's csum helpers. */
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
