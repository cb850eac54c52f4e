"""What every loader object shares: holding a kernel resource until closed (context manager,
closed on garbage collection), and — for maps, programs and links — one pinnable fd."""

from __future__ import annotations

import os

from . import _libbpf as _lb
from .errors import error


class Owned:
    """Holds a kernel resource until :meth:`close` (also on ``with`` exit and garbage collection)."""

    def close(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class FdObject(Owned):
    """A BPF map, program or link owning one file descriptor, pinnable in bpffs."""

    _kind = "object"
    _fd: int = -1
    pin_path: str | None = None

    def _label(self) -> str:
        return "?"

    def _adopt(self, fd: int, info_of, name: str | None, pin_path: str | None):  # type: ignore[no-untyped-def]
        """Take ownership of ``fd`` and read its kernel info (the fd is closed if that fails);
        sets the fields every object has and returns the info for the rest."""
        self._fd = fd
        try:
            info = info_of(fd)
        except BaseException:
            os.close(fd)
            self._fd = -1
            raise
        self.id = info.id
        self.name = name or info.name
        self.type = info.type
        self.type_name = info.type_name
        self.pin_path = pin_path
        return info

    @staticmethod
    def _obj_get(path: str, kind: str) -> int:
        fd = _lb.lib.bpf_obj_get(os.fsencode(path))
        if fd < 0:
            raise error(f"open pinned {kind} {path}", -fd)
        return fd

    @property
    def fd(self) -> int:
        if self._fd < 0:
            raise ValueError(f"{self._kind} {self._label()} is closed")
        return self._fd

    def pin(self, path: str) -> None:
        _lb.check(_lb.lib.bpf_obj_pin(self.fd, os.fsencode(path)), f"pin {self._kind} {self._label()} at {path}")
        self.pin_path = path

    def unpin(self) -> None:
        """Remove the pin (the object lives on while an fd is open)."""
        if self.pin_path:
            try:
                os.unlink(self.pin_path)
            except FileNotFoundError:
                pass
            self.pin_path = None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
