"""Giving a warm container's freed heap back to the kernel, once per invocation (issue 17, item 2).

glibc keeps what libvips frees in its arenas' free lists; over hundreds of photos the resident set
creeps (+11.9% from photo 100 to photo 1,000 with MALLOC_ARENA_MAX=2). malloc_trim(0) returns every
free page of every arena, at the price of page faults on the next photo: after each photo it made
the renders 9% slower, so the process function trims once per invocation, after its whole batch
(docs/performance.md, Memory).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    import ctypes  # here, not at import: a cold start needs it only after its first batch

    try:
        # The process' own symbols, libc's among them: ctypes.util.find_library would run ldconfig.
        function = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    trim: Callable[[int], int] = function
    return trim


def trim() -> bool:
    """Return the free heap to the kernel (glibc's malloc_trim(0)); True if any memory was released."""
    function = _malloc_trim()
    return bool(function(0)) if function is not None else False


def trimmed(handler: Callable[P, R]) -> Callable[P, R]:
    """A Lambda handler that trims the heap after each invocation, whatever it returned or raised."""

    @functools.wraps(handler)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return handler(*args, **kwargs)
        finally:
            trim()

    return wrapper
