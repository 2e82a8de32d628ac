"""The relay's PutEvents entries (SPEC 11) and how they are grouped into calls (10, 256 KB)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from photo_publish.relay import MAX_CALL_BYTES, MAX_ENTRIES, SOURCE, Waiting, calls, entry, entry_size

CREATED = datetime(2026, 11, 29, 10, 15, 30, tzinfo=UTC)


def waiting(payload: dict[str, Any] | None = None, event_type: str = "photo.published") -> Waiting:
    return Waiting(uuid.uuid4(), event_type, payload or {"photoId": "p", "entityVersion": 2}, CREATED)


def test_an_entry_is_specs_envelope_with_the_row_id_as_event_id_and_the_payload_under_data() -> None:
    # GIVEN a waiting outbox row
    event = waiting({"photoId": "p", "entityVersion": 2, "albumId": "a"}, "photo.failed")

    # WHEN it becomes a PutEvents entry
    item = entry(event)

    # THEN Source and DetailType name it, Detail holds eventId and data, Time is when it was written
    assert (item["Source"], item["DetailType"], item["Time"]) == (SOURCE, "photo.failed", CREATED)
    assert json.loads(item["Detail"]) == {"eventId": str(event.id), "data": event.payload}
    assert "EventBusName" not in item  # the bus adapter adds its own


def test_the_size_is_counted_as_eventbridge_counts_it() -> None:
    # GIVEN an entry whose detail holds multi-byte characters
    item = entry(waiting({"caption": "Ærøskøbing, été ☀"}))

    # WHEN / THEN: Time 14 bytes, Source, DetailType and Detail in UTF-8 bytes
    expected = 14 + len(SOURCE) + len("photo.published") + len(item["Detail"].encode())
    assert entry_size(item) == expected > 14 + len(SOURCE) + len("photo.published") + len(item["Detail"])


@pytest.mark.parametrize(
    ("sizes", "grouped"),
    [
        pytest.param([], [], id="nothing"),
        pytest.param(
            [100] * 25, [list(range(10)), list(range(10, 20)), list(range(20, 25))], id="ten-a-call"
        ),
        pytest.param(
            [100_000, 100_000, 100_000, 50_000],
            [[0, 1], [2, 3]],
            id="256-kb-a-call",
        ),
        pytest.param([MAX_CALL_BYTES, 1], [[0], [1]], id="exactly-the-limit"),
        pytest.param([10, MAX_CALL_BYTES + 1, 10], [[0, 2]], id="an-entry-too-large-is-in-no-call"),
    ],
)
def test_entries_are_grouped_in_order_into_calls_within_both_limits(
    sizes: list[int], grouped: list[list[int]]
) -> None:
    result = list(calls(sizes))
    assert result == grouped
    for call in result:
        assert len(call) <= MAX_ENTRIES
        assert sum(sizes[i] for i in call) <= MAX_CALL_BYTES
