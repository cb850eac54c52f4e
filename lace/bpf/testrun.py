"""Run a program on a crafted input with BPF_PROG_TEST_RUN (bpf_prog_test_run_opts)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Protocol

from . import _libbpf as _lb
from .errors import error


class _HasFd(Protocol):
    @property
    def fd(self) -> int: ...

    name: str


@dataclass(frozen=True)
class TestRunResult:
    """The program's return value, the (possibly rewritten) packet, and the mean run time."""

    __test__ = False  # not a pytest test class

    retval: int
    data_out: bytes
    duration_ns: int
    ctx_out: bytes | None = None


def test_run(
    prog: _HasFd,
    data: bytes,
    *,
    repeat: int = 1,
    ctx: bytes | None = None,
    data_size_out: int | None = None,
) -> TestRunResult:
    """Run ``prog`` ``repeat`` times on ``data`` (a full packet for tc programs, Ethernet first).

    ``ctx`` is an optional context (e.g. a ``struct __sk_buff`` for tc); the output context comes
    back in ``ctx_out``.  ``data_size_out`` bounds the returned packet (default: input + 4 KiB, so
    programs that grow the packet fit).
    """
    data = bytes(data)
    out_size = data_size_out if data_size_out is not None else len(data) + 4096
    out = ctypes.create_string_buffer(max(out_size, 1))
    opts = _lb.BpfTestRunOpts(sz=ctypes.sizeof(_lb.BpfTestRunOpts))
    din = ctypes.create_string_buffer(data, len(data))
    opts.data_in = ctypes.addressof(din)
    opts.data_size_in = len(data)
    opts.data_out = ctypes.addressof(out)
    opts.data_size_out = out_size
    opts.repeat = repeat
    ctx_in = ctx_out = None
    if ctx is not None:
        ctx_in = ctypes.create_string_buffer(bytes(ctx), len(ctx))
        ctx_out = ctypes.create_string_buffer(len(ctx))
        opts.ctx_in = ctypes.addressof(ctx_in)
        opts.ctx_size_in = len(ctx)
        opts.ctx_out = ctypes.addressof(ctx_out)
        opts.ctx_size_out = len(ctx)
    ret = _lb.lib.bpf_prog_test_run_opts(prog.fd, ctypes.byref(opts))
    if ret < 0:
        raise error(f"test run of program {getattr(prog, 'name', '?')!r}", -ret)
    n = min(opts.data_size_out, out_size)
    return TestRunResult(
        retval=opts.retval,
        data_out=out.raw[:n],
        duration_ns=opts.duration,
        ctx_out=ctx_out.raw[: opts.ctx_size_out] if ctx_out is not None else None,
    )


test_run.__test__ = False  # type: ignore[attr-defined]
