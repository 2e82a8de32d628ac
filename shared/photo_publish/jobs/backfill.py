"""The backfill (SPEC 14): re-render published photos whose variants are on an older recipe.

The operator marks them (`rerender`); the scheduled sweep sends a bounded number of marked photos
at a time, while the process queue is short; the process function renders each under the new
version's keys and replaces its variants in one transaction. Marking is idempotent (only photos
below the version are marked, so running it again renders nothing), `stop` clears the marks not yet
sent (the photos in flight finish), and marking again resumes. Marking commits batch by batch and,
given the time it has, stops before a batch it may not finish: the next run resumes after the
photos already marked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

from sqlalchemy import ColumnElement, Engine, func, or_, select, true

from photo_publish.adapters.models import Photo, PhotoJob
from photo_publish.adapters.unit_of_work import unit_of_work
from photo_publish.budget import Remaining, forever
from photo_publish.jobs import machine
from photo_publish.settings import STALE_AFTER_SECONDS

# What a photo costs to re-render, from `make bench` on this project's corpus (docs/performance.md):
# 0.58 s of one vCPU at 1769 MB, and Lambda's arm64 price per GB-second.
RENDER_SECONDS_PER_PHOTO = 0.58
FUNCTION_GB = 1769 / 1024
PRICE_PER_GB_SECOND = 0.0000133334
# Photos marked per statement: a million photos are marked in a hundred short transactions.
MARK_BATCH = 10_000


@dataclass(frozen=True, slots=True)
class Selection:
    """Which published photos: all of them, some by id, or one album's."""

    photo_ids: Sequence[UUID] | None = None
    album_id: UUID | None = None

    def where(self, version: int) -> ColumnElement[bool]:
        """The selected published photos below `version` whose job is finished (or missing) and not
        marked for `version` yet: what `mark` marks; a job at work keeps its own course. (Marked
        ones left out: a marking stopped for time resumes after them instead of marking them again.)"""
        finished = select(PhotoJob.photo_id).where(
            PhotoJob.status.in_(machine.MARK_RERENDER.source),
            (PhotoJob.status != machine.DONE) | PhotoJob.rerender_to.is_distinct_from(version),
        )
        has_job = select(PhotoJob.photo_id)
        condition = (
            (Photo.processing_state == "ready")
            & (func.coalesce(Photo.variant_version, 0) < version)
            & or_(Photo.id.in_(finished), Photo.id.not_in(has_job))
        )
        if self.photo_ids is not None:
            condition &= Photo.id.in_(self.photo_ids)
        if self.album_id is not None:
            condition &= Photo.album_id == self.album_id
        return condition


@dataclass(frozen=True, slots=True)
class Estimate:
    photos: int
    render_seconds: float
    cost_usd: float

    def as_dict(self) -> dict[str, float | int]:
        return {
            "photos": self.photos,
            "renderSeconds": round(self.render_seconds),
            "costUsd": round(self.cost_usd, 2),
        }


def estimate(engine: Engine, version: int, selection: Selection) -> Estimate:
    """What `mark` would mark, and what re-rendering it would take (the dry run)."""
    with unit_of_work(engine) as connection:
        photos = int(connection.scalar(select(func.count()).where(selection.where(version))) or 0)
    seconds = photos * RENDER_SECONDS_PER_PHOTO
    return Estimate(photos, seconds, seconds * FUNCTION_GB * PRICE_PER_GB_SECOND)


@dataclass(frozen=True, slots=True)
class Marked:
    marked: int
    # The time ran out before every selected photo was marked: marking again resumes.
    out_of_time: bool = False


def mark(
    engine: Engine,
    version: int,
    selection: Selection,
    *,
    lease_seconds: int = STALE_AFTER_SECONDS,
    remaining: Remaining = forever,
    reserve_seconds: float = 10.0,
) -> Marked:
    """Mark the selected photos below `version` for a re-render at it; how many were marked.

    A finished job (done, or failed: a re-render that failed for good leaves its photo published)
    gets the mark; a job at work keeps its own course; a photo with no job row gets one. In
    batches of MARK_BATCH, in the order of the photos' ids, each committed; no batch is begun with
    less than `reserve_seconds` left of `remaining`.
    """
    marked, after = 0, None
    while True:
        if remaining() < reserve_seconds:
            return Marked(marked, out_of_time=True)
        with unit_of_work(engine) as connection:
            ids = list(
                connection.scalars(
                    select(Photo.id)
                    .where(selection.where(version), Photo.id > after if after else true())
                    .order_by(Photo.id)
                    .limit(MARK_BATCH)
                )
            )
            if not ids:
                return Marked(marked)
            marked += machine.mark_rerender(connection, ids, version, lease_seconds=lease_seconds)
            after = ids[-1]


def stop(engine: Engine) -> int:
    """Clear the marks the sweep has not sent yet; the number cleared (marking again resumes)."""
    with unit_of_work(engine) as connection:
        return machine.stop_rerender(connection)
