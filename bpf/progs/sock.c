// SPDX-License-Identifier: GPL-2.0
/* Attach point: the cgroup socket hooks of the node's host cgroup (processes in the node's host
 * namespace: hostNetwork pods, the node's own tools; pods are not in it and are served by the tc
 * path of their own network). Frontends are translated at connect/sendmsg time and shown again at
 * recvmsg/getpeername time; see lib/sock_lb.h. A connect of the kubelet's cgroup to a probe target
 * of another network is recorded by socket cookie first (and not translated); the socket's release
 * forgets it; see lib/probe.h. */
#include "lib/common.h"
#include "lib/maps.h"
#include "lib/sock_lb.h"
#include "lib/probe.h"

char LICENSE[] SEC("license") = "GPL";

SEC("cgroup/connect4")
int lace_sock_connect4(struct bpf_sock_addr *ctx)
{
	if (probe_connect(ctx, 0))
		return SOCK_PROCEED;
	return sock_lb_translate(ctx, 0);
}

SEC("cgroup/connect6")
int lace_sock_connect6(struct bpf_sock_addr *ctx)
{
	if (probe_connect(ctx, 1))
		return SOCK_PROCEED;
	return sock_lb_translate(ctx, 1);
}

SEC("cgroup/sendmsg4")
int lace_sock_sendmsg4(struct bpf_sock_addr *ctx)
{
	return sock_lb_translate(ctx, 0);
}

SEC("cgroup/sendmsg6")
int lace_sock_sendmsg6(struct bpf_sock_addr *ctx)
{
	return sock_lb_translate(ctx, 1);
}

SEC("cgroup/recvmsg4")
int lace_sock_recvmsg4(struct bpf_sock_addr *ctx)
{
	return sock_lb_reverse(ctx, 0);
}

SEC("cgroup/recvmsg6")
int lace_sock_recvmsg6(struct bpf_sock_addr *ctx)
{
	return sock_lb_reverse(ctx, 1);
}

SEC("cgroup/getpeername4")
int lace_sock_getpeername4(struct bpf_sock_addr *ctx)
{
	return sock_lb_reverse(ctx, 0);
}

SEC("cgroup/getpeername6")
int lace_sock_getpeername6(struct bpf_sock_addr *ctx)
{
	return sock_lb_reverse(ctx, 1);
}

SEC("cgroup/sock_release")
int lace_sock_release(struct bpf_sock *ctx)
{
	probe_release(ctx);
	return 1;   /* the verdict of a release is ignored; 1 is the one the verifier expects */
}
