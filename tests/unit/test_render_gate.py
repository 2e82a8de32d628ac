"""The service's render gate: records side by side, a record whose last worker died alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from photo_publish.publish.service import RenderGate


def test_a_record_alone_waits_for_those_inside_and_goes_before_those_that_come_after() -> None:
    gate = RenderGate()
    log: list[str] = []
    leave = {name: threading.Event() for name in ("first", "alone", "later")}

    def record(name: str, enter: Callable[[], AbstractContextManager[None]]) -> threading.Thread:
        def run() -> None:
            with enter():
                log.append(f"{name} in")
                leave[name].wait(5)
                log.append(f"{name} out")

        thread = threading.Thread(target=run)
        thread.start()
        time.sleep(0.1)
        return thread

    # GIVEN a record inside, then one that must work alone, then another ordinary one
    threads = [
        record("first", gate.shared),
        record("alone", gate.alone),
        record("later", gate.shared),
    ]
    # THEN the one alone waits for the first, and the later one waits for the one alone
    assert log == ["first in"]

    # WHEN the first leaves, the one alone goes in, by itself
    leave["first"].set()
    time.sleep(0.1)
    assert log == ["first in", "first out", "alone in"]

    # AND when it leaves, the later one goes in
    leave["alone"].set()
    leave["later"].set()
    for thread in threads:
        thread.join(5)
    assert log == ["first in", "first out", "alone in", "alone out", "later in", "later out"]
