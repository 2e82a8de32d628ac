"""Each transition of the job machine moves exactly the jobs its declaration says (SPEC 16).

For every transition and every status, a job in that status, with every other condition of the
transition met (due, stale, owed, marked, an attempt to fence on), is put through it on PostgreSQL:
it must change the row exactly when its declared source holds that status, into a declared target,
and the row must still satisfy the table's CHECKs (the statement would fail otherwise).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, func, select, update

from photo_publish.adapters.models import Photo, PhotoJob
from photo_publish.adapters.tables import photo_jobs
from photo_publish.errors import ErrorCode
from photo_publish.jobs import machine
from photo_publish.keys import Upload
from tests.integration.test_database import new_photo
from tests.rows import in_state

STATUSES = ("pending", "active", "done", "failed")
LONG_AGO = timedelta(hours=2)
ATTEMPT = 1

# Each transition on one job, with its other conditions met by the row `job_in` builds.
CALLS: dict[str, Callable[[Connection, uuid.UUID], Any]] = {
    "ensure": machine.ensure,
    "reopen": lambda c, p: machine.reopen(c, p, Upload("0B", "e-new"), lease_seconds=60),
    "note_upload": lambda c, p: machine.note_upload(c, p, Upload("0B", "e-new")),
    "claim": lambda c, p: machine.claim(c, p, stale_after=60, max_attempts=9),
    "step_aside": lambda c, p: machine.step_aside(c, p, ATTEMPT),
    "release": lambda c, p: machine.release(c, p, ATTEMPT, ErrorCode.STORAGE_READ_FAILED, 30),
    "fail": lambda c, p: machine.fail(c, p, ATTEMPT, ErrorCode.DECODE_FAILED, final=False),
    "fail_finally": lambda c, p: machine.fail(c, p, ATTEMPT, ErrorCode.STORAGE_READ_FAILED, final=True),
    "requeue_lost": lambda c, p: machine.requeue_lost(c, stale_after=60, max_attempts=9, limit=10),
    "fail_lost": lambda c, p: machine.fail_lost(c, stale_after=60, max_attempts=ATTEMPT, limit=10),
    "publish": lambda c, p: machine.publish(c, p, ATTEMPT),
    "settle_published": machine.settle_published,
    "stamp": lambda c, p: machine.stamp_due(c, wait=timedelta(minutes=10), limit=10),
    "unstamp": lambda c, p: machine.unstamp(c, [p]),
    "lease_letter": lambda c, p: machine.lease_letters(c, lease_seconds=60, limit=10, photo_id=p),
    "settle_letter": lambda c, p: machine.settle_letters(c, [_owed(c, p)]),
    "release_letter": lambda c, p: machine.release_letters(c, [_owed(c, p)], lease_seconds=60),
    "retry": lambda c, p: machine.retry(c, [p], lease_seconds=60),
    "mark_rerender": lambda c, p: machine.mark_rerender(c, [p], 9, lease_seconds=60),
    "stop_rerender": lambda c, p: machine.stop_rerender(c),
    "start_rerender": lambda c, p: machine.start_rerender(c, limit=10),
    "delete": lambda c, p: machine.delete(c, p, purge_after=timedelta(minutes=5)),
}


def _owed(connection: Connection, photo_id: uuid.UUID) -> machine.OwedLetter:
    """The letter of the job's own failure, as its sender holds it."""
    failed_at = connection.scalar(select(photo_jobs.c.failed_at).where(photo_jobs.c.photo_id == photo_id))
    return machine.OwedLetter(photo_id, ATTEMPT, ErrorCode.STORAGE_READ_FAILED, failed_at)


def job_in(db: Engine, status: str) -> uuid.UUID:
    """A job in `status` that meets every other condition of some transition: its photo published
    at the version it is marked for, its letter (when failed) owed past its lease."""
    photo_id = new_photo(db)
    with db.begin() as connection:
        connection.execute(
            update(Photo)
            .where(Photo.id == photo_id)
            .values(
                processing_state="ready",
                visibility="published",
                published_at=func.now(),
                variant_version=9,
                # read from an earlier upload than the one `reopen` announces (a new picture)
                original_etag="e-old",
            )
        )
    ago = func.now() - LONG_AGO
    values: dict[str, Any] = {"status": status, "attempt": ATTEMPT, "created_at": ago, "rerender_to": 9}
    if status == "active":
        values["claimed_at"] = ago  # stale
    if status == "pending":
        values["enqueued_at"] = ago  # sent by a sweep long ago
    if status == "failed":
        values |= {"failed_at": ago, "dead_letter_owed_at": ago, "last_error_code": "STORAGE_READ_FAILED"}
        values["upload_etag"] = "e-old"
    with db.begin() as connection:
        connection.execute(update(PhotoJob).where(PhotoJob.photo_id == photo_id).values(**in_state(**values)))
    return photo_id


def row(db: Engine, photo_id: uuid.UUID) -> Any:
    with db.connect() as connection:
        return connection.execute(select(photo_jobs).where(photo_jobs.c.photo_id == photo_id)).one_or_none()


@pytest.mark.parametrize("status", STATUSES)
@pytest.mark.parametrize("name", list(CALLS))
def test_a_transition_moves_exactly_the_jobs_it_declares(db: Engine, name: str, status: str) -> None:
    transition = machine.TRANSITIONS[name]
    # GIVEN a job in `status`, every other condition of the transition met
    photo_id = job_in(db, status)
    before = row(db, photo_id)

    # WHEN the transition is applied to it
    with db.begin() as connection:
        CALLS[name](connection, photo_id)
    after = row(db, photo_id)

    # THEN it changed the job exactly when the declaration says, into a declared status, and only
    # the columns the declaration names
    if transition.target == ("-",):
        assert (after is None) == (status in transition.source)
        return
    changed = after.updated_at != before.updated_at
    assert changed == (status in transition.source)
    if changed:
        assert after.status in transition.target
        names = {column.name for column in photo_jobs.columns}
        moved = {c for c in names if getattr(after, c) != getattr(before, c)} - {"updated_at"}
        assert moved <= transition.sets


def test_every_transition_with_a_source_is_put_through_every_status() -> None:
    assert set(CALLS) == {name for name, t in machine.TRANSITIONS.items() if t.source != ("-",)} | {"ensure"}
