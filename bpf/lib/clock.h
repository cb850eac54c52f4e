/* The walk's clock, for conntrack's timeouts: CLOCK_MONOTONIC_COARSE nanoseconds, read once per
 * tick on each CPU. The agent and the CLI compare conntrack's times with their CLOCK_MONOTONIC.
 *
 * Reading the coarse clock is a helper call, ~15 ns of an established packet's ~140 on a 2-core VM
 * (bench/datapath.py's floor lines); reading the kernel's tick counter costs ~1, because the
 * verifier inlines bpf_jiffies64 into a load of jiffies_64. The coarse clock only moves when the
 * tick updates the timekeeper, which is also when jiffies move: so each CPU keeps the coarse time
 * it read with the tick count beside it, and reads the clock again only when the count has moved.
 * Between two ticks the answer is what the clock said at the first packet of the tick on that CPU:
 * behind the clock by at most the one step the timekeeper may take later in the same tick (its
 * interval and the tick's are not in phase), a tick (<= 10 ms at HZ 100) at worst — nothing against
 * timeouts of seconds. A CPU that slept through ticks finds the count moved (the kernel brings
 * jiffies and the timekeeper up to date on the interrupt that wakes it, before the packet's
 * softirq runs). */
#ifndef LACE_LIB_CLOCK_H
#define LACE_LIB_CLOCK_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

struct lace_clock {
	__u64 jiffies;          /* jiffies_64 when ns was read */
	__u64 ns;               /* bpf_ktime_get_coarse_ns() then */
};

/* Per CPU, like lace_scratch, and not pinned: each object keeps its own. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lace_clock);
} lace_clock SEC(".maps");

static __always_inline __u64 ct_now(void)
{
	__u32 zero = 0;
	struct lace_clock *c = bpf_map_lookup_elem(&lace_clock, &zero);
	__u64 j = bpf_jiffies64();

	if (!c)
		return bpf_ktime_get_coarse_ns();
	if (c->jiffies != j) {
		c->ns = bpf_ktime_get_coarse_ns();
		c->jiffies = j;
	}
	return c->ns;
}

#endif
