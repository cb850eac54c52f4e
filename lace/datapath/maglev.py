"""Maglev lookup tables and the flow hash the datapath picks backends with (C: lib/service.h).

**Tables** (Eisenbud et al., "Maglev: A Fast and Reliable Software Network Load Balancer",
NSDI 2016, section 3.4): every backend owns a permutation of the table's positions, given by an
``offset`` and a ``skip`` drawn from two hashes of its *name*; backends take turns claiming the next
free position of their own permutation until the table is full. Each backend ends up with
``size / N`` entries (give or take one), and removing one backend moves little more than the
entries it held, because every other backend keeps claiming positions in the same order.

Names are stable identities ("network/address/port/proto", "ns/pod:port"), never the per-node
backend IDs: every node then builds the same table for the same backends, so a flow whose
conntrack entry is lost (or that moves nodes) still lands on the same backend. The name hashes are
BLAKE2b (not Python's per-process ``hash``), the same on every node and in every process.

**Flow hash** (:func:`flow_hash`): the datapath hashes a new flow's tuple, takes entry
``hash % MAGLEV_SIZE`` of the frontend's table, or slot ``1 + hash % active_count`` when the
frontend has no table (:func:`pick`). Both are the C ones (``service_flow_hash`` in
lib/service.h, ``lb_pick`` in lib/backend_select.h) bit for bit, so tests and ``lace policy
trace`` can predict the backend of any tuple.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import struct
from array import array
from collections.abc import Sequence

from lace.datapath.common import AddressLike, addr16, check_port, check_u32
from lace.datapath.services import MAGLEV_SIZE

__all__ = ["table", "table_bytes", "flow_hash", "pick", "mix64", "FLOW_HASH_SEED"]

_M64 = (1 << 64) - 1
_U32 = struct.Struct("=I")   # the machine's byte order, as the map (and array("I")) holds it


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True


def _permutation(name: str, size: int) -> tuple[int, int]:
    """(offset, skip) of a backend: position j of its permutation is (offset + j * skip) % size."""
    d = hashlib.blake2b(name.encode(), digest_size=16, person=b"lace-maglev").digest()
    h1, h2 = struct.unpack("<QQ", d)
    return h1 % size, h2 % (size - 1) + 1


def table(backends: Sequence[tuple[str, int]], size: int = MAGLEV_SIZE) -> list[int]:
    """The Maglev table of ``backends`` — (stable name, backend ID) pairs — as ``size`` backend IDs.

    The result does not depend on the order of ``backends`` (they are taken in name order) nor
    on the process. ``size`` must be a prime (every skip then walks all positions); IDs must be
    non-zero (0 is "no backend" in the maglev map). No backends: a table of zeros.
    """
    return list(array("I", table_bytes(backends, size)))


def table_bytes(backends: Sequence[tuple[str, int]], size: int = MAGLEV_SIZE) -> bytes:
    """:func:`table` as the map holds it: ``size`` u32 backend IDs in the machine's byte order."""
    if not _is_prime(size):
        raise ValueError(f"Maglev table size {size} is not a prime")
    pairs = sorted(backends)
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise TypeError(f"Maglev backends are (name, backend ID) pairs, not {pair!r}")
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        raise ValueError("Maglev backend names must be unique")
    ids = [check_u32(bid, "backend ID") for _, bid in pairs]
    if 0 in ids:
        raise ValueError("backend ID 0 means no backend; it cannot be in a Maglev table")
    n = len(ids)
    if n <= 1:
        return _U32.pack(ids[0] if ids else 0) * size
    perms = [_permutation(name, size) for name in names]
    fill = _native_fill()
    if fill is not None:
        u32s = ctypes.c_uint32 * n
        out = (ctypes.c_uint32 * size)()
        if fill(u32s(*(o for o, _ in perms)), u32s(*(k for _, k in perms)), u32s(*ids), n, size, out) == 0:
            return bytes(out)
    return array("I", _fill(perms, ids, size)).tobytes()


@functools.cache
def _native_fill():
    """The fill in C (native/maglev.c, built by ``make native`` into build/native), or None when
    it is not built: the Python fill below gives the same table, slower."""
    from lace.datapath.registry import bpf_dir

    try:
        lib = ctypes.CDLL(str(bpf_dir().parent / "native" / "libmaglev.so"))
    except OSError:
        return None
    fn = lib.lace_maglev_fill
    u32p = ctypes.POINTER(ctypes.c_uint32)
    fn.argtypes = [u32p, u32p, u32p, ctypes.c_uint32, ctypes.c_uint32, u32p]
    fn.restype = ctypes.c_int
    return fn


def _fill(perms: list[tuple[int, int]], ids: list[int], size: int) -> list[int]:
    """The round-robin fill in Python: the reference for the C one."""
    entry = [0] * size
    # Round-robin fill. Each backend's state is [next candidate, skip, ID]: the candidate walks
    # its permutation by adding skip modulo size (no offset + j * skip products), past positions
    # already claimed; unpacking one small list per turn is the cheapest state access in CPython.
    state = [[offset, skip, bid] for (offset, skip), bid in zip(perms, ids)]
    filled = 0
    while True:
        for st in state:
            c, s, bid = st
            while entry[c]:
                c += s
                if c >= size:
                    c -= size
            entry[c] = bid
            c += s
            if c >= size:
                c -= size
            st[0] = c
            filled += 1
            if filled == size:
                return entry


# -- the flow hash ------------------------------------------------------------------------------

#: fixed, never random per boot: a flow must hash the same on every node and after a restart
FLOW_HASH_SEED = 0x6C61636500000000   # "lace" in the high bytes


def mix64(x: int) -> int:
    """MurmurHash3's 64-bit finaliser (fmix64): a bijection on 64-bit values, every bit of the
    input affecting every bit of the output."""
    x &= _M64
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & _M64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & _M64
    x ^= x >> 33
    return x


_FLOW_INPUT = struct.Struct("<16s16s2s2sI")   # the 40 bytes hashed, as C lays them out


def flow_hash(network: int, saddr: AddressLike, daddr: AddressLike, sport: int, dport: int, proto: int) -> int:
    """The 32-bit hash the datapath gives a new flow to a frontend (C: ``service_flow_hash``).

    Input: 40 bytes — source address, destination address (16 bytes each, an IPv4 address in the
    first 4, the rest zero), source and destination port in network byte order, and the source
    network as a little-endian u32 — read as five little-endian u64 words w0..w4. Then::

        h = FLOW_HASH_SEED ^ proto
        for w in w0..w4:  h = fmix64(h ^ w)
        hash = (h ^ (h >> 32)) & 0xffffffff
    """
    fam_s, s = addr16(saddr)
    fam_d, d = addr16(daddr)
    if fam_s != fam_d:
        raise ValueError(f"{saddr} and {daddr} are not of one family")
    raw = _FLOW_INPUT.pack(s, d, check_port(sport).to_bytes(2, "big"), check_port(dport).to_bytes(2, "big"),
                           check_u32(network, "network"))
    h = FLOW_HASH_SEED ^ (int(proto) & 0xFF)
    for (w,) in struct.iter_unpack("<Q", raw):
        h = mix64(h ^ w)
    return (h ^ (h >> 32)) & 0xFFFFFFFF


def pick(hash32: int, table: Sequence[int], active: Sequence[int]) -> int:
    """The backend ID a new flow with this hash gets when no affinity entry decides (C: lb_pick):
    entry ``hash % MAGLEV_SIZE`` of the frontend's Maglev ``table`` (its backend IDs; empty: none)
    when that entry is set, else the backend of active slot ``1 + hash % len(active)`` (``active``:
    the IDs of slots 1..active_count); 0 when no backend is active."""
    if not active:
        return 0
    if table:
        if len(table) != MAGLEV_SIZE:
            raise ValueError(f"a Maglev table has {MAGLEV_SIZE} entries, not {len(table)}")
        chosen = table[hash32 % MAGLEV_SIZE]
        if chosen:
            return chosen
    return active[hash32 % len(active)]
