"""The heap trim the process function does once per invocation (photo_publish.image.memory)."""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

import pytest

from photo_publish.image import memory

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")


def rss_mb() -> float:
    with open("/proc/self/status") as status:  # noqa: PTH123
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


@glibc
def test_trim_gives_freed_heap_in_the_middle_back_to_the_kernel() -> None:
    # GIVEN 48 MB of touched heap blocks, freed but for the last (which keeps glibc from trimming the
    # heap's top itself), as a photo's buffers are left below the next photo's
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size = 64 << 10  # under glibc's mmap threshold: from the heap
    blocks = [libc.malloc(size) for _ in range(768)]
    for block in blocks:
        ctypes.memset(block, 1, size)
    for block in blocks[:-1]:
        libc.free(block)
    held = rss_mb()

    # WHEN the heap is trimmed
    released = memory.trim()

    # THEN most of those pages left the resident set (measured before the last block is freed: that
    # free would let glibc trim the top itself)
    after = rss_mb()
    libc.free(blocks[-1])
    assert released is True
    assert held - after > 30


def test_a_trimmed_handler_trims_after_returning_and_after_raising(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a handler wrapped by trimmed, and a recording malloc_trim
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(memory, "_malloc_trim", lambda: lambda pad: calls.append(("trim", pad)) or 1)

    @memory.trimmed
    def handler(fail: bool) -> str:
        calls.append(("handler", 0))
        if fail:
            raise RuntimeError("boom")
        return "done"

    # WHEN it returns, then raises
    assert handler(False) == "done"
    with pytest.raises(RuntimeError):
        handler(True)

    # THEN the trim (malloc_trim(0)) came after each invocation's work
    assert calls == [("handler", 0), ("trim", 0)] * 2
