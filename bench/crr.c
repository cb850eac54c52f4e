// SPDX-License-Identifier: Apache-2.0
/* crr: TCP connect/request/response/close, as fast as one thread can, for bench/services.py.
 *
 *   crr server CPU PORT NETNS:ADDR [NETNS:ADDR ...]
 *       one listening socket per backend, each made inside its network namespace (NETNS is a
 *       path such as /run/netns/NAME); every connection gets one byte read and one byte written
 *       back: the backend's index in the argument list, so the client can tell which backend
 *       answered. Prints "ready" once every socket listens, then serves until killed.
 *   crr client CPU NETNS ADDR PORT WARMUP SECONDS
 *       from inside NETNS, loops connect / send 1 byte / read 1 byte / close for WARMUP seconds
 *       (not counted), then SECONDS more, and prints one line:
 *       "conns=N errors=E seconds=S waited=W backends=c0,c1,..." (W: seconds the client waited
 *       for its CPU while counting; c0..: connections answered by each backend).
 *
 * Both pin themselves to CPU and never sleep: the client spins on its non-blocking socket, the
 * server on epoll_wait with a zero timeout. On the 2-vCPU VMs this runs on, waking a thread on the
 * other CPU costs ~40 us (an IPI through the hypervisor; sockperf ping-pong: 48 us one way across
 * CPUs, 10 us on one CPU), and a connection needs several such wake-ups: blocking, the rate was
 * ~5k/s whatever the datapath did. Spinning leaves the cost of the packet path itself, which is
 * what the benchmark compares. One server process serves every backend: spinners sharing a CPU
 * would take turns by the scheduler's time slice.
 *
 * The client closes with SO_LINGER 0 (a RST, no TIME_WAIT): tens of thousands of connections a
 * second to one VIP:port would otherwise use up the ephemeral ports within seconds and measure
 * port exhaustion instead of the service path. The server closes right after answering.
 *
 * The same loop in Python (blocking sockets) reached ~0.7x of this client's rate through the same
 * path, spending the difference in the interpreter on the client's CPU, which is also the CPU that
 * runs the node's forward path for the client's packets: the C client leaves more of the time per
 * connection to the datapath being compared.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_BACKENDS 64

static void die(const char *what)
{
	perror(what);
	exit(1);
}

/* Pin to CPU, and die with the process that started us (a spinning orphan would hold the CPU). */
static void pin(const char *cpu)
{
	cpu_set_t set;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	CPU_ZERO(&set);
	CPU_SET(atoi(cpu), &set);
	if (sched_setaffinity(0, sizeof(set), &set))
		die("sched_setaffinity");
}

static void enter_netns(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0 || setns(fd, CLONE_NEWNET))
		die(path);
	close(fd);
}

static struct sockaddr_in sockaddr(const char *addr, int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };

	if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
		fprintf(stderr, "crr: bad IPv4 address %s\n", addr);
		exit(2);
	}
	return sa;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* epoll data: the fd in bits 32..62, the backend's index in the low half, and bit 63 set for
 * a listening socket. */
#define LISTENER (1ULL << 63)

static int server(int argc, char **argv)
{
	int port = atoi(argv[3]), n = argc - 4, ep, one = 1;
	struct epoll_event ev, evs[256];

	if (n < 1 || n > MAX_BACKENDS) {
		fprintf(stderr, "crr server: 1..%d backends\n", MAX_BACKENDS);
		return 2;
	}
	ep = epoll_create1(EPOLL_CLOEXEC);
	if (ep < 0)
		die("epoll_create1");
	for (int i = 0; i < n; i++) {
		char *spec = argv[4 + i], *colon = strrchr(spec, ':');
		struct sockaddr_in sa;
		int s;

		if (!colon) {
			fprintf(stderr, "crr server: backend %s is not NETNS:ADDR\n", spec);
			return 2;
		}
		*colon = 0;
		enter_netns(spec);
		sa = sockaddr(colon + 1, port);
		s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (s < 0)
			die("socket");
		setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(s, (struct sockaddr *)&sa, sizeof(sa)) || listen(s, 4096))
			die("bind/listen");
		ev.events = EPOLLIN;
		ev.data.u64 = LISTENER | ((unsigned long long)s << 32) | (unsigned)i;
		if (epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev))
			die("epoll_ctl");
	}
	pin(argv[2]);
	printf("ready\n");
	fflush(stdout);
	for (;;) {
		int k = epoll_wait(ep, evs, 256, 0);   /* spin: see the header comment */

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			die("epoll_wait");
		for (int j = 0; j < k; j++) {
			unsigned long long d = evs[j].data.u64;
			int fd = (int)((d >> 32) & 0x7fffffff), idx = (int)(d & 0xffffffff);

			if (d & LISTENER) {
				int c;

				while ((c = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
					ev.events = EPOLLIN;
					ev.data.u64 = ((unsigned long long)c << 32) | (unsigned)idx;
					if (epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev))
						close(c);
				}
				continue;
			}
			char b;
			ssize_t r = read(fd, &b, 1);

			if (r < 0 && errno == EAGAIN)
				continue;
			if (r == 1) {
				b = (char)idx;
				if (write(fd, &b, 1) != 1) { /* the client went away: nothing to answer */ }
			}
			close(fd);  /* also removes it from the epoll set */
		}
	}
}

/* Seconds this thread has spent runnable but not running (another task had its CPU): the second
 * field of /proc/self/schedstat. */
static double run_delay(void)
{
	unsigned long long ran = 0, delay = 0;
	FILE *f = fopen("/proc/thread-self/schedstat", "r");

	if (f) {
		if (fscanf(f, "%llu %llu", &ran, &delay) != 2)
			delay = 0;
		fclose(f);
	}
	return delay / 1e9;
}

#define TIMEOUT 2.0   /* seconds a connection may take before it counts as failed */

/* Connect, write one byte, read one back on non-blocking socket S, spinning (never sleeping)
 * until DEADLINE; 0 once the byte is in *B. */
static int exchange(int s, const struct sockaddr_in *sa, char *b, double deadline)
{
	int err = 0;
	socklen_t len = sizeof(err);
	struct pollfd p = { .fd = s, .events = POLLOUT };

	if (connect(s, (const struct sockaddr *)sa, sizeof(*sa)) && errno != EINPROGRESS)
		return -1;
	while (poll(&p, 1, 0) == 0)
		if (now() > deadline)
			return -1;
	if (getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) || err)
		return -1;
	if (write(s, b, 1) != 1)
		return -1;
	for (;;) {
		ssize_t r = read(s, b, 1);

		if (r == 1)
			return 0;
		if (r == 0 || (errno != EAGAIN && errno != EINTR) || now() > deadline)
			return -1;
	}
}

static int client(char **argv)
{
	struct sockaddr_in sa;
	struct linger lg = { .l_onoff = 1, .l_linger = 0 };
	double warmup = atof(argv[6]), seconds = atof(argv[7]), t0, start, end;
	unsigned long conns = 0, errors = 0, per[256] = { 0 };
	double waited = 0;
	int one = 1, counting = 0, top = 0;

	enter_netns(argv[3]);
	pin(argv[2]);
	sa = sockaddr(argv[4], atoi(argv[5]));
	t0 = now();
	start = t0 + warmup;
	end = start + seconds;
	for (;;) {
		double t = now();
		char b = 'x';
		int s;

		if (t >= end)
			break;
		if (!counting && t >= start) {
			counting = 1;
			waited = run_delay();
			conns = errors = 0;
			memset(per, 0, sizeof(per));
		}
		s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (s < 0)
			die("socket");
		setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
		setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		if (exchange(s, &sa, &b, t + TIMEOUT) == 0) {
			conns++;
			per[(unsigned char)b]++;
			if ((unsigned char)b + 1 > top)
				top = (unsigned char)b + 1;
		} else {
			errors++;
		}
		close(s);
	}
	printf("conns=%lu errors=%lu seconds=%.6f waited=%.6f backends=", conns, errors, now() - start,
	       run_delay() - waited);
	for (int i = 0; i < top; i++)
		printf("%s%lu", i ? "," : "", per[i]);
	printf("\n");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 5 && !strcmp(argv[1], "server"))
		return server(argc, argv);
	if (argc == 8 && !strcmp(argv[1], "client"))
		return client(argv);
	fprintf(stderr, "usage: crr server CPU PORT NETNS:ADDR...\n"
			"       crr client CPU NETNS ADDR PORT WARMUP SECONDS\n");
	return 2;
}
