/* masquerade: the node ports a masqueraded pod flow leaves with (kept in the conntrack tables as
 * MASQ port reservations, see conntrack.h). */
#ifndef LACE_ABI_MASQUERADE_H
#define LACE_ABI_MASQUERADE_H

/* A masqueraded flow leaves from the node's address (config.h: addr4 for IPv4, underlay_addr for
 * IPv6) and a port of [PORT_MIN, PORT_MIN + PORT_COUNT), TCP and UDP alike; an ICMP echo gets an
 * identifier of the same range. A port is taken per (protocol, node address, remote address, remote
 * port), so the range is per destination, not per node. The node's own sockets must keep their
 * ephemeral ports below PORT_MIN (net.ipv4.ip_local_port_range, which IPv6 uses too): a reply to
 * one of them must never match a reservation.
 *
 * Allocation, by hash h (the 32-bit flow hash of the pod's tuple, lib/service.h
 * service_flow_hash, which lace.datapath.maglev.flow_hash mirrors):
 *   candidate i (0 <= i < TRIES) = PORT_MIN + ((start + i * stride) mod PORT_COUNT)
 *   start = h mod PORT_COUNT, stride = ((h >> 16) mod PORT_COUNT) | 1
 * PORT_COUNT is a power of two and the stride odd, so the candidates are distinct ports. The
 * first candidate whose reservation can be inserted (BPF_NOEXIST) is taken; one held by an expired
 * entry, or already by this very pod flow, is taken over. When all TRIES are held by live flows of
 * other pods, the packet is dropped with NAT_FAILED (masquerade port space exhausted). */
#define LACE_MASQ_PORT_MIN   49152
#define LACE_MASQ_PORT_COUNT 16384
#define LACE_MASQ_TRIES      32

#endif
