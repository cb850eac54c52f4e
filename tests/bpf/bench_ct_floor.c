// SPDX-License-Identifier: GPL-2.0
/* The floor under conntrack, for bench/datapath.py: what the kernel itself costs for what conntrack
 * does per packet — a lookup that finds nothing and the insert of a fresh entry (a new flow), a
 * lookup that finds its entry and the clock (an established packet: the coarse clock the walk once
 * read per packet, and lib/clock.h's per-tick reading it takes now) — in a map shaped
 * like ct-tcp-v4 (its key and entry; the bench sets the capacity and the fill of the test bed's
 * table). No lace code runs: the difference to the stage table's conntrack rows is lace's own. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "lace/abi/conntrack.h"
#include "lib/clock.h"

char LICENSE[] SEC("license") = "GPL";

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LACE_CT_TCP_MAX);
	__type(key, struct lace_ct4_key);
	__type(value, struct lace_ct_entry);
} bench_ct SEC(".maps");

/* seq: every run takes the next key, never in the map before (the fill uses network 1, these 2);
 * hit_key: a key of the fill, set by the bench through the .bss map */
struct bench_keys {
	__u32 seq;
	struct lace_ct4_key hit_key;
} bench_keys;

static __always_inline void fresh_key(struct lace_ct4_key *k)
{
	__u32 seq = __sync_fetch_and_add(&bench_keys.seq, 1);

	__builtin_memset(k, 0, sizeof(*k));
	k->network = 2;
	__builtin_memcpy(k->saddr, &seq, sizeof(seq));
	k->dport = 80;
	k->proto = 6;
}

SEC("tc")
int bench_ct_miss(struct __sk_buff *skb)
{
	struct lace_ct4_key k;

	fresh_key(&k);
	return bpf_map_lookup_elem(&bench_ct, &k) ? 1 : 0;
}

SEC("tc")
int bench_ct_insert(struct __sk_buff *skb)
{
	struct lace_ct_entry e = { .state = 1 };
	struct lace_ct4_key k;

	fresh_key(&k);
	return bpf_map_update_elem(&bench_ct, &k, &e, BPF_ANY) ? 1 : 0;
}

SEC("tc")
int bench_ct_hit(struct __sk_buff *skb)
{
	struct lace_ct4_key k = bench_keys.hit_key;

	return bpf_map_lookup_elem(&bench_ct, &k) ? 0 : 1;
}

SEC("tc")
int bench_coarse_clock(struct __sk_buff *skb)
{
	return bpf_ktime_get_coarse_ns() ? 0 : 1;
}

/* the walk's clock (lib/clock.h): the tick count and a per-CPU reading of the coarse clock */
SEC("tc")
int bench_walk_clock(struct __sk_buff *skb)
{
	return ct_now() ? 0 : 1;
}
