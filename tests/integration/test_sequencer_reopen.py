"""Finding 4: S3 sequencers of different lengths order uploads after RIGHT-padding the shorter with
zeros (SPEC 5, AWS's event message structure). A failed job is reopened by a newer upload whatever
the two sequencers' lengths, and never by an older one; on a real PostgreSQL."""

from __future__ import annotations

import random
import uuid

import pytest
from sqlalchemy import Engine, insert, literal_column, select, text

from photo_publish.adapters.models import Photo, PhotoJob
from photo_publish.errors import ErrorCode
from photo_publish.jobs import machine
from photo_publish.keys import Upload, sequencer_order
from photo_publish.publish.repository import PhotoRepository
from tests.rows import job

# AWS's own sample sequencer (its event message structure page), and uploads of the same key whose
# sequencers are one digit shorter: right-padded, "...F" is "...F0", after "...E5"; "...E" is
# "...E0", before it. Left-padded to 40, the shorter of two gains a leading zero where the longer
# has its first significant digit ("0" against "5" here), so it reads as the older whatever its
# digits: a newer upload is ignored, and an older but longer one reopens.
STORED = "0055AED6DCD90281E5"
NEWER_SHORTER = "0055AED6DCD90281F"
OLDER_SHORTER = "0055AED6DCD90281E"
# And the other way round: a longer sequencer that is older than the shorter one stored.
STORED_SHORT = "0055AED6DCD90281F"
OLDER_LONGER = "0055AED6DCD90281E5"


def photo_with_a_failed_job(db: Engine, repository: PhotoRepository, seen: Upload) -> uuid.UUID:
    """A photo whose job saw `seen`, then failed for good (its worker was lost)."""
    photo_id = uuid.uuid4()
    with db.begin() as connection:
        connection.execute(
            insert(Photo).values(id=photo_id, album_id=uuid.uuid4(), original_key=f"dev/originals/{photo_id}")
        )
    repository.ensure_job(photo_id, upload=seen)
    # its attempt worked from that upload, and failed
    assert repository.claim(photo_id, stale_after=300, max_attempts=3)
    assert repository.fail(photo_id, 1, ErrorCode.WORKER_LOST, final=False)
    return photo_id


def recorded_etag(db: Engine, photo_id: uuid.UUID) -> str | None:
    with db.connect() as connection:
        return connection.scalar(select(PhotoJob.upload_etag).where(PhotoJob.photo_id == photo_id))


def test_a_newer_upload_with_a_shorter_sequencer_reopens_a_failed_job_and_is_recorded(db: Engine) -> None:
    # GIVEN a photo failed for good after an upload with AWS's sample sequencer
    repository = PhotoRepository(db)
    photo_id = photo_with_a_failed_job(db, repository, Upload(STORED, "etag-first"))

    # WHEN a later upload of the original arrives, its sequencer one digit shorter
    repository.ensure_job(photo_id, upload=Upload(NEWER_SHORTER, "etag-second"))

    # THEN the upload is new proof that the original exists: the job has its attempts again, and
    # the job records the new upload (its eTag) as the newest it has seen
    assert (job(db, photo_id), recorded_etag(db, photo_id)) == (("pending", 0, None), "etag-second")


@pytest.mark.parametrize(
    ("stored", "late"),
    [
        pytest.param(STORED, OLDER_SHORTER, id="older-and-shorter"),
        pytest.param(STORED_SHORT, OLDER_LONGER, id="older-and-longer"),
    ],
)
def test_an_older_upload_arriving_late_never_reopens_a_failed_job(db: Engine, stored: str, late: str) -> None:
    # GIVEN a photo failed for good after an upload
    repository = PhotoRepository(db)
    photo_id = photo_with_a_failed_job(db, repository, Upload(stored, "etag-newest"))

    # WHEN the event of an earlier upload of the original arrives late (S3 delivers out of order)
    repository.ensure_job(photo_id, upload=Upload(late, "etag-earlier"))

    # THEN nothing is reopened and the newest upload stays the one recorded
    assert (job(db, photo_id), recorded_etag(db, photo_id)) == (("failed", 1, "WORKER_LOST"), "etag-newest")


# The comparison ensure_job should make (SPEC 5), on the sequencers as S3 sent them (unpadded):
# both right-padded to the longer one's length, in upper case, compared byte by byte.
def test_postgresqls_rpad_orders_sequencers_as_sequencer_order_does(db: Engine) -> None:
    # GIVEN the finding's pairs, and a thousand random pairs of hex sequencers of 1 to 24 digits
    # in either case
    draw = random.Random(4)
    pairs = [(NEWER_SHORTER, STORED), (OLDER_SHORTER, STORED), (OLDER_LONGER, STORED_SHORT), ("FF", "0100")]
    for _ in range(1000):
        digits = [
            "".join(draw.choice("0123456789ABCDEFabcdef") for _ in range(draw.randint(1, 24))) for _ in "ab"
        ]
        pairs.append((digits[0], digits[1]))

    # WHEN PostgreSQL orders each pair as the job machine's statements do
    pair = text("unnest(CAST(:a AS text[]), CAST(:b AS text[])) WITH ORDINALITY AS pair(a, b, n)")
    later_than = machine._sequencer_after(literal_column("a"), literal_column("b"))
    with db.connect() as connection:
        later = connection.scalars(
            select(later_than).select_from(pair).order_by(literal_column("n")),
            {"a": [a for a, _ in pairs], "b": [b for _, b in pairs]},
        ).all()

    # THEN it agrees with S3's rule everywhere
    assert later == [sequencer_order(a, b) > 0 for a, b in pairs]
