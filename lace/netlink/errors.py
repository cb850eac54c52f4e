"""The one error type of lace.netlink: what was attempted, on which object, and why."""

from __future__ import annotations

import errno as _errno
import os


class NetlinkError(Exception):
    """A netlink or namespace operation failed.

    ``op`` is the verb ("add address"), ``target`` names the object ("eth0 in netns lace-a"),
    ``errno`` is the kernel's errno when there is one (0 otherwise) and ``message`` the reason.
    pyroute2 and OS exceptions never leave lace.netlink; they become this.
    """

    def __init__(self, op: str, target: str, errno: int = 0, message: str | None = None) -> None:
        self.op = op
        self.target = target
        self.errno = errno
        self.message = message or (os.strerror(errno) if errno else "failed")
        name = _errno.errorcode.get(errno)
        reason = f"{self.message} ({name})" if name else self.message
        super().__init__(f"{op} {target}: {reason}")


def where(obj: str, netns: str | None) -> str:
    """``"eth0 in netns lace-a"`` / ``"eth0 in the current netns"``: how errors name an object."""
    return f"{obj} in netns {netns}" if netns else f"{obj} in the current netns"
