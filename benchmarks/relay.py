"""Issue 14: how fast events leave the database, and whether the relay's cost follows the rows due.

Three parts, against PostgreSQL (embedded, or DATABASE_URL) and, for the bus, moto's server in a
process of its own on loopback (so that its Python does not share this one's interpreter lock),
with a bus of the stack's shape and no rule (moto's targets cost more than the relay itself):

1. Commit to bus, with the hand-off. HANDOFF_PHOTOS photos, two workers at a time (the process
   function's RECORD_CONCURRENCY), each running the publish transaction (`transaction.publish`,
   the real one, its event leased in it) and then Relay.hand_off as the service does. Latency:
   from publish() returning (the commit) to PutEvents returning with the event accepted. Target:
   p99 under 1 s.
2. Commit to bus, through the relay alone (no hand-off, as when the bus refused it): photos
   committed at COMMIT_RATE a second for WINDOW seconds while the relay runs every SCHEDULE
   seconds (the template's rate(1 minute)), then once more. Same latency. It is the schedule's
   wait: about half the schedule at the median, the whole of it at p99.
   Also the relay's throughput against moto: THROUGHPUT_EVENTS waiting events, one run.
3. The relay's run at 10 thousand and at 1 million published rows: the same fixed set of 1,100
   waiting events (1,000 photos, 100 of them with a second one) around them, filled by set-based
   SQL, VACUUM ANALYZE, autovacuum off on the table; Relay.publish_pending() timed, median of
   ROUNDS runs after a warm-up, the waiting rows set back before each run (untimed), with an
   in-process bus that accepts everything (the database side alone, as benchmarks/sweep.py
   measures the sweep). Each run must send exactly the 1,100, each photo's in order, or the
   benchmark fails. Target: time at 1M / time at 10k <= 1.5. The EXPLAIN (ANALYZE, BUFFERS) of
   the claiming statement at 1M is printed, and the retention's delete rate (100,000 expired
   rows, deleted in its batches of 1,000).

Verdicts are printed (MET / MISSED), never asserted. Results go to .local/bench-results/relay.json.
BENCH_ROUNDS (7), BENCH_RELAY_SCHEDULE (60) and BENCH_RELAY_WINDOW (150) shorten a quick pass.
"""

from __future__ import annotations

import gc
import json
import os
import re
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from uuid import UUID

import boto3
from sqlalchemy import Engine, event, text

from benchmarks.delivery import moto_process
from devkit import stack, uploads
from photo_publish.adapters.database import create_database_engine
from photo_publish.adapters.unit_of_work import unit_of_work
from photo_publish.contracts import Placeholder
from photo_publish.outbox.relay import EventBridgeBus, Relay, Waiting
from photo_publish.publish import repository, transaction
from photo_publish.publish.transaction import Rendition, StoredVariant
from photo_publish.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_events.type_defs import PutEventsRequestEntryTypeDef

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "7"))
SCHEDULE = float(os.environ.get("BENCH_RELAY_SCHEDULE", "60"))
WINDOW = float(os.environ.get("BENCH_RELAY_WINDOW", "150"))
HANDOFF_PHOTOS = 1000
WORKERS = 2
COMMIT_RATE = 2.0
THROUGHPUT_EVENTS = 5000
SIZES = (10_000, 1_000_000)
DUE_PHOTOS, DUE_SECOND = 1000, 100
DUE = DUE_PHOTOS + DUE_SECOND
EXPIRED = 100_000
HANDOFF_TARGET = 1.0
TARGET_RATIO = 1.5
RESULTS = stack.ROOT / ".local" / "bench-results"
BUS = "photo-publish-bench"
PLACEHOLDER = Placeholder("1QcSHQRnh493V4dIh4eXh1h4kJUI", "#7d6a4f")


def percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


class TimedBus:
    """The real EventBridgeBus, noting when each photo's event was first accepted (monotonic)."""

    def __init__(self, bus: EventBridgeBus) -> None:
        self._bus = bus
        self.accepted: dict[str, float] = {}
        self.calls = 0

    def put_entries(self, entries: Sequence[PutEventsRequestEntryTypeDef]) -> list[str | None]:
        errors = self._bus.put_entries(entries)
        now = time.monotonic()
        self.calls += 1
        for item, error in zip(entries, errors, strict=True):
            if error is None:
                self.accepted.setdefault(json.loads(item["Detail"])["data"]["photoId"], now)
        return errors


class RecordingBus:
    """In process: accepts everything, keeps what it was given (the database side alone)."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def put_entries(self, entries: Sequence[PutEventsRequestEntryTypeDef]) -> list[str | None]:
        self.sent.extend(json.loads(item["Detail"]) for item in entries)
        return [None] * len(entries)


# --- 1 and 2: commit to bus --------------------------------------------------------------------


def variants(photo_id: UUID) -> list[StoredVariant]:
    prefix = f"bench/albums/x/variants/{photo_id}/1"
    return [
        StoredVariant("thumb", f"{prefix}/thumb.webp", 400, 300, 9120, "image/webp"),
        StoredVariant("browse", f"{prefix}/browse.webp", 2048, 1536, 88210, "image/webp"),
    ]


def commit_one(
    engine: Engine, settings: Settings, handoff: Relay | None = None
) -> tuple[UUID, float, list[Waiting] | None]:
    """A photo registered, claimed and published (the real transaction, its event leased in it for
    `handoff` as the service leases it); its commit time."""
    shot = uploads.register(engine, settings.stage, "IMG.jpg")
    with unit_of_work(engine) as connection:
        repository.claim(connection, shot.photo_id, stale_after=300, max_attempts=3)
    rendition = Rendition(4032, 3024, variants(shot.photo_id), 1, PLACEHOLDER)
    with unit_of_work(engine) as connection:
        result = transaction.publish(connection, shot.photo_id, 1, rendition)
        leased = None if handoff is None else handoff.lease(connection, shot.photo_id)
    assert result.outcome == "published", result
    return shot.photo_id, time.monotonic(), leased


def handoff_latency(engine: Engine, settings: Settings) -> dict[str, Any]:
    bus = TimedBus(EventBridgeBus(bench_client(settings.event_handoff_timeout_seconds), BUS))
    relay = Relay(engine, bus, settings)
    committed: dict[str, float] = {}
    failed: list[UUID] = []

    def worker(count: int) -> None:
        for _ in range(count):
            photo_id, at, leased = commit_one(engine, settings, relay)
            committed[str(photo_id)] = at
            if relay.hand_off(photo_id, leased).failed:
                failed.append(photo_id)

    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(worker, [HANDOFF_PHOTOS // WORKERS] * WORKERS))
    latencies = [bus.accepted[p] - at for p, at in committed.items() if p in bus.accepted]
    return {
        "photos": len(committed),
        "accepted": len(latencies),
        "failures": len(failed),
        **summary(latencies),
    }


def relay_latency(engine: Engine, settings: Settings) -> dict[str, Any]:
    bus = TimedBus(EventBridgeBus(bench_client(10), BUS))
    relay = Relay(engine, bus, settings)
    committed: dict[str, float] = {}
    runs: list[float] = []
    stop = threading.Event()

    def scheduled() -> None:
        # EventBridge's schedule: every SCHEDULE seconds, the first one SCHEDULE after the start.
        while not stop.wait(SCHEDULE):
            started = time.monotonic()
            relay.publish_pending()
            runs.append(time.monotonic() - started)

    schedule = threading.Thread(target=scheduled)
    schedule.start()
    started = time.monotonic()
    while time.monotonic() - started < WINDOW:
        photo_id, at, _ = commit_one(engine, settings)
        committed[str(photo_id)] = at
        time.sleep(max(0.0, started + len(committed) / COMMIT_RATE - time.monotonic()))
    # The rest goes at the next scheduled run.
    while len(bus.accepted) < len(committed) and time.monotonic() - started < WINDOW + 2 * SCHEDULE + 30:
        time.sleep(0.5)
    stop.set()
    schedule.join()
    latencies = [bus.accepted[p] - at for p, at in committed.items() if p in bus.accepted]
    return {
        "photos": len(committed),
        "accepted": len(latencies),
        "scheduleSeconds": SCHEDULE,
        "runSeconds": [round(r, 3) for r in runs],
        **summary(latencies),
    }


def relay_throughput(engine: Engine, settings: Settings) -> dict[str, Any]:
    with engine.begin() as connection:
        connection.execute(text("TRUNCATE outbox_events"))
        connection.execute(
            text(
                "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, created_at) "
                "SELECT 'photo', md5('t' || i)::uuid, 'photo.published', "
                + PAYLOAD_SQL.format(id="md5('t' || i)")
                + ", now() - make_interval(secs => :n - i) FROM generate_series(1, :n) AS i"
            ),
            {"n": THROUGHPUT_EVENTS},
        )
    bus = TimedBus(EventBridgeBus(bench_client(10), BUS))
    started = time.perf_counter()
    summary_ = Relay(engine, bus, settings).publish_pending()
    seconds = time.perf_counter() - started
    return {
        "events": summary_.published,
        "calls": bus.calls,
        "seconds": round(seconds, 3),
        "eventsPerSecond": round(summary_.published / seconds),
    }


def summary(latencies: list[float]) -> dict[str, Any]:
    if not latencies:
        return {"p50": None, "p99": None, "max": None}
    return {
        "p50": round(percentile(latencies, 0.5), 4),
        "p99": round(percentile(latencies, 0.99), 4),
        "max": round(max(latencies), 4),
    }


def bench_client(timeout: float) -> Any:
    """A client of the functions' kind: one try, bounded waits (moto's endpoint from the environment)."""
    from botocore.config import Config

    return boto3.client(
        "events",
        config=Config(connect_timeout=timeout, read_timeout=timeout, retries={"total_max_attempts": 1}),
    )


# --- 3: 10 thousand against 1 million -----------------------------------------------------------

# A photo.published payload of the real size (about 600 bytes), built in SQL from an id expression.
PAYLOAD_SQL = """jsonb_build_object(
    'schemaVersion', 1, 'photoId', {id}::uuid, 'albumId', md5('album' || {id})::uuid,
    'entityVersion', 2, 'publishedAt', to_char(now() at time zone 'utc', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
    'width', 4032, 'height', 3024,
    'variants', jsonb_build_object(
        'thumb', jsonb_build_object('key', 'prod/albums/' || md5('album' || {id})::uuid || '/variants/'
            || {id}::uuid || '/1/thumb.webp', 'width', 400, 'height', 300, 'bytes', 9120, 'contentType', 'image/webp'),
        'browse', jsonb_build_object('key', 'prod/albums/' || md5('album' || {id})::uuid || '/variants/'
            || {id}::uuid || '/1/browse.webp', 'width', 2048, 'height', 1536, 'bytes', 88210,
            'contentType', 'image/webp')))"""

FILL_HISTORY = (
    "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, created_at, published_at) "
    "SELECT 'photo', md5('photo-' || i)::uuid, CASE WHEN i % 25 = 0 THEN 'photo.failed' ELSE 'photo.published' END, "
    + PAYLOAD_SQL.format(id="md5('photo-' || i)")
    + ", now() - interval '6 days' * ((:n - i + 1)::float8 / :n) - interval '1 hour',"
    " now() - interval '6 days' * ((:n - i + 1)::float8 / :n) - interval '1 hour' + interval '80 milliseconds'"
    " FROM generate_series(1, :n) AS i"
)
# The fixed waiting set: 1,000 photos' events in the last minute, 100 of them with a second one.
FILL_DUE = (
    "CREATE TABLE bench_due AS "
    "SELECT gen_random_uuid() AS id, md5('due-' || i)::uuid AS aggregate_id, n, "
    "now() - make_interval(secs => 60 - (n * :photos + i) * 0.04) AS created_at "
    "FROM generate_series(1, :photos) AS i, generate_series(0, 1) AS n WHERE n = 0 OR i <= :second"
)
INSERT_DUE = (
    "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload, created_at) "
    "SELECT id, 'photo', aggregate_id, CASE n WHEN 0 THEN 'photo.failed' ELSE 'photo.published' END, "
    + PAYLOAD_SQL.format(id="aggregate_id::text")
    + " || jsonb_build_object('seq', n), created_at FROM bench_due ORDER BY created_at"
)
RESET_DUE = "UPDATE outbox_events SET published_at = NULL WHERE id IN (SELECT id FROM bench_due)"


@dataclass
class Measured:
    size: int
    fill_seconds: float
    runs: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    plan: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.runs)


def fill(engine: Engine, size: int) -> float:
    started = time.perf_counter()
    with engine.begin() as connection:
        # Filling a million rows takes longer than the functions' statement timeout.
        connection.execute(text("SET LOCAL statement_timeout = 0"))
        connection.execute(text("DROP TABLE IF EXISTS bench_due"))
        connection.execute(text("TRUNCATE photos, photo_variants, photo_jobs, outbox_events CASCADE"))
        connection.execute(text("ALTER TABLE outbox_events SET (autovacuum_enabled = off)"))
        connection.execute(text(FILL_HISTORY), {"n": size - DUE})
        connection.execute(text(FILL_DUE), {"photos": DUE_PHOTOS, "second": DUE_SECOND})
        connection.execute(text(INSERT_DUE))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("SET statement_timeout = 0"))
        connection.execute(text("VACUUM (ANALYZE) outbox_events, bench_due"))
        connection.execute(text("RESET statement_timeout"))
    return time.perf_counter() - started


def check(bus: RecordingBus, due: dict[str, list[str]]) -> str | None:
    """Exactly the waiting set, once each, each photo's events in order."""
    sent = [d["eventId"] for d in bus.sent]
    expected = {i for ids in due.values() for i in ids}
    if len(sent) != len(expected) or set(sent) != expected:
        return f"sent {len(sent)} events, {len(set(sent) & expected)} of the {len(expected)} waiting"
    position = {event_id: n for n, event_id in enumerate(sent)}
    for ids in due.values():
        if [position[i] for i in ids] != sorted(position[i] for i in ids):
            return "a photo's events out of order"
    return None


def due_set(engine: Engine) -> dict[str, list[str]]:
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT id, aggregate_id FROM bench_due ORDER BY created_at")).all()
    due: dict[str, list[str]] = {}
    for row in rows:
        due.setdefault(str(row.aggregate_id), []).append(str(row.id))
    return due


@contextmanager
def captured(engine: Engine) -> Iterator[list[tuple[str, Any]]]:
    statements: list[tuple[str, Any]] = []

    def capture(_c: Any, _cur: Any, statement: str, parameters: Any, _ctx: Any, _many: bool) -> None:
        if "SKIP LOCKED" in statement and "outbox_events_1" in statement:
            statements.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", capture)


def explain(engine: Engine, statement: tuple[str, Any]) -> str:
    with engine.begin() as connection:
        connection.execute(text(RESET_DUE))
    with engine.connect() as connection:
        rows = connection.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS) " + statement[0], statement[1])
        plan = "\n".join(row[0] for row in rows)
        connection.rollback()
    return plan


def measure(engine: Engine, settings: Settings, size: int) -> Measured:
    result = Measured(size, fill(engine, size))
    due = due_set(engine)
    for round_ in range(ROUNDS + 1):
        with engine.begin() as connection:
            connection.execute(text(RESET_DUE))
        bus = RecordingBus()
        relay = Relay(engine, bus, settings)
        gc.collect()
        gc.disable()
        try:
            with captured(engine) as statements:
                started = time.perf_counter()
                relay.publish_pending()
                seconds = time.perf_counter() - started
        finally:
            gc.enable()
        if problem := check(bus, due):
            result.errors.append(f"{size:,} rows, run {round_}: {problem}")
        if round_ == 0:
            result.plan = explain(engine, statements[0])
        else:
            result.runs.append(seconds)
    return result


def retention_rate(engine: Engine, settings: Settings) -> dict[str, Any]:
    """The oldest EXPIRED published rows set 8 days back; one run deletes them in its batches."""
    with engine.begin() as connection:
        connection.execute(text("SET LOCAL statement_timeout = 0"))
        connection.execute(
            text(
                "UPDATE outbox_events SET published_at = now() - interval '8 days' WHERE id IN ("
                "SELECT id FROM outbox_events WHERE published_at IS NOT NULL ORDER BY published_at LIMIT :n)"
            ),
            {"n": EXPIRED},
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("SET statement_timeout = 0"))
        connection.execute(text("VACUUM (ANALYZE) outbox_events"))
        connection.execute(text("RESET statement_timeout"))
    relay = Relay(engine, RecordingBus(), settings)
    started = time.perf_counter()
    deleted = relay.publish_pending().deleted
    seconds = time.perf_counter() - started
    return {"deleted": deleted, "seconds": round(seconds, 2), "rowsPerSecond": round(deleted / seconds)}


def plan_summary(plan: str) -> str:
    executed = re.search(r"Execution Time: ([\d.]+) ms", plan)
    line = f"{float(executed.group(1)) if executed else float('nan'):7.2f} ms"
    for index in ("outbox_events_unpublished_idx", "outbox_events_unpublished_photo_idx"):
        line += f"; {index}: {'used' if index in plan else 'NOT USED'}"
    for table, rows in re.findall(r"Seq Scan on (\w+) .*?actual time=\S+ rows=(\d+)", plan):
        line += f"; Seq Scan on {table} ({int(rows):,} rows)"
    return line


# --- the run ---------------------------------------------------------------------------------------


def verdict(met: bool) -> str:
    return "MET" if met else "MISSED"


def main() -> None:
    started = time.perf_counter()
    results: dict[str, Any] = {}
    with (
        stack.database(
            stack.ROOT / ".local" / "bench-relay", name="photo_publish_bench_relay", keep=False
        ) as url,
        moto_process(),
    ):
        os.environ.setdefault("AWS_DEFAULT_REGION", stack.REGION)
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        boto3.client("events").create_event_bus(Name=BUS)
        stack.migrate(url)
        settings = Settings(
            database_url=url, photo_bucket="photo-publish-bench", stage="bench", event_bus_name=BUS
        )
        engine = create_database_engine(settings)
        try:
            print(
                f"commit to bus with the hand-off: {HANDOFF_PHOTOS} photos, {WORKERS} at a time", flush=True
            )
            results["handoff"] = handoff_latency(engine, settings)
            print(
                f"commit to bus through the relay alone: {COMMIT_RATE}/s for {WINDOW:.0f} s, relay every {SCHEDULE:.0f} s",
                flush=True,
            )
            results["relayAlone"] = relay_latency(engine, settings)
            results["throughput"] = relay_throughput(engine, settings)
            print("the relay's run at 10k and 1M published rows", flush=True)
            sized = [measure(engine, settings, size) for size in SIZES]
            results["retention"] = retention_rate(engine, settings)
        finally:
            engine.dispose()
    report(results, sized)
    errors = [e for m in sized for e in m.errors]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "relay.json").write_text(json.dumps(results, indent=1))
    for error in errors:
        print(f"FAILED: {error}")
    print(
        f"\nwritten {(RESULTS / 'relay.json').relative_to(stack.ROOT)}; total {time.perf_counter() - started:.0f} s"
    )
    if errors:
        raise SystemExit(1)


def report(results: dict[str, Any], sized: list[Measured]) -> None:
    handoff, alone, throughput = results["handoff"], results["relayAlone"], results["throughput"]
    print("\ncommit to bus (from the publish transaction's commit to PutEvents accepting its event)")
    print(f"{'path':<28} {'events':>7} {'p50 s':>8} {'p99 s':>8} {'max s':>8}")
    for name, figures in (
        ("hand-off after the commit", handoff),
        (f"relay alone, every {SCHEDULE:.0f} s", alone),
    ):
        print(
            f"{name:<28} {figures['accepted']:>7} {figures['p50']:>8.3f} {figures['p99']:>8.3f} {figures['max']:>8.3f}"
        )
    print(f"hand-offs that failed: {handoff['failures']}; relay runs took {alone['runSeconds']} s")
    print(
        f"hand-off p99 < {HANDOFF_TARGET:.0f} s: {verdict(handoff['p99'] is not None and handoff['p99'] < HANDOFF_TARGET)}"
    )
    print(
        f"\nrelay throughput against moto's server: {throughput['events']} events in {throughput['seconds']} s,"
        f" {throughput['calls']} PutEvents calls: {throughput['eventsPerSecond']} events/s"
    )
    print(f"\nthe relay's run, {DUE} waiting events (median of {ROUNDS} after a warm-up, in-process bus)")
    print(f"{'outbox rows':>12} {'fill s':>8} {'median ms':>10} {'min ms':>8} {'max ms':>8} {'events/s':>9}")
    for m in sized:
        print(
            f"{m.size:>12,} {m.fill_seconds:>8.1f} {m.median * 1000:>10.1f} {min(m.runs) * 1000:>8.1f}"
            f" {max(m.runs) * 1000:>8.1f} {DUE / m.median:>9,.0f}"
        )
    for m in sized:
        print(f"{m.size:>12,} claim: {plan_summary(m.plan)}")
    print(
        f"\nEXPLAIN (ANALYZE, BUFFERS) of the claiming statement at {sized[-1].size:,} rows:\n{sized[-1].plan}"
    )
    ratio = sized[-1].median / sized[0].median
    results["sizes"] = [
        {"rows": m.size, "medianSeconds": round(m.median, 4), "eventsPerSecond": round(DUE / m.median)}
        for m in sized
    ]
    results["ratio"] = round(ratio, 3)
    retention = results["retention"]
    print(
        f"\nretention: {retention['deleted']:,} expired rows deleted in {retention['seconds']} s"
        f" ({retention['rowsPerSecond']:,} rows/s, batches of 1,000)"
    )
    print(f"\ntime per run {sized[-1].size:,} / {sized[0].size:,}: x{ratio:.2f}")
    print(f"target ratio <= {TARGET_RATIO}: {verdict(ratio <= TARGET_RATIO)}")


if __name__ == "__main__":
    main()
