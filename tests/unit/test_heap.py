"""The agent's C heap: one malloc arena whatever its threads do (lace.agent.heap)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from lace.agent import heap

#: a process that allocates C heap blocks from four threads and prints how many arenas glibc has
PROBE = textwrap.dedent("""
    import ctypes, re, sys, tempfile, threading
    from lace.agent.heap import one_arena
    if sys.argv[1] == "one":
        assert one_arena()
    libc = ctypes.CDLL("libc.so.6")
    def work():
        keep = [ctypes.create_string_buffer(4096) for _ in range(64)]
        bytes(200_000)
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    libc.fopen.restype = ctypes.c_void_p
    with tempfile.NamedTemporaryFile() as f:
        fp = libc.fopen(f.name.encode(), b"w")
        libc.malloc_info(0, ctypes.c_void_p(fp))
        libc.fclose(ctypes.c_void_p(fp))
        print(len(re.findall(r"<heap nr=", open(f.name).read())))
""")


def arenas(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return int(out.stdout)


@pytest.mark.skipif(heap._mallopt is None, reason="not glibc")
def test_one_arena_keeps_every_thread_on_the_main_heap() -> None:
    assert arenas("default") > 1, "threads should get arenas of their own without the setting"
    assert arenas("one") == 1
