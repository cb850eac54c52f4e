// SPDX-License-Identifier: GPL-2.0
/* The baseline for bench/datapath.py: a tc program that only returns, so BPF_PROG_TEST_RUN's own
 * per-run cost can be subtracted from every measured path. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

SEC("tc")
int bench_pass(struct __sk_buff *skb)
{
	return 0;
}
