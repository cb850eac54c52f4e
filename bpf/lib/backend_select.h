/* Choosing a service backend for a new flow, by the rules of abi/services.h.
 *
 * The frontend is slot 0 of (source network, address, port, protocol, family). A new flow goes to:
 *   1. the backend an unexpired ClientIP affinity entry of (service, client) names, when the
 *      frontend has LACE_SVC_F_AFFINITY and that backend is still active;
 *   2. else entry hash % LACE_MAGLEV_SIZE of the frontend's Maglev table, when it has one;
 *   3. else active slot 1 + hash % active_count.
 * Terminating slots (active_count < slot <= backend_count) never take new flows; a frontend with
 * no active slot has no backend. The caller supplies the hash: a packet path hashes its tuple, the
 * socket hooks (which run before there is a source port) hash the socket cookie. */
#ifndef LACE_LIB_BACKEND_SELECT_H
#define LACE_LIB_BACKEND_SELECT_H

#include "lib/common.h"
#include "lib/maps.h"

/* The largest Maglev table number whose entries fit in a u32 index. */
#define LACE_MAGLEV_TABLE_LIMIT (0xffffffffu / LACE_MAGLEV_SIZE - 1)

/* MurmurHash3's 64-bit finaliser (fmix64): a bijection on 64-bit values in which every input bit
 * affects every output bit. */
static __always_inline __u64 lb_mix64(__u64 x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return x;
}

/* Mixes a 64-bit value into 32 well-spread bits (fmix64, then folded). */
static __always_inline __u32 lb_hash64(__u64 x)
{
	x = lb_mix64(x);
	return (__u32)(x ^ (x >> 32));
}

/* The frontend for key (its slot must be 0), or NULL when the address is not a service. */
static __always_inline struct lace_service *lb_frontend(const struct lace_service_key *key)
{
	return bpf_map_lookup_elem(&lace_services, key);
}

static __always_inline struct lace_backend *lb_backend(__u32 backend_id, __u8 family)
{
	struct lace_backend_key k = { .backend_id = backend_id };
	struct lace_backend *b;

	if (!backend_id)
		return NULL;
	b = bpf_map_lookup_elem(&lace_backends, &k);
	if (!b || b->family != family)
		return NULL;
	return b;
}

/* The backend ID rule 1 gives, refreshing the entry's last use; 0 when there is none. */
static __always_inline __u32 lb_affinity_get(const struct lace_affinity_key *k, __u32 timeout_s,
					     __u8 family, __u64 now)
{
	struct lace_affinity *a = bpf_map_lookup_elem(&lace_affinity, k);
	struct lace_backend *b;

	if (!a)
		return 0;
	/* an entry from the future (a clock mismatch) counts as expired, like an old one */
	if (now - a->last_used_ns > (__u64)timeout_s * NSEC_PER_SEC)
		return 0;
	b = lb_backend(a->backend_id, family);
	if (!b || !(b->flags & LACE_BACKEND_F_ACTIVE))
		return 0;
	a->last_used_ns = now;
	return a->backend_id;
}

/* The backend ID rules 2 and 3 give; 0 when the frontend has no active backend. key is the
 * frontend's key: its slot is used for the lookup and set back to 0. */
static __always_inline __u32 lb_pick(struct lace_service_key *key, const struct lace_service *fe,
				     __u32 hash)
{
	struct lace_service *slot;
	__u16 active = fe->active_count;
	__u32 table = fe->maglev, idx, *id;

	if (!active)
		return 0;
	if (table && table <= LACE_MAGLEV_TABLE_LIMIT) {
		idx = table * LACE_MAGLEV_SIZE + hash % LACE_MAGLEV_SIZE;
		id = bpf_map_lookup_elem(&lace_maglev, &idx);
		if (id && *id)
			return *id;
	}
	key->slot = 1 + hash % active;
	slot = bpf_map_lookup_elem(&lace_services, key);
	key->slot = 0;
	return slot ? slot->backend_id : 0;
}

/* The backend for a new flow of frontend fe (found under key) from client, with its ID in
 * *backend_id; NULL when there is no active backend (or the maps name a missing one). *pinned
 * says whether an affinity entry chose it (and was refreshed); otherwise a frontend with
 * affinity should remember the choice with lb_affinity_set once the flow is admitted. */
static __always_inline struct lace_backend *lb_choose(struct lace_service_key *key,
						      const struct lace_service *fe,
						      const struct lace_affinity_key *client,
						      __u32 hash, __u32 *backend_id, int *pinned)
{
	__u32 id = 0;

	*pinned = 0;
	if (fe->flags & LACE_SVC_F_AFFINITY) {
		id = lb_affinity_get(client, fe->affinity_timeout, key->family, bpf_ktime_get_coarse_ns());
		*pinned = id != 0;
	}
	if (!*pinned)
		id = lb_pick(key, fe, hash);
	*backend_id = id;
	return lb_backend(id, key->family);
}

/* Pin client to backend_id for the frontend's affinity timeout, from now. */
static __always_inline void lb_affinity_set(const struct lace_affinity_key *client, __u32 backend_id)
{
	struct lace_affinity a = { .last_used_ns = bpf_ktime_get_coarse_ns(), .backend_id = backend_id };

	bpf_map_update_elem(&lace_affinity, client, &a, BPF_ANY);
}

/* lb_choose, remembering a new affinity choice at once (the socket hooks: nothing can refuse the
 * connection after the choice). */
static __always_inline struct lace_backend *lb_select(struct lace_service_key *key,
						      const struct lace_service *fe,
						      const struct lace_affinity_key *client,
						      __u32 hash, __u32 *backend_id)
{
	struct lace_backend *b;
	int pinned;

	b = lb_choose(key, fe, client, hash, backend_id, &pinned);
	if (b && !pinned && (fe->flags & LACE_SVC_F_AFFINITY))
		lb_affinity_set(client, *backend_id);
	return b;
}

#endif
