"""lace.bpf: load BPF objects, work with their maps and attach their programs — libbpf via ctypes.

It knows nothing about lace.  The shape follows cilium/ebpf: open an :class:`ObjectSpec`, edit it,
:meth:`~ObjectSpec.load` it into an :class:`Object` whose maps and programs own their fds; attach
with :func:`attach` (tcx, tc fallback) and get a :class:`Link` with pin/update/detach.
"""

from .fs import BPFFS, ensure_bpffs, is_bpffs
from .errors import (
    BPFError,
    IncompatibleMap,
    KeyNotFound,
    LoadError,
    NotSupported,
    VerifierError,
)
from .info import (
    LinkInfo,
    MapInfo,
    ProgInfo,
    TcxQuery,
    link_info,
    link_info_all,
    map_info,
    prog_info,
    query_tcx,
    query_tcx_full,
)
from .iter import Iterator, MapEntryCounts
from .layout import Layout
from .link import Link, TcFilter, attach_tcx
from .maps import ANY, EXIST, NOEXIST, Map, TypedMap
from .netns import enter as enter_netns
from .object import MapSpec, Migration, Object, ObjectSpec, Program, ProgramSpec
from .ringbuf import RingBuffer, RingReader
from .testrun import TestRunResult, test_run

__all__ = [
    "ANY", "EXIST", "NOEXIST",
    "BPFError", "IncompatibleMap", "KeyNotFound", "LoadError", "NotSupported", "VerifierError",
    "Iterator", "Layout", "Map", "MapEntryCounts", "TypedMap", "RingBuffer", "RingReader",
    "ObjectSpec", "MapSpec", "ProgramSpec", "Object", "Program", "Migration",
    "Link", "TcFilter", "attach_tcx",
    "LinkInfo", "MapInfo", "ProgInfo", "TcxQuery",
    "link_info", "link_info_all", "map_info", "prog_info", "query_tcx", "query_tcx_full",
    "TestRunResult", "test_run", "enter_netns", "BPFFS", "ensure_bpffs", "is_bpffs",
]  # fmt: skip
