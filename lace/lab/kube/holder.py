"""A real-cluster lab node's holder: the process that owns the node's mount and UTS namespaces,
which the node's containerd and kubelet then enter (with its network namespace, ``nsenter -t
HOLDER -m -u -n``), as the processes of one machine share its filesystem view and hostname.

It unshares both namespaces, makes every mount a slave of the machine's (nothing the node mounts
reaches the machine; the machine's later mounts still reach the node), sets the node's hostname
(hostNetwork pods see it, as on a real node), binds each SOURCE over its TARGET (the node's own
/opt/cni/bin, /etc/cni/net.d, /run/netns, bpffs...: the paths a DaemonSet's hostPath volumes name
are the same on every node and different underneath), makes the tree shared again within the node
(the kubelet's Bidirectional mount propagation needs a shared mount), writes READY_FILE and sleeps
until it is stopped. The namespaces, and every mount in them, end with the last process in them.

Usage: python -m lace.lab.kube.holder --hostname NAME --ready FILE [--bind SOURCE:TARGET ...]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_SLAVE = 1 << 19
MS_SHARED = 1 << 20

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot {what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, flags: int, what: str) -> None:
    _check(_libc.mount(source.encode() if source else None, target.encode(), None, flags, None), what)


def hold(hostname: str, binds: list[tuple[str, str]], ready: str) -> None:
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWUTS), "unshare the mount and UTS namespaces")
    _mount(None, "/", MS_REC | MS_SLAVE, "make / a slave mount")
    name = hostname.encode()
    _check(_libc.sethostname(name, len(name)), f"set the hostname {hostname}")
    for source, target in binds:
        os.makedirs(source, exist_ok=True)
        os.makedirs(target, exist_ok=True)
        _mount(source, target, MS_BIND | MS_REC, f"bind {source} over {target}")
    _mount(None, "/", MS_REC | MS_SHARED, "make / shared within the node")
    with open(ready + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(ready + ".tmp", ready)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lace.lab.kube.holder")
    p.add_argument("--hostname", required=True)
    p.add_argument("--ready", required=True, help="written (with the pid) once the namespaces are set up")
    p.add_argument("--bind", action="append", default=[], metavar="SOURCE:TARGET")
    args = p.parse_args(argv)
    binds = []
    for b in args.bind:
        source, sep, target = b.partition(":")
        if not sep or not source.startswith("/") or not target.startswith("/"):
            p.error(f"--bind {b}: give SOURCE:TARGET, both absolute paths")
        binds.append((source, target))
    try:
        hold(args.hostname, binds, args.ready)
    except OSError as exc:
        print(f"holder of {args.hostname}: {exc.strerror}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
