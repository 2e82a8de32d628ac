"""The relay's PutEvents entries (SPEC 11), how they are grouped into calls (10, 256 KB), and its settings."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from photo_publish.outbox.relay import MAX_CALL_BYTES, MAX_ENTRIES, SOURCE, Waiting, calls, entry, entry_size
from photo_publish.settings import InvalidSettings, Settings

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


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("", True),  # no bus: no hand-off, and the relay refuses to start
        ("photo-publish-prod", True),
        ("arn:aws:events:eu-west-1:123456789012:event-bus/photo-publish-prod", True),
        ("photo publish", False),
        ("arn:aws:sqs:eu-west-1:123456789012:photo-publish-prod", False),
        ("x" * 257, False),
    ],
)
def test_the_bus_is_named_by_its_name_or_its_arn(value: str, valid: bool) -> None:
    environ = {
        "DATABASE_URL": "postgresql://x",
        "PHOTO_BUCKET": "bucket",
        "STAGE": "dev",
        "EVENT_BUS_NAME": value,
    }
    if valid:
        assert Settings.from_env(environ).event_bus_name == value
    else:
        with pytest.raises(InvalidSettings, match=r"^EVENT_BUS_NAME must match"):
            Settings.from_env(environ)


@pytest.mark.parametrize(
    ("name", "value", "rule"),
    [
        ("EVENT_HANDOFF_TIMEOUT_SECONDS", "0", "must be between 0.1 and 10"),
        ("EVENT_HANDOFF_TIMEOUT_SECONDS", "30", "must be between 0.1 and 10"),
        ("OUTBOX_RETENTION_DAYS", "0", "must be at least 1"),
    ],
)
def test_the_relays_numbers_are_checked_at_cold_start(name: str, value: str, rule: str) -> None:
    environ = {"DATABASE_URL": "postgresql://x", "PHOTO_BUCKET": "bucket", "STAGE": "dev", name: value}
    with pytest.raises(InvalidSettings, match=f"^{name} {rule}"):
        Settings.from_env(environ)
