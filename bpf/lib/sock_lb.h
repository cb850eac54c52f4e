/* Socket-level service translation for processes in the node's host namespace (cgroup socket
 * hooks, no per-packet NAT): connect and sendmsg to a frontend are rewritten to a backend chosen
 * by lib/backend_select.h; recvmsg and getpeername show the frontend again through sock-revnat.
 *
 * The host counts as the default network: frontends are looked up with source network
 * LACE_NETWORK_DEFAULT. Its ClientIP affinity identity is the node's own address of the
 * frontend's family (config: addr4 for IPv4, the underlay address for IPv6), the source a
 * per-packet path would see for host traffic, so every host process shares one affinity entry per
 * service. There is no source port at connect time: the selection hash is the socket cookie's,
 * so one socket always lands on the same backend while the backend set stays the same.
 *
 * An IPv4 frontend reached from an IPv6 socket through an IPv4-mapped address (::ffff:a.b.c.d)
 * is translated like an IPv4 one and written back mapped. */
#ifndef LACE_LIB_SOCK_LB_H
#define LACE_LIB_SOCK_LB_H

#include "lib/common.h"
#include "lib/maps.h"
#include "lib/trace.h"
#include "lib/backend_select.h"

#define LACE_ECONNREFUSED 111

/* cgroup sock_addr verdicts: proceed, or fail the call with the error set by bpf_set_retval
 * (EPERM when none is set). */
#define SOCK_PROCEED 1
#define SOCK_REJECT  0

/* An address as a socket hook sees it, in lace's key form (IPv4 in the first 4 bytes). */
struct sock_lb_addr {
	__u8   addr[16];
	__be16 port;
	__u8   family;  /* LACE_FAMILY_* */
	__u8   mapped;  /* read from an IPv6 hook as ::ffff:a.b.c.d */
};

static __always_inline int ip6_is_v4mapped(const __u32 *w)
{
	return w[0] == 0 && w[1] == 0 && w[2] == bpf_htonl(0x0000ffff);
}

/* The user address of ctx (destination of connect/sendmsg, source of recvmsg, peer of
 * getpeername). The context only allows 4-byte loads of these fields. */
static __always_inline void sock_lb_read(struct bpf_sock_addr *ctx, int v6, struct sock_lb_addr *a)
{
	__u32 w[4];

	__builtin_memset(a, 0, sizeof(*a));
	a->port = (__be16)ctx->user_port;
	if (!v6) {
		w[0] = ctx->user_ip4;
		__builtin_memcpy(a->addr, &w[0], 4);
		a->family = LACE_FAMILY_IPV4;
		return;
	}
	w[0] = ctx->user_ip6[0];
	w[1] = ctx->user_ip6[1];
	w[2] = ctx->user_ip6[2];
	w[3] = ctx->user_ip6[3];
	if (ip6_is_v4mapped(w)) {
		__builtin_memcpy(a->addr, &w[3], 4);
		a->family = LACE_FAMILY_IPV4;
		a->mapped = 1;
		return;
	}
	__builtin_memcpy(a->addr, w, 16);
	a->family = LACE_FAMILY_IPV6;
}

/* Write addr:port of family into ctx's user address, mapped into IPv6 when the hook is v6. */
static __always_inline void sock_lb_write(struct bpf_sock_addr *ctx, int v6, const __u8 *addr,
					  __be16 port, __u8 family)
{
	__u32 w[4];

	__builtin_memcpy(w, addr, 16);
	if (!v6) {
		ctx->user_ip4 = w[0];
	} else if (family == LACE_FAMILY_IPV4) {
		ctx->user_ip6[0] = 0;
		ctx->user_ip6[1] = 0;
		ctx->user_ip6[2] = bpf_htonl(0x0000ffff);
		ctx->user_ip6[3] = w[0];
	} else {
		ctx->user_ip6[0] = w[0];
		ctx->user_ip6[1] = w[1];
		ctx->user_ip6[2] = w[2];
		ctx->user_ip6[3] = w[3];
	}
	ctx->user_port = (__u32)port;
}

/* The host's affinity key for service_id: the node's own address of the family. */
static __always_inline void sock_lb_client(struct lace_affinity_key *k, __u32 service_id, __u8 family)
{
	struct lace_config *cfg;
	__u32 zero = 0;

	__builtin_memset(k, 0, sizeof(*k));
	k->service_id = service_id;
	k->network = LACE_NETWORK_DEFAULT;
	k->family = family;
	cfg = bpf_map_lookup_elem(&lace_config, &zero);
	if (!cfg)
		return;
	if (family == LACE_FAMILY_IPV4)
		__builtin_memcpy(k->addr, cfg->addr4, 4);
	else
		lace_copy16(k->addr, cfg->underlay_addr);
}

/* connect (TCP, UDP) and unconnected UDP sendmsg: rewrite a frontend destination to a backend
 * and remember the frontend for this socket; fail with ECONNREFUSED when no backend is active;
 * leave every other destination alone. */
static __always_inline int sock_lb_translate(struct bpf_sock_addr *ctx, int v6)
{
	struct lace_sock_revnat_key rk = {};
	struct lace_sock_revnat rv = {};
	struct lace_service_key key = {};
	struct lace_affinity_key client;
	struct lace_service *fe;
	struct lace_backend *b;
	struct sock_lb_addr dst;
	__u32 proto = ctx->protocol, backend_id = 0;
	__u64 cookie;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return SOCK_PROCEED;
	sock_lb_read(ctx, v6, &dst);
	key.network = LACE_NETWORK_DEFAULT;
	lace_copy16(key.addr, dst.addr);
	key.port = dst.port;
	key.proto = proto;
	key.family = dst.family;
	fe = lb_frontend(&key);
	if (!fe)
		return SOCK_PROCEED;
	cookie = bpf_get_socket_cookie(ctx);
	sock_lb_client(&client, fe->service_id, dst.family);
	b = lb_select(&key, fe, &client, lb_hash64(cookie), &backend_id);
	if (!b) {
		metrics_count(LACE_DROP_SERVICE_NO_BACKEND, LACE_POINT_SOCK, LACE_VERDICT_DROP, 0);
		bpf_set_retval(-LACE_ECONNREFUSED);
		return SOCK_REJECT;
	}
	rk.cookie = cookie;
	lace_copy16(rk.addr, b->addr);
	rk.port = b->port;
	rk.family = b->family;
	lace_copy16(rv.addr, dst.addr);
	rv.port = dst.port;
	rv.family = dst.family;
	rv.service_id = fe->service_id;
	bpf_map_update_elem(&lace_sk_revnat, &rk, &rv, BPF_ANY);
	sock_lb_write(ctx, v6, b->addr, b->port, b->family);
	metrics_count(LACE_DROP_NONE, LACE_POINT_SOCK, LACE_VERDICT_FORWARD, 0);
	return SOCK_PROCEED;
}

/* recvmsg (a datagram's source) and getpeername: a backend this socket was translated to is
 * shown as the frontend it asked for. These hooks cannot fail the call. */
static __always_inline int sock_lb_reverse(struct bpf_sock_addr *ctx, int v6)
{
	struct lace_sock_revnat_key rk = {};
	struct lace_sock_revnat *rv;
	struct sock_lb_addr src;

	sock_lb_read(ctx, v6, &src);
	rk.cookie = bpf_get_socket_cookie(ctx);
	lace_copy16(rk.addr, src.addr);
	rk.port = src.port;
	rk.family = src.family;
	rv = bpf_map_lookup_elem(&lace_sk_revnat, &rk);
	if (rv && rv->family == src.family)
		sock_lb_write(ctx, v6, rv->addr, rv->port, rv->family);
	return SOCK_PROCEED;
}

#endif
