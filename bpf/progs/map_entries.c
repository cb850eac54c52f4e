// SPDX-License-Identifier: GPL-2.0
/* Attach point: a BPF map iterator (not the datapath). One line per map in the kernel, "<map id>
 * <entries>", with the count the kernel itself keeps for a hash map (its per-CPU insert and delete
 * counters, Linux 6.6 and later): the agent's map fill metrics and status read every map's fill
 * at once from it, instead of walking each map's entries (~0.5 s for a conntrack table of 1M
 * entries, every scrape). The kernel keeps no such count for other map types: their line says 0,
 * and the reader counts those its own way (lace.bpf.iter). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

extern s64 bpf_map_sum_elem_count(const struct bpf_map *map) __ksym;

SEC("iter/bpf_map")
int lace_map_entries(struct bpf_iter__bpf_map *ctx)
{
	struct seq_file *seq = ctx->meta->seq;
	struct bpf_map *map = ctx->map;
	__u64 id, n;

	if (!map)
		return 0;       /* the end of the walk */
	id = map->id;
	n = bpf_map_sum_elem_count(map);
	BPF_SEQ_PRINTF(seq, "%llu %llu\n", id, n);
	return 0;
}
