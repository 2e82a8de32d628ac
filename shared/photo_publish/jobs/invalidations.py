"""Erasures reach the CDN (SPEC 19): the paths a deletion still has to invalidate, and their sending.

A deletion's transaction records its photo's variants path (`request_invalidations`: one wildcard a photo, every
version and size) in cdn_invalidations. After the commit, once the photo's objects are gone from
S3, the deleter sends it (`send_invalidations`, its own paths); the sweep sends whatever is left. Sending
leases the rows (next_try_at moved past the call) in a short transaction, calls CloudFront with no
transaction open, then deletes the rows the accepted call covered; a refusal puts them back with a
growing wait (attempts + 1). A row goes only once CloudFront accepted a call covering it; a path
sent twice (a lease that ran out) costs one path more, nothing else.

CloudFront keeps at most 15 wildcard paths in progress per distribution: a call carries 15 at
most, and where more are waiting the photos of one album go as that album's one path
(`/{stage}/albums/{album}/variants/*`), so an album erasure of any size is one path, one call.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol
from uuid import UUID

from sqlalchemy import Connection, Engine, delete, func, select, update
from sqlalchemy.dialects.postgresql import insert

from photo_publish.adapters.cdn import MAX_WILDCARD_PATHS
from photo_publish.adapters.tables import cdn_invalidations
from photo_publish.adapters.unit_of_work import unit_of_work
from photo_publish.keys import photo_prefixes

# A recorded path waits this long for its deleter (objects deleted, then its own call) before the
# sweep takes it: invalidated while S3 still holds the objects, an edge could fetch them again.
DELETER_SECONDS = 60
# A leased row is taken again after this, should its sender die between its call and the answer.
LEASE_SECONDS = 300
# A refused path waits the sweep's period, doubling with each refusal up to an hour.
BACKOFF_BASE_SECONDS = 60
BACKOFF_MAX_SECONDS = 3600
# Rows read to plan one call: an album erasure of up to this many photos is settled by one call.
READ_LIMIT = 5000

_PHOTO_PATH = re.compile(r"(/[^/]+/albums/[^/]+/variants/)[^/]+/\*")


class Invalidator(Protocol):
    def invalidate(self, paths: Sequence[str]) -> bool: ...


@dataclass(frozen=True)
class Sent:
    """Rows a call settled (CloudFront accepted it), and rows it left to a later try (refused)."""

    invalidated: int = 0
    failed: int = 0


def photo_path(stage: str, album_id: UUID, photo_id: UUID) -> str:
    """The CDN path of every variant of a photo, of every version: the URL path of its S3 prefix."""
    return f"/{photo_prefixes(stage, album_id, photo_id)[1]}*"


def request_invalidations(connection: Connection, paths: Sequence[str]) -> None:
    """Record paths to invalidate, inside the deletion's own transaction."""
    if not paths:
        return
    statement = insert(cdn_invalidations).values(
        [
            {
                "path": path,
                # The statement's time, not the transaction's: a sender settles only rows requested
                # before it leased them (see `send_invalidations`).
                "requested_at": func.clock_timestamp(),
                "next_try_at": func.now() + timedelta(seconds=DELETER_SECONDS),
            }
            for path in dict.fromkeys(paths)
        ]
    )
    # Asked again while waiting (a hidden photo deleted): a new request, whatever the old one's fate.
    connection.execute(
        statement.on_conflict_do_update(
            index_elements=[cdn_invalidations.c.path],
            set_={
                "requested_at": statement.excluded.requested_at,
                "next_try_at": statement.excluded.next_try_at,
                "attempts": 0,
            },
        )
    )


def discard_invalidations(engine: Engine, limit: int = READ_LIMIT) -> int:
    """Waiting paths of a deployment with no CDN (the sweep knows no distribution): nothing serves
    them, so nothing is to invalidate. How many were dropped."""
    with unit_of_work(engine) as connection:
        oldest = select(cdn_invalidations.c.path).order_by(cdn_invalidations.c.requested_at).limit(limit)
        return len(
            connection.scalars(
                delete(cdn_invalidations)
                .where(cdn_invalidations.c.path.in_(oldest.scalar_subquery()))
                .returning(cdn_invalidations.c.path)
            ).all()
        )


def defer_invalidations(engine: Engine, paths: Sequence[str], seconds: float) -> None:
    """Paths whose objects S3 still holds (their deletion failed) wait for the sweep's purge."""
    with unit_of_work(engine) as connection:
        connection.execute(
            update(cdn_invalidations)
            .where(cdn_invalidations.c.path.in_(paths))
            .values(next_try_at=func.now() + timedelta(seconds=max(seconds, LEASE_SECONDS)))
        )


def album_path(path: str) -> str | None:
    """The album's variants path for a photo's (`/dev/albums/A/variants/P/*` -> `.../A/variants/*`)."""
    match = _PHOTO_PATH.fullmatch(path)
    return f"{match.group(1)}*" if match else None


def plan(rows: Sequence[str]) -> tuple[list[str], list[str]]:
    """One call's paths for the rows waiting (oldest first), and the rows that call covers.

    Up to 15 rows go as they are. Beyond, each album with several rows goes as its album's path,
    and the call takes the first 15 paths; rows it does not cover are left for a later one.
    """
    if len(rows) <= MAX_WILDCARD_PATHS:
        return list(rows), list(rows)
    albums = Counter(album_path(row) for row in rows)
    call: list[str] = []
    covered: list[str] = []
    for row in rows:
        album = album_path(row)
        path = album if album is not None and albums[album] > 1 else row
        if path not in call:
            if len(call) == MAX_WILDCARD_PATHS:
                continue
            call.append(path)
        covered.append(row)
    return call, covered


def send_invalidations(engine: Engine, cdn: Invalidator, *, paths: Sequence[str] | None = None) -> Sent:
    """One CreateInvalidation call for the waiting rows that are due (or for `paths`, a deleter's
    own, due or not unless leased or deferred), at most 15 wildcard paths."""
    path_column = cdn_invalidations.c.path
    taken = select(path_column)
    if paths is None:
        taken = taken.where(cdn_invalidations.c.next_try_at <= func.now())
    elif not paths:
        return Sent()
    else:
        # Not a row another sender leased, nor one waiting for the purge (both later than this).
        taken = taken.where(
            path_column.in_(paths),
            cdn_invalidations.c.next_try_at <= func.now() + timedelta(seconds=DELETER_SECONDS),
        )
    taken = (
        taken.order_by(cdn_invalidations.c.requested_at, path_column)
        .limit(READ_LIMIT)
        .with_for_update(skip_locked=True)
    )
    with unit_of_work(engine) as connection:
        rows = list(connection.scalars(taken))
        if not rows:
            return Sent()
        call, leased = plan(rows)
        # Read after the rows were locked: a request made from now on waits for this commit and is
        # stamped later, so the call below does not settle it.
        cutoff = connection.scalar(select(func.clock_timestamp()))
        connection.execute(
            update(cdn_invalidations)
            .where(path_column.in_(leased))
            .values(next_try_at=func.now() + timedelta(seconds=LEASE_SECONDS))
        )
    # No transaction open while CloudFront answers.
    accepted = cdn.invalidate(call)
    with unit_of_work(engine) as connection:
        if accepted:
            settled = connection.execute(
                delete(cdn_invalidations).where(
                    path_column.in_(leased), cdn_invalidations.c.requested_at <= cutoff
                )
            )
            return Sent(invalidated=settled.rowcount)
        wait = func.least(
            BACKOFF_BASE_SECONDS * func.power(2, cdn_invalidations.c.attempts), BACKOFF_MAX_SECONDS
        )
        connection.execute(
            update(cdn_invalidations)
            .where(path_column.in_(leased))
            .values(
                attempts=cdn_invalidations.c.attempts + 1,
                next_try_at=func.now() + func.make_interval(0, 0, 0, 0, 0, 0, wait),
            )
        )
    return Sent(failed=len(leased))
