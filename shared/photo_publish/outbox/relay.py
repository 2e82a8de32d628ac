"""The outbox relay (SPEC 12): the outbox's events onto the EventBridge bus, at least once.

A polling publisher, like the sweep: waiting rows are leased oldest first (FOR UPDATE SKIP LOCKED,
`leased_until` set, committed), sent with PutEvents while no transaction is open (SPEC 19: a row
lock is never held across a network call), and marked `published_at` in a second short transaction
once their entry was accepted. Two relays at once never send the same row in one pass (the lease),
and a relay killed between PutEvents and its mark only sends those entries again once their lease
has passed, with the same `eventId` (a duplicate, never a loss).

A row is taken only when every older event of its photo was accepted, so a photo's events reach
the bus in the order they were written (its `entityVersion` order), whatever failed in between.
The process function hands its own event off the same way: its commit leases it (`lease`, in the
transaction that wrote it), `hand_off` sends it right after with one short try, and what it could
not send stays for the scheduled relay.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID

from botocore.exceptions import BotoCoreError, ClientError
from sqlalchemy import Connection, Engine, delete, exists, func, or_, select, tuple_, update

from photo_publish.adapters.tables import deleted_photos, outbox_events
from photo_publish.adapters.unit_of_work import unit_of_work
from photo_publish.budget import Remaining, forever
from photo_publish.contracts import PHOTO_DELETED
from photo_publish.observability import logger
from photo_publish.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_events.type_defs import PutEventsRequestEntryTypeDef

# SPEC 11: every entry's Source; its DetailType is the outbox row's event_type.
SOURCE = "photo-publish"
# PutEvents: at most 10 entries a call, and 256 KB for them together, sized as EventBridge sizes
# them (Time 14 bytes; Source, DetailType, Detail and each Resource as UTF-8).
MAX_ENTRIES = 10
MAX_CALL_BYTES = 256 * 1024
_TIME_BYTES = 14


@dataclass(frozen=True, slots=True)
class Waiting:
    """An outbox row not published yet."""

    id: UUID
    event_type: str
    payload: dict[str, Any]
    created_at: datetime


def entry(event: Waiting) -> PutEventsRequestEntryTypeDef:
    """SPEC 11's entry: CloudEvents' id, type, source, time and data as EventBridge carries them.

    `eventId` is the outbox row's id, the same for every send of the row: consumers deduplicate on
    it (EventBridge's own event id differs from one PutEvents to the next).
    """
    detail = {"eventId": str(event.id), "data": event.payload}
    return {
        "Source": SOURCE,
        "DetailType": event.event_type,
        "Detail": json.dumps(detail, separators=(",", ":"), ensure_ascii=False),
        # When it happened (the outbox row's commit), not when it was relayed.
        "Time": event.created_at,
    }


def entry_size(item: PutEventsRequestEntryTypeDef) -> int:
    """The entry's size as EventBridge counts it against PutEvents' 256 KB."""
    size = _TIME_BYTES if "Time" in item else 0
    for text in (item.get("Source", ""), item.get("DetailType", ""), item.get("Detail", "")):
        size += len(text.encode())
    return size + sum(len(resource.encode()) for resource in item.get("Resources", []))


def calls(sizes: Sequence[int]) -> Iterator[list[int]]:
    """The entries' indexes grouped into PutEvents calls: in order, 10 and 256 KB at most each.
    An entry over 256 KB on its own is in no call (it can never be sent)."""
    call: list[int] = []
    total = 0
    for index, size in enumerate(sizes):
        if size > MAX_CALL_BYTES:
            continue
        if call and (len(call) == MAX_ENTRIES or total + size > MAX_CALL_BYTES):
            yield call
            call, total = [], 0
        call.append(index)
        total += size
    if call:
        yield call


class Bus(Protocol):
    def put_entries(self, entries: Sequence[PutEventsRequestEntryTypeDef]) -> list[str | None]: ...


class EventBridgeBus:
    """PutEvents on one bus. Answers per entry: None once accepted, else why not (its error code)."""

    def __init__(self, client: EventBridgeClient, bus_name: str) -> None:
        self._client = client
        self._bus_name = bus_name

    def put_entries(self, entries: Sequence[PutEventsRequestEntryTypeDef]) -> list[str | None]:
        try:
            response = self._client.put_events(
                Entries=[item | {"EventBusName": self._bus_name} for item in entries]
            )
        except ClientError as error:
            return [error.response.get("Error", {}).get("Code", "ClientError")] * len(entries)
        except BotoCoreError as error:
            # Unreachable, timed out: nothing is known to be accepted.
            return [type(error).__name__] * len(entries)
        # PutEvents answers every entry in order: an EventId, or an ErrorCode.
        return [
            None if "EventId" in result else result.get("ErrorCode", "Failed")
            for result in response["Entries"]
        ]


@dataclass(frozen=True, slots=True)
class HandOff:
    """What the hand-off after a commit did: events accepted, whether one was not, how long it took."""

    sent: int = 0
    failed: bool = False
    seconds: float = 0.0


@dataclass
class RelaySummary:
    published: int = 0
    # Entries the bus did not accept, tried again and again refused (their rows wait for the next run).
    not_accepted: int = 0
    # Entries over 256 KB: never sendable (logged as errors; the oldest-age alarm will fire).
    too_large: int = 0
    deleted: int = 0
    batches: int = 0
    oldest_unpublished_seconds: float = 0.0
    out_of_time: bool = False
    # The bus accepted nothing of a call: the run stopped sending.
    bus_down: bool = False
    # Error codes of the entries PutEvents did not accept, per try.
    errors: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, int | float | bool | dict[str, int]]:
        return {
            "published": self.published,
            "notAccepted": self.not_accepted,
            "tooLarge": self.too_large,
            "deleted": self.deleted,
            "batches": self.batches,
            "oldestUnpublishedSeconds": round(self.oldest_unpublished_seconds, 3),
            "outOfTime": self.out_of_time,
            "busDown": self.bus_down,
            "errors": self.errors,
        }


@dataclass(frozen=True, slots=True)
class _Sent:
    accepted: list[UUID]
    refused: list[UUID]
    # A call of which the bus accepted nothing, even when tried again: stop sending for this run.
    bus_down: bool


class Relay:
    """`publish_pending` is the scheduled relay's run; `hand_off` the process function's try."""

    def __init__(
        self,
        engine: Engine,
        bus: Bus,
        settings: Settings,
        *,
        batch_size: int = 100,
        delete_batch_size: int = 1000,
        attempts: int = 3,
        retry_seconds: float = 0.1,
        batch_seconds: float = 20.0,
    ) -> None:
        self._engine = engine
        self._bus = bus
        self._settings = settings
        self._batch_size = batch_size
        self._delete_batch_size = delete_batch_size
        self._attempts = attempts
        self._retry_seconds = retry_seconds
        # No new PutEvents call once a batch has been sending this long; its lease outlasts that
        # and the calls' tries, so that no other relay takes a row still being sent.
        self._batch_seconds = batch_seconds
        self._lease_seconds = 3 * batch_seconds

    def publish_pending(
        self, remaining: Remaining = forever, *, reserve_seconds: float = 10.0
    ) -> RelaySummary:
        """Publish the waiting events oldest first until none is left, the bus stops accepting, or
        the time budget is spent; then delete the published rows past the retention."""
        summary = RelaySummary()
        refused: set[UUID] = set()
        while True:
            if remaining() < reserve_seconds:
                summary.out_of_time = True
                break
            waiting = self._lease(self._batch_size, exclude=refused)
            if not waiting:
                break
            sent = self._send(waiting, summary, lambda: remaining() - reserve_seconds)
            self._settle(waiting, sent.accepted)
            summary.batches += 1
            summary.published += len(sent.accepted)
            summary.not_accepted += len(sent.refused)
            # Not taken again in this run: a refused entry must not keep the rest waiting.
            refused.update(sent.refused)
            if sent.bus_down:
                summary.bus_down = True
                break
        summary.deleted = self._delete_expired(remaining, reserve_seconds)
        summary.oldest_unpublished_seconds = self._oldest_unpublished_seconds()
        return summary

    def lease(self, connection: Connection, photo_id: UUID) -> list[Waiting]:
        """The photo's oldest waiting event, leased inside the caller's transaction (the one that
        wrote it) for the hand-off right after its commit: no transaction of the hand-off's own."""
        return _take(connection, 1, lease=self._lease_seconds, photo_id=photo_id)

    def hand_off(self, photo_id: UUID, leased: Sequence[Waiting] | None = None, *, most: int = 3) -> HandOff:
        """The photo's waiting events, oldest first, one try each; never raises. `leased`: what the
        commit leased for it (`lease`); by default the hand-off leases them itself.

        Right after a commit, its event is normally the photo's only waiting one. The first one not
        accepted ends the try (a later one must not overtake it): the relay sends what is left.
        """
        started = time.perf_counter()
        sent = 0
        try:
            waiting = list(leased) if leased is not None else self._lease(1, photo_id=photo_id)
            while waiting:
                item = entry(waiting[0])
                too_large = entry_size(item) > MAX_CALL_BYTES
                (error,) = ["TooLarge"] if too_large else self._bus.put_entries([item])
                if error is not None:
                    self._settle(waiting, [])
                    logger.warning("event not handed off", event_id=str(waiting[0].id), reason=error)
                    return HandOff(sent, True, time.perf_counter() - started)
                sent += 1
                # The next one, if the photo has another waiting, leased as this one is marked.
                waiting = self._settle(waiting, [waiting[0].id], then=photo_id if sent < most else None)
        except Exception as error:
            # The record's own work is committed: nothing here may fail it. The relay delivers.
            logger.warning("event hand-off failed", photo_id=str(photo_id), reason=repr(error))
            return HandOff(sent, True, time.perf_counter() - started)
        return HandOff(sent, False, time.perf_counter() - started)

    def _lease(
        self, limit: int, *, photo_id: UUID | None = None, exclude: set[UUID] | None = None
    ) -> list[Waiting]:
        """Waiting rows this relay may send, leased for longer than its calls can take (committed:
        the calls are made with no transaction open)."""
        with unit_of_work(self._engine) as connection:
            return _take(connection, limit, lease=self._lease_seconds, photo_id=photo_id, exclude=exclude)

    def _settle(
        self, waiting: Sequence[Waiting], accepted: Sequence[UUID], *, then: UUID | None = None
    ) -> list[Waiting]:
        """The accepted rows published; the rest of the lease given back (refused or not tried: a
        later pass or run takes them), but for a photo deleted meanwhile: its deletion kept the rows
        this relay was sending, and what the bus did not take is not to be told after it. `then`:
        a photo whose next waiting event is leased in the same transaction, and returned."""
        given_back = [w.id for w in waiting if w.id not in accepted]
        with unit_of_work(self._engine) as connection:
            _mark_published(connection, accepted)
            if given_back:
                back = (outbox_events.c.id.in_(given_back), outbox_events.c.published_at.is_(None))
                dropped = connection.execute(
                    delete(outbox_events).where(
                        *back,
                        outbox_events.c.event_type != PHOTO_DELETED,
                        exists().where(deleted_photos.c.photo_id == outbox_events.c.aggregate_id),
                    )
                ).rowcount
                if dropped:
                    logger.info("events of photos deleted while they were sent dropped", count=dropped)
                connection.execute(update(outbox_events).where(*back).values(leased_until=None))
            return [] if then is None else _take(connection, 1, lease=self._lease_seconds, photo_id=then)

    def _send(self, waiting: list[Waiting], summary: RelaySummary, left: Remaining) -> _Sent:
        """PutEvents for the batch, 10 entries and 256 KB a call; only the entries that failed are
        sent again, `attempts` times at most. Entries not tried (the batch ran out of time, or the
        bus accepted nothing) are neither accepted nor refused: they wait, unlocked, for a later try."""
        started = time.monotonic()
        entries = [entry(event) for event in waiting]
        sizes = [entry_size(item) for item in entries]
        accepted: list[UUID] = []
        refused: list[UUID] = []
        for index, size in enumerate(sizes):
            if size > MAX_CALL_BYTES:
                logger.error("event too large for EventBridge", event_id=str(waiting[index].id), bytes=size)
                summary.too_large += 1
                refused.append(waiting[index].id)
        for call in calls(sizes):
            if time.monotonic() - started > self._batch_seconds or left() <= 0:
                break
            pending = self._put_call(call, entries, waiting, accepted, summary)
            if len(pending) == len(call):
                # Nothing of this call accepted, even when tried again: the bus is not taking
                # events now. The next scheduled run tries again.
                logger.warning("the bus accepts nothing", errors=summary.errors)
                return _Sent(accepted, refused, bus_down=True)
            if pending:
                logger.warning("entries not accepted", count=len(pending), errors=summary.errors)
                refused.extend(waiting[i].id for i in pending)
        return _Sent(accepted, refused, bus_down=False)

    def _put_call(
        self,
        call: list[int],
        entries: list[PutEventsRequestEntryTypeDef],
        waiting: list[Waiting],
        accepted: list[UUID],
        summary: RelaySummary,
    ) -> list[int]:
        """One call's entries, the failed ones sent again: the indexes still not accepted."""
        pending = call
        for attempt in range(self._attempts):
            if attempt:
                time.sleep(self._retry_seconds * 2 ** (attempt - 1))
            errors = self._bus.put_entries([entries[i] for i in pending])
            for i, error in zip(pending, errors, strict=True):
                if error is None:
                    accepted.append(waiting[i].id)
                else:
                    summary.errors[error] = summary.errors.get(error, 0) + 1
            pending = [i for i, error in zip(pending, errors, strict=True) if error is not None]
            if not pending:
                break
        return pending

    def _delete_expired(self, remaining: Remaining, reserve_seconds: float) -> int:
        """Published rows past OUTBOX_RETENTION_DAYS, deleted in bounded batches (the bus's archive
        keeps the events for replays)."""
        cutoff = func.now() - timedelta(days=self._settings.outbox_retention_days)
        deleted = 0
        while remaining() >= reserve_seconds:
            expired = (
                select(outbox_events.c.id)
                .where(outbox_events.c.published_at < cutoff)
                .order_by(outbox_events.c.published_at)
                .limit(self._delete_batch_size)
                .with_for_update(skip_locked=True)
            )
            with unit_of_work(self._engine) as connection:
                count = len(
                    connection.scalars(
                        delete(outbox_events)
                        .where(outbox_events.c.id.in_(expired))
                        .returning(outbox_events.c.id)
                    ).all()
                )
            deleted += count
            if count < self._delete_batch_size:
                break
        return deleted

    def _oldest_unpublished_seconds(self) -> float:
        """How long the oldest waiting event has waited (0 when none): the relay's alarm metric."""
        with unit_of_work(self._engine) as connection:
            age = connection.scalar(
                select(func.extract("epoch", func.now() - func.min(outbox_events.c.created_at))).where(
                    outbox_events.c.published_at.is_(None)
                )
            )
        return max(float(age or 0), 0.0)


def _take(
    connection: Connection,
    limit: int,
    *,
    lease: float,
    photo_id: UUID | None = None,
    exclude: set[UUID] | None = None,
) -> list[Waiting]:
    """Lease waiting rows for `lease` seconds, oldest first, each the oldest waiting event of its
    photo; rows another relay holds (locked or leased) are skipped, and so are the later events of
    their photos. One statement: the rows are chosen, locked and leased at once."""
    older = outbox_events.alias("older").c
    an_older_one_waits = exists().where(
        older.aggregate_id == outbox_events.c.aggregate_id,
        older.published_at.is_(None),
        tuple_(older.created_at, older.id) < tuple_(outbox_events.c.created_at, outbox_events.c.id),
    )
    chosen = (
        select(outbox_events.c.id)
        .where(
            outbox_events.c.published_at.is_(None),
            or_(outbox_events.c.leased_until.is_(None), outbox_events.c.leased_until < func.now()),
            ~an_older_one_waits,
        )
        .order_by(outbox_events.c.created_at, outbox_events.c.id)
        .limit(limit)
        .with_for_update(of=outbox_events, skip_locked=True)
    )
    if photo_id is not None:
        chosen = chosen.where(outbox_events.c.aggregate_id == photo_id)
    if exclude:
        chosen = chosen.where(outbox_events.c.id.not_in(exclude))
    taken = chosen.cte("taken")
    rows = connection.execute(
        update(outbox_events)
        .where(outbox_events.c.id == taken.c.id)
        .values(leased_until=func.now() + timedelta(seconds=lease))
        .returning(
            outbox_events.c.id,
            outbox_events.c.event_type,
            outbox_events.c.payload,
            outbox_events.c.created_at,
        )
    )
    # RETURNING follows no order: the oldest first, as they were chosen.
    return sorted((Waiting(*row) for row in rows), key=lambda w: (w.created_at, w.id))


def _mark_published(connection: Connection, event_ids: Sequence[UUID]) -> None:
    if event_ids:
        connection.execute(
            update(outbox_events)
            .where(outbox_events.c.id.in_(event_ids))
            # The moment of acceptance, not the transaction's start (now()).
            .values(published_at=func.clock_timestamp(), leased_until=None)
        )
