// SPDX-License-Identifier: GPL-2.0
/* A small object for the lace.bpf loader tests (tests/integration/test_loader.py).
 *
 * Built as is by `make bpf`; the tests also compile variants of it:
 *   -DVARIANT=2      lt_hash value grows 96 -> 104 bytes and doubles in capacity,
 *                    lt_rekeyed's key grows 4 -> 8 bytes (entries cannot be carried over)
 *   -DBAD_PROGRAM    adds a program the verifier rejects (unchecked packet access)
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#define TC_ACT_OK 0
#define TC_ACT_SHOT 2

#ifndef VARIANT
#define VARIANT 1
#endif

/* 20-byte key, 96-byte value (104 in variant 2): the shape of the dump benchmark. */
struct lt_key {
	__u8 addr[16];
	__u32 id;
};

struct lt_value {
	__u64 packets;
	__u64 bytes;
	__u8 blob[80];
#if VARIANT == 2
	__u64 added; /* additive ABI change: old entries read it as zero */
#endif
};

/* Pinned hash: reused across loads, migrated when its definition changes. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lt_key);
	__type(value, struct lt_value);
#if VARIANT == 2
	__uint(max_entries, 2048);
#else
	__uint(max_entries, 1024);
#endif
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lt_hash SEC(".maps");

/* Pinned hash whose key changes in variant 2. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
#if VARIANT == 2
	__type(key, __u64);
#else
	__type(key, __u32);
#endif
	__type(value, __u64);
	__uint(max_entries, 64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lt_rekeyed SEC(".maps");

/* Packet counters: [0] counted by lt_count, [1] by lt_count_v2. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 4);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lt_counter SEC(".maps");

struct lt_lpm_key {
	__u32 prefixlen;
	__u8 addr[4];
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct lt_lpm_key);
	__type(value, __u32);
	__uint(max_entries, 64);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} lt_lpm SEC(".maps");

struct lt_pcpu_value {
	__u32 runs;
	__u32 last_len; /* 8 bytes: already a multiple of 8 */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct lt_pcpu_value);
	__uint(max_entries, 2);
} lt_percpu SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__type(key, __u32);
	__type(value, __u32); /* 4 bytes: padded to 8 per CPU */
	__uint(max_entries, 16);
} lt_percpu_hash SEC(".maps");

struct lt_event {
	__u32 magic;
	__u32 len;
	__u64 seq;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096 * 4);
} lt_events SEC(".maps");

/* Set by the loader tests through the map: next sequence number of an event. */
static __u64 event_seq;

static __always_inline void count(__u32 slot)
{
	__u64 *c = bpf_map_lookup_elem(&lt_counter, &slot);

	if (c)
		__sync_fetch_and_add(c, 1);
}

SEC("tc")
int lt_count(struct __sk_buff *skb)
{
	count(0);
	return TC_ACT_OK;
}

SEC("tc")
int lt_count_v2(struct __sk_buff *skb)
{
	count(1);
	return TC_ACT_OK;
}

/* Emits one ring buffer event per run and records the run in the per-CPU map. */
SEC("tc")
int lt_emit(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct lt_pcpu_value *pv = bpf_map_lookup_elem(&lt_percpu, &zero);
	struct lt_event *ev;

	if (pv) {
		pv->runs++;
		pv->last_len = skb->len;
	}
	ev = bpf_ringbuf_reserve(&lt_events, sizeof(*ev), 0);
	if (!ev)
		return TC_ACT_SHOT;
	ev->magic = 0x1ace;
	ev->len = skb->len;
	ev->seq = __sync_fetch_and_add(&event_seq, 1);
	bpf_ringbuf_submit(ev, 0);
	return TC_ACT_OK;
}

/* Looks up the first 4 bytes of the IPv4 destination (offset 30) in the LPM trie. */
SEC("tc")
int lt_lpm_lookup(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct lt_lpm_key key = { .prefixlen = 32 };
	__u32 *v;

	if (data + 34 > end)
		return TC_ACT_SHOT;
	__builtin_memcpy(key.addr, data + 30, 4);
	v = bpf_map_lookup_elem(&lt_lpm, &key);
	return v ? (int)*v : -1;
}

#ifdef BAD_PROGRAM
/* Reads the packet without a bounds check: the verifier must reject it. */
SEC("tc")
int lt_bad(struct __sk_buff *skb)
{
	return *(__u32 *)(long)skb->data;
}
#endif

char LICENSE[] SEC("license") = "GPL";
