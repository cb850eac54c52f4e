/* Base includes and constants for every lace program (no uapi headers: vmlinux.h only). */
#ifndef LACE_LIB_COMMON_H
#define LACE_LIB_COMMON_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "lace/abi/common.h"
#include "lace/abi/reasons.h"

#define ETH_HLEN       14
#define ETH_ALEN       6
#define LACE_VLAN_HLEN 4   /* what is_skb_forwardable() allows past the MTU and the Ethernet header */
#define ETH_P_IP       0x0800
#define ETH_P_ARP      0x0806
#define ETH_P_IPV6     0x86DD

#define TC_ACT_OK       0
#define TC_ACT_SHOT     2
#define TC_ACT_REDIRECT 7

#define IPPROTO_HOPOPTS  0
#define IPPROTO_ICMP     1
#define IPPROTO_IPIP     4
#define IPPROTO_TCP      6
#define IPPROTO_UDP      17
#define IPPROTO_IPV6     41
#define IPPROTO_ROUTING  43
#define IPPROTO_FRAGMENT 44
#define IPPROTO_ICMPV6   58
#define IPPROTO_DSTOPTS  60
#define IPPROTO_SCTP     132

#define AF_INET  2
#define AF_INET6 10

#define IP_MF     0x2000
#define IP_OFFSET 0x1FFF

#define TCP_F_FIN 0x01
#define TCP_F_SYN 0x02
#define TCP_F_RST 0x04
#define TCP_F_PSH 0x08
#define TCP_F_ACK 0x10

#define NSEC_PER_SEC 1000000000ull

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

/* A BPF-to-BPF function with its own stack frame: for paths whose buffers would not fit in the
 * 512 bytes of the program's frame next to everything inlined there (the verifier counts the
 * frames of a call chain together, so these hold the big transient buffers, not the long-lived
 * state). */
#define __lace_subprog static __attribute__((noinline))

#define LACE_PIN __uint(pinning, LIBBPF_PIN_BY_NAME)

/* Cut points for bench/datapath.py's stage table: an object built with -DLACE_BENCH_STOP=n (the
 * Makefile's pod_veth_stop<n>.o, test objects only) returns TC_ACT_OK at cut point n, so the cost of
 * the real walk up to each point can be measured and the difference between two points is the cost
 * of the stage between them. In the product build they compile to nothing. */
#ifdef LACE_BENCH_STOP
#define LACE_BENCH_STAGE(n) do { if ((n) == LACE_BENCH_STOP) return TC_ACT_OK; } while (0)
#else
#define LACE_BENCH_STAGE(n) do { } while (0)
#endif

static __always_inline void lace_copy16(__u8 *dst, const __u8 *src)
{
	__builtin_memcpy(dst, src, 16);
}

static __always_inline void lace_zero16(__u8 *dst)
{
	__builtin_memset(dst, 0, 16);
}

/* A 16-byte address the datapath keeps 8-byte aligned: struct lace_flow's addresses, the NAT
 * address of a conntrack entry, a backend's address, and stack copies of them declared as this
 * union. clang cannot see the alignment through a __u8 pointer and copies those byte by byte (a
 * 16-byte copy then spills to the stack); the _a8 helpers move and compare them as two u64. Only
 * for such addresses: the verifier rejects a misaligned 8-byte stack access. */
union lace_addr {
	__u8  b[16];
	__u64 w[2];
};

static __always_inline void lace_copy16_a8(void *dst, const void *src)
{
	((__u64 *)dst)[0] = ((const __u64 *)src)[0];
	((__u64 *)dst)[1] = ((const __u64 *)src)[1];
}

static __always_inline int lace_eq16_a8(const void *a, const void *b)
{
	const __u64 *x = a, *y = b;

	return ((x[0] ^ y[0]) | (x[1] ^ y[1])) == 0;
}

/* clang 14 does not lower __builtin_memcmp for BPF: compare by hand, fixed sizes only. */
static __always_inline int lace_eq6(const __u8 *a, const __u8 *b)
{
	return ((a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3]) |
		(a[4] ^ b[4]) | (a[5] ^ b[5])) == 0;
}

static __always_inline int lace_eq4(const __u8 *a, const __u8 *b)
{
	__u32 x, y;

	__builtin_memcpy(&x, a, 4);
	__builtin_memcpy(&y, b, 4);
	return x == y;
}

static __always_inline int lace_eq16(const __u8 *a, const __u8 *b)
{
	__u64 a0, a1, b0, b1;

	__builtin_memcpy(&a0, a, 8);
	__builtin_memcpy(&a1, a + 8, 8);
	__builtin_memcpy(&b0, b, 8);
	__builtin_memcpy(&b1, b + 8, 8);
	return ((a0 ^ b0) | (a1 ^ b1)) == 0;
}

#endif
