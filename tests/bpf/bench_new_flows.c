// SPDX-License-Identifier: GPL-2.0
/* New flows back to back, for bench/datapath.py's warm new-flow rows: BPF_PROG_TEST_RUN repeats a
 * program on one skb, and a repeated new flow would be established from its second run. This
 * program gives every repetition a fresh flow — the next source port, and the destination address
 * and port the bench set (a service flow's translation rewrote them in the run before) — then tail
 * calls into the program in bench_walk (lace_from_pod, or bench_pass for the baseline). IPv4
 * without options only; the test packet carries no checksum anything verifies. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} bench_walk SEC(".maps");

/* set by the bench through the .bss map: the next source port (host order), the destination
 * address and port (as in the packet) */
struct bench_flow {
	__u32 sport;
	__u32 daddr;
	__u16 dport;
	__u16 reserved;
} bench_flow;

#define BENCH_IP_OFF  14   /* Ethernet */
#define BENCH_L4_OFF  34   /* Ethernet + IPv4 without options */

SEC("tc")
int bench_new_flows(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u8 *ip = data + BENCH_IP_OFF;
	__be16 *ports = data + BENCH_L4_OFF;

	if ((void *)(ports + 2) > data_end)
		return 2;       /* TC_ACT_SHOT: not the bench's packet */
	__builtin_memcpy(ip + 16, &bench_flow.daddr, 4);
	ports[0] = bpf_htons((__u16)__sync_fetch_and_add(&bench_flow.sport, 1));
	ports[1] = bench_flow.dport;
	bpf_tail_call(skb, &bench_walk, 0);
	return 2;               /* the tail call failed */
}

SEC("tc")
int bench_pass_tail(struct __sk_buff *skb)
{
	return 0;
}
