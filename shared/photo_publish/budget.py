"""The time an invocation has left, as the handlers pass it down to the work."""

from __future__ import annotations

import math
from collections.abc import Callable

# Seconds left before Lambda stops the invocation (context.get_remaining_time_in_millis / 1000).
Remaining = Callable[[], float]


def forever() -> float:
    return math.inf
