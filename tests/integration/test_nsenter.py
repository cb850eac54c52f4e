"""lace.nsenter, the one setns(2) of lace: the calling thread alone moves and always comes back;
failures name their step, and each layer words them as its own error."""

from __future__ import annotations

import errno
import os
import subprocess
import threading

import pytest

from lace import bpf, netlink, nsenter

from .conftest import unique_name

pytestmark = pytest.mark.privileged


def here() -> int:
    return os.stat(nsenter.THREAD_NETNS).st_ino


@pytest.fixture
def ns():
    name = unique_name()
    netlink.create_netns(name)
    try:
        yield name
    finally:
        netlink.delete_netns(name)


def test_the_calling_thread_enters_by_name_or_path_and_comes_back(ns):
    home = here()
    inside = netlink.netns_inode(ns)
    seen_by_other_thread: list[int] = []
    go = threading.Event()

    def other() -> None:   # started before: a thread made inside would inherit the namespace
        go.wait(10)
        seen_by_other_thread.append(here())

    t = threading.Thread(target=other)
    t.start()
    with nsenter.entered(ns):
        assert here() == inside
        go.set()
        t.join()
        with nsenter.entered(None):   # None stays put
            assert here() == inside
    assert here() == home and seen_by_other_thread == [home]
    with nsenter.entered(nsenter.path_of(ns)):
        assert here() == inside
    assert here() == home
    with pytest.raises(RuntimeError):   # the block's own errors pass through; the thread comes back
        with nsenter.entered(ns):
            raise RuntimeError("boom")
    assert here() == home


def test_setns_alone_is_what_a_child_runs_before_exec(ns):
    fd = os.open(nsenter.path_of(ns), os.O_RDONLY | os.O_CLOEXEC)
    try:
        out = subprocess.run(["readlink", "/proc/self/ns/net"], preexec_fn=lambda: nsenter.setns(fd),
                             capture_output=True, text=True, check=True).stdout
    finally:
        os.close(fd)
    assert out.strip() == f"net:[{netlink.netns_inode(ns)}]"
    with pytest.raises(OSError):
        nsenter.setns(-1)


def test_failures_name_their_step_and_each_layer_words_them():
    missing = unique_name()
    with pytest.raises(nsenter.NetnsError) as exc:
        with nsenter.entered(missing):
            pass
    assert (exc.value.step, exc.value.target, exc.value.errno) == ("open", f"/run/netns/{missing}", errno.ENOENT)
    with pytest.raises(ValueError, match="open"):
        with nsenter.entered(missing, translate=lambda e: ValueError(e.step)):
            pass
    # not a namespace file: opened fine, refused by setns
    with pytest.raises(nsenter.NetnsError) as bad:
        with nsenter.entered("/proc/self/status"):
            pass
    assert bad.value.step == "enter" and bad.value.errno == errno.EINVAL

    with pytest.raises(bpf.BPFError) as b:
        with bpf.enter_netns(missing):
            pass
    assert b.value.errno == errno.ENOENT and str(b.value).startswith(f"open network namespace /run/netns/{missing}")
    with pytest.raises(netlink.NetlinkError) as n:
        with netlink.entered(missing):
            pass
    assert (n.value.op, n.value.target, n.value.errno) == ("enter netns", missing, errno.ENOENT)
    assert "no such network namespace" in str(n.value)
