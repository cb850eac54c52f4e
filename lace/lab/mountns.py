"""A pod process's own /etc/resolv.conf: a private mount namespace with the pod's file bind-mounted
over the machine's, as ``ip netns exec`` does with /etc/netns/NAME/ (but from the lab's state dir).

Lab pods share the machine's filesystem, so the machine's /etc/resolv.conf is never written: the
process unshares its mount namespace (CLONE_NEWNS), makes every mount in it a slave of the
machine's (so nothing it mounts propagates back, while the machine's later mounts still reach it)
and bind-mounts the pod's file over /etc/resolv.conf. The namespace ends with the last process in
it, taking the bind mount along: nothing is left to unmount.

``enter_private`` is meant for a child between fork and exec (``preexec_fn``): it only makes
syscalls on values prepared beforehand. Stdlib only, like ``procs``.
"""

from __future__ import annotations

import ctypes
import os

RESOLV_CONF = "/etc/resolv.conf"
CLONE_NEWNS = 0x00020000
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_SLAVE = 1 << 19

# the running interpreter's own symbols include libc's (no find_library, which runs ldconfig)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.unshare.argtypes = [ctypes.c_int]
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        # the child's stderr is the process's log or the user's terminal: say what failed there,
        # since an exception raised in a preexec_fn reaches the parent without its message
        os.write(2, f"lace: cannot {what}: {os.strerror(err)}\n".encode())
        raise OSError(err, os.strerror(err), what)


class PrivateFile:
    """Bind ``source`` over ``target`` in a mount namespace of the calling process's own.

    Build it in the parent (paths are encoded there), call ``enter()`` in the child."""

    def __init__(self, source: str | os.PathLike[str], target: str = RESOLV_CONF) -> None:
        self.source = os.fsencode(os.path.abspath(source))
        self.target = os.fsencode(target)
        self._what_bind = f"bind-mount {os.fsdecode(self.source)} over {target}"

    def enter(self) -> None:
        """unshare(CLONE_NEWNS), make / rslave, bind-mount; OSError (and a line on stderr) on failure."""
        _check(_libc.unshare(CLONE_NEWNS), "unshare the mount namespace")
        _check(_libc.mount(None, b"/", None, _MS_REC | _MS_SLAVE, None), "make / a slave mount")
        _check(_libc.mount(self.source, self.target, None, _MS_BIND, None), self._what_bind)
