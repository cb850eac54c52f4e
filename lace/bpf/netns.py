"""Enter a network namespace in the calling thread only, and always come back (with lace.bpf's
errors).

setns(2) on a network namespace affects just the calling thread, which is what the bpf() calls
that resolve an ifindex need (tcx link create, prog query).  Only the calling thread moves, so
other threads (and the rest of the process) keep their namespace.  The setns itself is
:mod:`lace.nsenter`'s; this module words its failures as :class:`BPFError`.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from lace import nsenter

from .errors import BPFError

NETNS_RUN_DIR = nsenter.NETNS_RUN_DIR
path_of = nsenter.path_of

_OPS = {
    "open": "open network namespace {target}",
    "save": "open current network namespace",
    "enter": "setns into {target}",
    "return": "setns into the original network namespace",
}


def _bpf_error(exc: nsenter.NetnsError) -> BPFError:
    return BPFError(_OPS[exc.step].format(target=exc.target), exc.errno or 0)


@contextlib.contextmanager
def enter(name_or_path: str | None) -> Iterator[None]:
    """Run the block with the calling thread in the given network namespace (None: stay put)."""
    with nsenter.entered(name_or_path, translate=_bpf_error):
        yield
