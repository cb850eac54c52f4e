// SPDX-License-Identifier: GPL-2.0
/* Attach point: a UDP socket iterator (not the datapath). The socket hooks (sock.c) translate a
 * host socket's connect to a frontend once, to a backend, and a connected UDP socket then sends to
 * that backend for as long as it lives: when the backend leaves its service, nothing on the packet
 * path would ever move it (an unconnected socket's sendmsg is translated anew each time). The agent
 * writes the cookies of such sockets here (lace-sk-term: cookie -> the backend it is connected to,
 * from the sock-revnat entries) and reads this iterator once: every UDP socket of the namespace
 * whose cookie is named and that is still connected to that backend is destroyed
 * (bpf_sock_destroy: the socket is disconnected — a receive waiting on it fails with ECONNABORTED,
 * a send without an address with EDESTADDRREQ — so a resolver or a telemetry client connects
 * again and meets the service as it is now), and its
 * cookie is printed, one line each. The same as the kernel does for a TCP socket reset by its peer;
 * the same as kube-proxy's conntrack flush is to a per-packet path. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_tracing.h>

#include "lace/abi/common.h"
#include "lace/abi/services.h"

char LICENSE[] SEC("license") = "GPL";

#define LACE_AF_INET  2
#define LACE_AF_INET6 10

extern int bpf_sock_destroy(struct sock_common *sk) __ksym;

/* lace-sk-term: written by the agent before a run, emptied after (never pinned). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LACE_SOCK_REVNAT_MAX);
	__type(key, __u64);                      /* the socket's cookie */
	__type(value, struct lace_sock_term);
} lace_sk_term SEC(".maps");

/* Whether sk is connected to t's address and port (an IPv4 backend of an IPv6 socket through an
 * IPv4-mapped address counts). */
static __always_inline int connected_to(const struct sock *sk, const struct lace_sock_term *t)
{
	const struct sock_common *c = &sk->__sk_common;
	__u32 w[4], a[4];

	if (c->skc_dport != t->port)
		return 0;
	__builtin_memcpy(a, t->addr, 16);
	if (c->skc_family == LACE_AF_INET)
		return t->family == LACE_FAMILY_IPV4 && c->skc_daddr == a[0];
	if (c->skc_family != LACE_AF_INET6)
		return 0;
	__builtin_memcpy(w, &c->skc_v6_daddr, 16);
	if (t->family == LACE_FAMILY_IPV4)
		return w[0] == 0 && w[1] == 0 && w[2] == bpf_htonl(0x0000ffff) && w[3] == a[0];
	return w[0] == a[0] && w[1] == a[1] && w[2] == a[2] && w[3] == a[3];
}

SEC("iter/udp")
int lace_sock_terminate(struct bpf_iter__udp *ctx)
{
	struct udp_sock *udp = ctx->udp_sk;
	struct lace_sock_term *t;
	struct sock *sk;
	__u64 cookie;

	if (!udp)
		return 0;       /* the end of the walk */
	sk = (struct sock *)udp;
	/* set: the socket hooks asked for it when they translated this socket */
	cookie = sk->__sk_common.skc_cookie.counter;
	t = bpf_map_lookup_elem(&lace_sk_term, &cookie);
	if (!t || !connected_to(sk, t))
		return 0;
	bpf_sock_destroy((struct sock_common *)sk);
	BPF_SEQ_PRINTF(ctx->meta->seq, "%llu\n", cookie);
	return 0;
}
