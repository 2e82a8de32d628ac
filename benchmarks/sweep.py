"""The sweep (SPEC 7) on a small table and on a big one: its cost must follow the work due, not the tables.

The same database is filled twice, with 10 thousand and then with 1 million photos (one job each),
by set-based SQL (INSERT ... SELECT over generate_series), then VACUUM ANALYZE. Both fills hold the
SAME fixed set of due rows (400 pending rows waited SWEEP_AFTER_SECONDS past their due time and
never sent, 80 stale active rows with attempts left, 20 stale active rows with none left), and 100
pending rows a sweep sent two minutes ago (not due again). Around them, a mix in proportion to the
size: history (96% done, published mostly; 4% failed), pending rows inside their grace (2%, new ones
and ones waiting for a retry time in the future), active rows claimed in the last minute (1%). The
photo ids are random-looking (md5 of a counter); the live rows (due, in grace, active) are inserted
last, at the end of the heap, as the newest rows of a table that grew over two years would be.

At each size, Sweeper(...).run() is timed: one warm-up run, then ROUNDS runs, the due rows set back
to their first state (one UPDATE of the jobs, one of the photos, untimed) before each run, so every
run does the same work; Python's garbage collector is paused inside a timed run (as timeit does)
and run between runs. The queue is an in-process recorder (send_jobs returns no failures): this
measures the database side of the sweep, not SQS. Each run must send exactly the 480 job messages
and 20 dead letters due; a run that does not fails the benchmark (exit status 1). Autovacuum is off
on the two tables while measuring, so both sizes carry the same dead rows from the runs.

It prints the median time per run at both sizes, due rows per second, the ratio 1M / 10k, and the
EXPLAIN (ANALYZE, BUFFERS) plans of the sweep's two selecting statements at 1M: the very statements
the Sweeper sent in a run (captured from the engine, parameters included), run again on the reset
due set in a transaction that is rolled back. The target is checked as a printed verdict, never as
an assertion. DATABASE_URL names a server to use; otherwise an embedded PostgreSQL in
.local/bench-sweep.
"""

from __future__ import annotations

import gc
import re
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from sqlalchemy import Engine, event, text

from devkit import stack
from devkit.stack import ROOT
from photo_publish.adapters.database import create_database_engine
from photo_publish.errors import ErrorCode
from photo_publish.jobs.sweep import Sweeper
from photo_publish.settings import Settings

SIZES = (10_000, 1_000_000)
ROUNDS = 7
TARGET_RATIO = 1.5

# The fixed set, the same at both sizes.
SWEPT = 100  # pending, sent by a sweep two minutes ago: not due again yet
DUE_PENDING = 400  # pending, due time older than SWEEP_AFTER_SECONDS, never sent
STALE = 100  # active, claimed longer ago than STALE_AFTER_SECONDS; every fifth one exhausted
STALE_LOST = STALE // 5
DUE_SENT = DUE_PENDING + STALE - STALE_LOST
# In proportion to the size.
FRESH_SHARE = 0.02  # pending inside their grace
WORKING_SHARE = 0.01  # active, claimed in the last minute

INDEXES = {"pending": "photo_jobs_pending_due_idx", "stale": "photo_jobs_active_claimed_idx"}

# One row per photo: its kind and the job's columns. The history comes first, the live rows last.
FILL = """
CREATE UNLOGGED TABLE bench_fill AS
WITH s AS (
    SELECT i, md5('photo-' || i)::uuid AS id, md5('album-' || (i / 40))::uuid AS album_id,
           CASE
               WHEN i <= :history THEN CASE WHEN i % 25 = 0 THEN 'failed' ELSE 'done' END
               WHEN i <= :swept THEN 'swept'
               WHEN i <= :due THEN 'due'
               WHEN i <= :stale THEN CASE WHEN i % 5 = 0 THEN 'lost' ELSE 'stale' END
               WHEN i <= :fresh THEN CASE WHEN i % 2 = 0 THEN 'retrying' ELSE 'fresh' END
               ELSE 'working'
           END AS kind
    FROM generate_series(1, :n) AS i
), t AS (
    SELECT s.*,
           CASE kind
               WHEN 'done' THEN now() - interval '3 hours'
                   - interval '730 days' * ((:history - i + 1)::float8 / :history)
               WHEN 'failed' THEN now() - interval '3 hours'
                   - interval '730 days' * ((:history - i + 1)::float8 / :history)
               WHEN 'swept' THEN now() - make_interval(secs => 3 * :sweep_after + :swept - i)
               WHEN 'due' THEN now() - make_interval(secs => 2 * :sweep_after + 2 * (:due - i))
               WHEN 'stale' THEN now() - make_interval(secs => 2 * :stale_after + :stale - i + 20)
               WHEN 'lost' THEN now() - make_interval(secs => 2 * :stale_after + :stale - i + 20)
               WHEN 'fresh' THEN now() - make_interval(secs => (:fresh - i) * :sweep_after / 2.0 / :n_fresh)
               WHEN 'retrying' THEN now() - make_interval(secs => 120 + i % 200)
               ELSE now() - make_interval(secs => 5 + (:n - i) * :stale_after / 5.0 / :n_working)
           END AS created_at
    FROM s
)
SELECT i, id, album_id, kind, created_at,
       CASE WHEN kind IN ('done', 'failed') THEN kind
            WHEN kind IN ('stale', 'lost', 'working') THEN 'active'
            ELSE 'pending' END AS status,
       CASE kind WHEN 'done' THEN 1 WHEN 'failed' THEN :max_attempts WHEN 'lost' THEN :max_attempts
                 WHEN 'stale' THEN 1 + i % 2 WHEN 'due' THEN (i % 4 = 0)::int
                 WHEN 'retrying' THEN 1 WHEN 'working' THEN 1 ELSE 0 END AS attempt,
       CASE WHEN kind = 'due' AND i % 4 = 0 THEN created_at + interval '30 seconds'
            WHEN kind = 'retrying' THEN now() + make_interval(secs => 60 + i % 180) END AS next_retry_at,
       CASE WHEN kind IN ('done', 'failed') THEN created_at + interval '2 seconds'
            WHEN kind IN ('stale', 'lost') THEN created_at + interval '20 seconds'
            WHEN kind = 'working' THEN created_at + interval '5 seconds' END AS claimed_at,
       CASE WHEN kind = 'swept' THEN now() - make_interval(secs => :sweep_after / 5) END AS enqueued_at,
       CASE WHEN kind = 'failed' THEN 'DECODE_FAILED'
            WHEN kind = 'retrying' OR (kind = 'due' AND i % 4 = 0) THEN 'STORAGE_READ_FAILED'
            WHEN kind IN ('stale', 'lost') AND i % 2 = 0 THEN 'DATABASE_UNAVAILABLE' END AS last_error_code
FROM t
"""

INSERT_PHOTOS = """
INSERT INTO photos (id, album_id, original_key, processing_state, visibility, published_at,
                    width, height, error_code, created_at, updated_at)
SELECT id, album_id, :prefix || 'albums/' || album_id || '/' || id || '/IMG_' || i || '.jpg',
       CASE kind WHEN 'done' THEN 'ready' WHEN 'failed' THEN 'processing_failed' ELSE 'uploaded' END,
       CASE WHEN kind = 'done' AND i % 10 <> 0 THEN 'published' ELSE 'unpublished' END,
       CASE WHEN kind = 'done' AND i % 10 <> 0 THEN created_at + interval '1 minute' END,
       CASE WHEN kind = 'done' THEN 4032 END, CASE WHEN kind = 'done' THEN 3024 END,
       CASE WHEN kind = 'failed' THEN 'DECODE_FAILED' END,
       created_at, created_at + interval '1 minute'
FROM bench_fill ORDER BY i
"""

INSERT_JOBS = """
INSERT INTO photo_jobs (photo_id, status, attempt, next_retry_at, claimed_at, enqueued_at,
                        last_error_code, created_at, updated_at)
SELECT id, status, attempt, next_retry_at, claimed_at, enqueued_at, last_error_code, created_at,
       greatest(created_at, claimed_at, enqueued_at) + interval '1 second'
FROM bench_fill ORDER BY i
"""

# The first state of the rows a run changes, to put them back before the next run.
SAVE_DUE = """
CREATE TABLE bench_due AS
SELECT j.photo_id, f.kind, j.status, j.attempt, j.next_retry_at, j.claimed_at, j.enqueued_at,
       j.last_error_code, j.updated_at, p.processing_state, p.error_code
FROM bench_fill f JOIN photo_jobs j ON j.photo_id = f.id JOIN photos p ON p.id = f.id
WHERE f.kind IN ('due', 'stale', 'lost')
"""

RESET_JOBS = """
UPDATE photo_jobs j
SET status = d.status, attempt = d.attempt, next_retry_at = d.next_retry_at, claimed_at = d.claimed_at,
    enqueued_at = d.enqueued_at, last_error_code = d.last_error_code, updated_at = d.updated_at
FROM bench_due d WHERE j.photo_id = d.photo_id
"""

RESET_PHOTOS = """
UPDATE photos p SET processing_state = d.processing_state, error_code = d.error_code
FROM bench_due d
WHERE p.id = d.photo_id AND p.processing_state IS DISTINCT FROM d.processing_state
"""


class RecordingQueue:
    """The sweep's queue, in process: it records what was sent and fails nothing."""

    def __init__(self) -> None:
        self.jobs: list[UUID] = []
        self.dead_letters: list[tuple[UUID, int, ErrorCode]] = []

    def depth(self) -> int:
        return 0

    def send_jobs(self, photo_ids: Sequence[UUID], *, spread_seconds: float = 0) -> list[UUID]:
        self.jobs.extend(photo_ids)
        return []

    def send_dead_letter(
        self, photo_id: UUID, attempt: int, code: ErrorCode, detail: str = "", *, kind: str = "photo"
    ) -> bool:
        self.dead_letters.append((photo_id, attempt, code))
        return True

    def delete_variants(self, keys: Sequence[str]) -> list[str]:
        return list(keys)


@dataclass
class Measured:
    size: int
    fill_seconds: float
    runs: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    plans: dict[str, str] = field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.runs)


def fill(engine: Engine, settings: Settings, size: int) -> float:
    """Empty the tables and fill them with `size` photos and jobs; returns the seconds it took."""
    fresh, working = round(size * FRESH_SHARE), round(size * WORKING_SHARE)
    history = size - SWEPT - DUE_PENDING - STALE - fresh - working
    bounds = {
        "n": size,
        "history": history,
        "swept": history + SWEPT,
        "due": history + SWEPT + DUE_PENDING,
        "stale": history + SWEPT + DUE_PENDING + STALE,
        "fresh": history + SWEPT + DUE_PENDING + STALE + fresh,
        "n_fresh": fresh,
        "n_working": working,
        "sweep_after": settings.sweep_after_seconds,
        "stale_after": settings.stale_after_seconds,
        "max_attempts": settings.max_attempts,
    }
    started = time.perf_counter()
    with engine.begin() as connection:
        connection.execute(text("DROP TABLE IF EXISTS bench_fill, bench_due"))
        connection.execute(text("TRUNCATE photos, photo_variants, photo_jobs, outbox_events CASCADE"))
        for table in ("photos", "photo_jobs"):
            connection.execute(text(f"ALTER TABLE {table} SET (autovacuum_enabled = off)"))
        connection.execute(text(FILL), bounds)
        connection.execute(text(INSERT_PHOTOS), {"prefix": settings.originals_prefix})
        connection.execute(text(INSERT_JOBS))
        connection.execute(text(SAVE_DUE))
        connection.execute(text("DROP TABLE bench_fill"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM (ANALYZE) photos, photo_jobs, bench_due"))
    return time.perf_counter() - started


def reset(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.execute(text(RESET_JOBS))
        connection.execute(text(RESET_PHOTOS))


def expected(engine: Engine) -> tuple[set[UUID], set[UUID]]:
    """The ids a run must send as job messages, and those it must send as dead letters."""
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT photo_id, kind FROM bench_due")).all()
    return {r.photo_id for r in rows if r.kind != "lost"}, {r.photo_id for r in rows if r.kind == "lost"}


def check(queue: RecordingQueue, jobs: set[UUID], lost: set[UUID]) -> str | None:
    sent, dead = queue.jobs, [photo_id for photo_id, _, _ in queue.dead_letters]
    if len(sent) == len(jobs) and set(sent) == jobs and len(dead) == len(lost) and set(dead) == lost:
        return None
    return (
        f"sent {len(sent)} job messages ({len(set(sent) & jobs)} of the {len(jobs)} due) and "
        f"{len(dead)} dead letters ({len(set(dead) & lost)} of the {len(lost)} due)"
    )


@contextmanager
def captured(engine: Engine) -> Iterator[list[tuple[str, Any]]]:
    """The statements that take rows with SKIP LOCKED, as sent to the driver, parameters included."""
    statements: list[tuple[str, Any]] = []

    def capture(
        _conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool
    ) -> None:
        if "SKIP LOCKED" in statement:
            statements.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", capture)


def explain(engine: Engine, statements: list[tuple[str, Any]]) -> dict[str, str]:
    """EXPLAIN (ANALYZE, BUFFERS) of the captured statements on the reset due set, rolled back."""
    reset(engine)
    plans: dict[str, str] = {}
    with engine.connect() as connection:
        for statement, parameters in statements:
            name = "pending" if "WITH due" in statement else "stale"
            if name in plans:
                continue
            rows = connection.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS) " + statement, parameters)
            plans[name] = "\n".join(row[0] for row in rows)
        connection.rollback()
    return plans


def measure(engine: Engine, settings: Settings, size: int) -> Measured:
    result = Measured(size, fill(engine, settings, size))
    jobs, lost = expected(engine)
    for round_ in range(ROUNDS + 1):
        reset(engine)
        queue = RecordingQueue()
        sweeper = Sweeper(engine, queue, settings, store=queue)
        # As timeit does: no garbage collection of this process inside a timed run (a full one
        # takes ~0.1 s here, more than a whole run), one between runs instead.
        gc.collect()
        gc.disable()
        try:
            with captured(engine) as statements:
                started = time.perf_counter()
                sweeper.run()
                seconds = time.perf_counter() - started
        finally:
            gc.enable()
        if problem := check(queue, jobs, lost):
            result.errors.append(f"{size:,} rows, run {round_}: {problem}")
        if round_ == 0:
            result.plans = explain(engine, statements)
        else:
            result.runs.append(seconds)
    return result


def plan_summary(plan: str, name: str) -> str:
    """Execution time, whether the partial index is used, and any sequential scan."""
    executed = re.search(r"Execution Time: ([\d.]+) ms", plan)
    line = f"{float(executed.group(1)) if executed else float('nan'):7.2f} ms  "
    line += f"{INDEXES[name]}: {'used' if INDEXES[name] in plan else 'NOT USED'}"
    for table, rows in re.findall(r"Seq Scan on (\w+) .*?actual time=\S+ rows=(\d+)", plan):
        line += f"; Seq Scan on {table} ({int(rows):,} rows)"
    return line


def report(results: list[Measured]) -> None:
    print(f"sweep per run, median of {ROUNDS} runs after a warm-up; {DUE_SENT} job messages and")
    print(f"{STALE_LOST} dead letters due at every size (in-process queue: database side only)")
    print(
        f"{'photos/jobs':>12} {'fill s':>8} {'median ms':>10} {'min ms':>8} {'max ms':>8} {'due rows/s':>11}"
    )
    for r in results:
        print(
            f"{r.size:>12,} {r.fill_seconds:>8.1f} {r.median * 1000:>10.1f} {min(r.runs) * 1000:>8.1f} "
            f"{max(r.runs) * 1000:>8.1f} {(DUE_SENT + STALE_LOST) / r.median:>11,.0f}"
        )
    print("\nthe two selecting statements, EXPLAIN ANALYZE (execution time, index, sequential scans)")
    for r in results:
        for name in ("pending", "stale"):
            print(f"{r.size:>12,} {name:8} {plan_summary(r.plans.get(name, ''), name)}")
    big = results[-1]
    for name, plan in big.plans.items():
        print(f"\nEXPLAIN (ANALYZE, BUFFERS) of the {name} statement at {big.size:,} rows:\n{plan}")
    ratio = big.median / results[0].median
    print(f"\ntime per run {big.size:,} / {results[0].size:,}: x{ratio:.2f}")
    print(f"target ratio <= {TARGET_RATIO}: {'met' if ratio <= TARGET_RATIO else 'missed'}")


def main() -> None:
    started = time.perf_counter()
    with stack.database(ROOT / ".local" / "bench-sweep", name="photo_publish_bench_sweep", keep=False) as url:
        stack.migrate(url)
        settings = Settings(database_url=url, photo_bucket="photo-publish-bench", stage="bench")
        engine = create_database_engine(settings)
        try:
            results = [measure(engine, settings, size) for size in SIZES]
        finally:
            engine.dispose()
    report(results)
    errors = [e for r in results for e in r.errors]
    for error in errors:
        print(f"FAILED: {error}")
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    if errors:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
