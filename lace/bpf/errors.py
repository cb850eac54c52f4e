"""Typed errors of the BPF loader; no ctypes or libbpf error ever leaves lace.bpf untranslated."""

from __future__ import annotations

import errno as _errno
import os

# Kernel-internal "not supported" code that the bpf() syscall can return (not in errno.h).
ENOTSUPP = 524


# libbpf's own error codes (enum libbpf_errno in libbpf.h)
_LIBBPF_ERRNOS = {
    4000: "libelf failed", 4001: "invalid BPF object format", 4002: "kernel version section missing",
    4003: "endianness mismatch", 4004: "libbpf internal error", 4005: "relocation failed",
    4006: "program load failed", 4007: "kernel verifier blocked the program",
    4008: "program too big", 4009: "incorrect kernel version", 4010: "kernel does not support the program type",
    4011: "wrong pid in netlink message", 4012: "invalid netlink sequence", 4013: "netlink parse error",
}  # fmt: skip


def _strerror(err: int) -> str:
    if err in _LIBBPF_ERRNOS:
        return _LIBBPF_ERRNOS[err]
    if err == ENOTSUPP:
        return "Operation not supported by this map or kernel"
    try:
        return os.strerror(err)
    except ValueError:
        return f"error {err}"


class BPFError(OSError):
    """A BPF operation failed: ``.errno`` is the kernel error, ``.op`` the operation that failed."""

    def __init__(self, op: str, err: int = 0, detail: str | None = None) -> None:
        self.op = op
        text = f"{op}: {_strerror(err) if err else 'failed'}"
        if detail:
            text += f": {detail}"
        super().__init__(err, text)
        self.detail = detail

    def __str__(self) -> str:  # OSError's "[Errno n]" prefix adds noise to user-facing errors
        return str(self.strerror)


class KeyNotFound(BPFError):
    """The key is not in the map (ENOENT on lookup, delete or update with EXIST)."""

    def __init__(self, op: str, detail: str | None = None) -> None:
        super().__init__(op, _errno.ENOENT, detail)


class NotSupported(BPFError):
    """The kernel, map type or program type does not support the operation."""


class VerifierError(BPFError):
    """The verifier rejected ``.program``; ``.log`` holds the verifier log text."""

    def __init__(self, op: str, err: int, program: str, log: str) -> None:
        tail = "\n".join(log.rstrip().splitlines()[-8:])
        super().__init__(op, err, f"verifier rejected program {program!r}:\n{tail}")
        self.program = program
        self.log = log


class IncompatibleMap(BPFError):
    """A pinned map does not match the definition it is used as (type, sizes, capacity, flags)."""


class LoadError(BPFError):
    """Opening or loading a BPF object failed; the message carries libbpf's last messages."""


def error(op: str, err: int, detail: str | None = None, *, key_op: bool = False) -> BPFError:
    """The typed error for a positive errno ``err`` from ``op``; ENOENT is KeyNotFound for map ops."""
    if key_op and err == _errno.ENOENT:
        return KeyNotFound(op, detail)
    if err in (_errno.EOPNOTSUPP, ENOTSUPP):
        return NotSupported(op, err, detail)
    return BPFError(op, err, detail)
