"""``node ct list``'s text: one compact line per entry, then each table's pressure and the total."""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

import numpy as np

from lace import textcols as C
from lace.cli.node.resolve import NumericResolver
from lace.cli.render import human_duration, pressure
from lace.datapath.common import Proto, enum_label, flag_labels
from lace.datapath.conntrack import CtFlag, CtState, tcp_flag_labels
from lace.datapath.delivery import DeliveryKind

if TYPE_CHECKING:
    from lace.cli.node.ct_dump import CtDump


def _ep(addr: str, port: int, family: int, proto: int) -> str:
    a = f"[{addr}]" if family == 6 else addr
    return a if proto in (Proto.ICMP, Proto.ICMPV6) else f"{a}:{port}"


def _bytes(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1000  # type: ignore[assignment]
    return str(n)


def entry_lines(t: CtDump, now: int, res: NumericResolver) -> list[str]:
    """One compact line per entry: proto, client -> [VIP ->] backend, network, state, direction,
    counters both ways, age and time left, flags."""
    k, v = t.keys, t.vals
    if t.count == 0:
        return []
    saddr = C.ip(k["saddr"], t.family).tolist()
    daddr = C.ip(k["daddr"], t.family).tolist()
    nat_addr = C.ip(v["nat_addr"], t.family).tolist()
    net_names = {int(x): res.network(int(x)) for x in np.unique(k["network"]).tolist()}
    lines = []
    kl, vl = k.tolist(), v.tolist()
    kn, vn = k.dtype.names, v.dtype.names
    for i in range(t.count):
        kk = dict(zip(kn, kl[i]))
        vv = dict(zip(vn, vl[i]))
        proto = kk["proto"]
        src = _ep(saddr[i], kk["sport"], t.family, proto)
        dst = _ep(daddr[i], kk["dport"], t.family, proto)
        flags = vv["flags"]
        nat = _ep(nat_addr[i], vv["nat_port"], t.family, proto)
        if flags & CtFlag.SERVICE:     # a service flow, keyed by the frontend: the backend it was sent to
            tup = f"{src} → {dst} → {nat}"
        elif flags & CtFlag.DNAT:      # a probe's backend entry: the frontend replies come from
            tup = f"{src} → {nat} → {dst}"
        elif flags & CtFlag.SNAT:
            tup = f"{src} → {dst} (snat as {nat})"
        elif flags & CtFlag.MASQ:
            tup = f"{src} → {dst} (masquerade port of {nat})"
        else:
            tup = f"{src} → {dst}"
        if not res.numeric:
            sp, dp = res.pod_for_ip(kk["network"], saddr[i]), res.pod_for_ip(kk["network"], daddr[i])
            if sp or dp:
                tup += f"  [{sp or '-'} → {dp or '-'}]"
        left = (vv["expires_ns"] - now) / 1e9
        age = max(0.0, (now - vv["created_ns"]) / 1e9)
        state = enum_label(CtState, vv["state"])
        deliv = enum_label(DeliveryKind, vv["delivery"])
        fl = ",".join(x for x in flag_labels(CtFlag, flags) if x not in ("dnat", "snat", "service", "masq"))
        tcpf = ""
        if proto == Proto.TCP:
            tcpf = f" tcp {'/'.join(tcp_flag_labels(vv['tcp_flags_fwd'])) or '-'}|" \
                   f"{'/'.join(tcp_flag_labels(vv['tcp_flags_rev'])) or '-'}"
        lines.append(
            f"{enum_label(Proto, proto)!s:<5} {tup}  net {net_names[kk['network']]}  {state}  →{deliv}  "
            f"fwd {vv['packets_fwd']}p/{_bytes(vv['bytes_fwd'])} rev {vv['packets_rev']}p/{_bytes(vv['bytes_rev'])}  "
            f"age {human_duration(age)} "
            + (f"left {human_duration(left)}" if left > 0 else f"expired {human_duration(-left)} ago")
            + (f"  [{fl}]" if fl else "") + tcpf)
    return lines


def write(out: TextIO, tables: list[CtDump], shown: list[CtDump], total: int, n_shown: int, now: int,
          res: NumericResolver) -> None:
    """The ``shown`` entries of every table as lines, then each table's pressure and the total."""
    for full, t in zip(tables, shown):
        if full.count == 0:
            continue
        if t.count:
            out.write(f"# {t.name}\n")
            out.write("\n".join(entry_lines(t, now, res)) + "\n")
    for t in tables:
        if t.count == 0:
            out.write(f"{t.name}: empty (capacity {t.capacity})\n")
        else:
            out.write(f"{t.name}: {pressure(t.count, t.capacity)}\n")
    if n_shown < total:
        out.write(f"showing {n_shown} of {total} entries (--limit)\n")
    elif len(tables) > 1:
        out.write(f"total: {total} entries\n")
    out.flush()
