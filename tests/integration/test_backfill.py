"""Recipes and the backfill (SPEC 14), through the real handlers, sweep and operator, on PostgreSQL and
moto's S3 + SQS: the dry run counts what the backfill marks; a re-render that fails for good pages
as a re-render, not as a failed photo (SPEC 16 (4)), its letter redriven takes it up again, and a
backfill resumed over its owed letter never breaks the sweep; a duplicate delivery racing the
backfill's start never drops the re-render."""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import Engine, delete, func, insert, select, update

from devkit import samples, stack, uploads
from devkit.poller import LambdaContext, sqs_event
from photo_publish import bootstrap, operator
from photo_publish.adapters.models import OutboxEvent, Photo, PhotoJob, PhotoVariant, RetiredVariant
from photo_publish.image.recipes import RecipeMismatch
from photo_publish.jobs import backfill, machine
from tests.conftest import BUCKET, STAGE, Infra
from tests.faults import aws_fails
from tests.letters import attributes, dead_letters, lease_passes, letter_codes, owed
from tests.originals import upload
from tests.polling import carried, drain, poll_until, process, queue_empty, queued, sweep
from tests.rows import job, photo, published

PHOTOS = ("Aqua.jpg", "Garden.jpg", "Storm.jpg", "Wood.jpg", "LadyBird.jpg")
MINUTE = timedelta(minutes=1)

# Each test starts from the recipe before the ladder, as version 1, and moves to a version 2.
pytestmark = pytest.mark.usefixtures("recipe_before_the_ladder")


def publish_all(infra: Infra, db: Engine, names: tuple[str, ...] = PHOTOS) -> list[UUID]:
    shots = [
        uploads.upload(db, infra.s3, BUCKET, STAGE, file_name=n, data=(samples.IMAGES / n).read_bytes())
        for n in names
    ]
    poll_until(infra, lambda: versions(db, [s.photo_id for s in shots]) == [(2, 1)] * len(shots))
    return [s.photo_id for s in shots]


def versions(db: Engine, photo_ids: list[UUID]) -> list[tuple[int, int | None]]:
    """(entity_version, variant_version) per photo, in the order given."""
    with db.connect() as c:
        rows = dict(
            (r.id, (r.entity_version, r.variant_version))
            for r in c.execute(
                select(Photo.id, Photo.entity_version, Photo.variant_version).where(Photo.id.in_(photo_ids))
            )
        )
    return [rows[p] for p in photo_ids]


def events(db: Engine) -> Counter[tuple[UUID, str]]:
    with db.connect() as c:
        return Counter(
            (r.aggregate_id, r.event_type)
            for r in c.execute(select(OutboxEvent.aggregate_id, OutboxEvent.event_type))
        )


def rerender(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    """The operator's command, as a person runs it with the functions' environment."""
    operator.main(["rerender", *argv])
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def objects(infra: Infra, photo_id: UUID) -> set[str]:
    listed = infra.s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{STAGE}/albums/")
    return {o["Key"] for o in listed.get("Contents", []) if f"/{photo_id}/" in o["Key"]}


def test_a_recipe_changed_under_the_same_version_is_refused_at_start(infra: Infra, db: Engine) -> None:
    # GIVEN a photo published at version 1 (which recorded version 1's recipe)
    (published,) = publish_all(infra, db, ("Aqua.jpg",))
    second = uploads.upload(
        db, infra.s3, BUCKET, STAGE, file_name="Wood.jpg", data=(samples.IMAGES / "Wood.jpg").read_bytes()
    )
    (message,) = infra.sqs.receive_message(
        QueueUrl=infra.queues.url, WaitTimeSeconds=2, AttributeNames=["All"]
    )["Messages"]

    # WHEN a deployment changes THUMB_SIZE alone, keeping VARIANT_VERSION 1
    infra.configure(thumb_size=320)

    # THEN its first invocation fails loudly, before anything is rendered or written
    with pytest.raises(
        RecipeMismatch, match=r"VARIANT_VERSION 1 was recorded with another recipe.*thumb_size"
    ):
        process.lambda_handler(sqs_event([message], infra.queues.arn), LambdaContext())
    with db.connect() as c:
        assert c.scalar(select(Photo.processing_state).where(Photo.id == second.photo_id)) == "uploaded"
    assert objects(infra, second.photo_id) == set()

    # AND the same settings under a new version are accepted
    infra.configure(thumb_size=320, variant_version=2)
    response = process.lambda_handler(sqs_event([message], infra.queues.arn), LambdaContext())
    assert response == {"batchItemFailures": []}
    assert versions(db, [published, second.photo_id]) == [(2, 1), (2, 2)]


def test_a_backfill_moves_every_photo_once_a_few_at_a_time_and_running_it_again_renders_nothing(
    infra: Infra, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN five photos published at version 1, then a new recipe (a smaller thumb) as version 2
    photo_ids = publish_all(infra, db)
    old = {p: objects(infra, p) for p in photo_ids}
    infra.configure(thumb_size=320, variant_version=2, backfill_batch_size=2, backfill_spread_seconds=0)

    # WHEN the operator asks what a backfill would take, then starts it
    dry = rerender(capsys, "--all", "--dry-run")
    started = rerender(capsys, "--all")

    # THEN the dry run counted them and estimated the render time and cost; all five were marked
    assert (dry["photos"], dry["version"]) == (5, 2) and dry["renderSeconds"] > 0 and "costUsd" in dry
    assert started == {"version": 2, "marked": 5}

    # WHEN the sweep runs on its schedule and the queue's messages reach the process function
    sent = []
    while True:
        summary = sweep()
        sent.append(summary["backfillSent"])
        if not summary["backfillSent"]:
            break
        poll_until(infra, lambda: versions(db, photo_ids).count((3, 2)) == sum(sent))

    # THEN two at a time (the batch), each photo re-rendered once: version 2 rows and keys, one
    # photo.variants_updated each, the thumb at the new size
    assert sent == [2, 2, 1, 0]
    assert versions(db, photo_ids) == [(3, 2)] * 5
    assert events(db) == Counter(
        {(p, "photo.published"): 1 for p in photo_ids} | {(p, "photo.variants_updated"): 1 for p in photo_ids}
    )
    with db.connect() as c:
        rows = c.execute(
            select(PhotoVariant.storage_key, PhotoVariant.variant_version, PhotoVariant.width)
        ).all()
    assert {r.variant_version for r in rows} == {2}
    assert all("/2/" in r.storage_key for r in rows)
    assert max(r.width for r in rows if r.storage_key.endswith("thumb.webp")) == 320
    # AND the old version's objects are kept (clients and caches may hold their keys) until their grace
    for photo_id in photo_ids:
        assert old[photo_id] < objects(infra, photo_id)

    # WHEN the backfill is started again
    again = rerender(capsys, "--all")

    # THEN nothing is marked and nothing rendered
    assert again == {"version": 2, "marked": 0}
    assert sweep()["backfillSent"] == 0

    # WHEN the grace period has passed since the commit, but not since consumers were told (the
    # relay was down: the photo.variants_updated events are still in the outbox)
    with db.begin() as c:
        c.execute(update(RetiredVariant).values(delete_after=func.now() - func.make_interval(0, 0, 0, 1)))
        c.execute(update(OutboxEvent).values(published_at=None))

    # THEN nothing is deleted: the old keys are the only ones consumers know (issue 21, item b)
    assert sweep()["retiredDeleted"] == 0

    # WHEN the events left the outbox a grace period ago
    with db.begin() as c:
        c.execute(
            update(OutboxEvent).values(
                published_at=func.now()
                - func.make_interval(0, 0, 0, 0, 0, 0, infra.settings.variant_grace_seconds + 1)
            )
        )
    deleted = sweep()["retiredDeleted"]

    # THEN the sweep deletes the old objects, and only them
    assert deleted == 10
    for photo_id in photo_ids:
        assert objects(infra, photo_id) == {k for k in objects(infra, photo_id) if "/2/" in k} != set()
        assert not old[photo_id] & objects(infra, photo_id)
    with db.connect() as c:
        assert c.scalar(select(func.count()).select_from(RetiredVariant)) == 0


def test_the_backfill_dry_run_counts_what_it_marks_and_every_counted_photo_is_rerendered(
    infra: Infra, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    """Finding (c): estimate counts ready photos without a job row, which mark never marks."""
    # GIVEN two photos published at version 1, one of them without a job row (published before the
    # pipeline kept jobs: an import)
    shots = [upload(infra, db, "Aqua.jpg"), upload(infra, db, "Wood.jpg")]
    photo_ids = [s.photo_id for s in shots]
    poll_until(infra, lambda: versions(db, photo_ids) == [(2, 1)] * 2)
    with db.begin() as c:
        c.execute(delete(PhotoJob).where(PhotoJob.photo_id == photo_ids[1]))
    infra.configure(thumb_size=320, variant_version=2, backfill_spread_seconds=0)

    # WHEN the operator dry-runs the backfill, then starts it
    dry = rerender(capsys, "--all", "--dry-run")
    started = rerender(capsys, "--all")

    # THEN the dry run counted what the backfill marked
    assert dry["photos"] == started["marked"], f"dry run {dry}, started {started}"

    # WHEN the sweep sends the backfill and the queue's messages reach the process function
    for _ in range(3):
        sweep()
        drain(infra, lambda: versions(db, photo_ids).count((3, 2)) == dry["photos"])

    # THEN every photo the dry run counted was re-rendered
    assert versions(db, photo_ids).count((3, 2)) == dry["photos"]


def test_the_backfill_waits_while_the_queue_is_long(
    infra: Infra, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a marked backfill and a queue already as long as BACKFILL_MAX_QUEUE_DEPTH
    photo_ids = publish_all(infra, db, ("Aqua.jpg",))
    infra.configure(variant_version=2, thumb_size=320, backfill_max_queue_depth=3, backfill_spread_seconds=0)
    assert rerender(capsys, "--all")["marked"] == 1
    for _ in range(3):
        infra.sqs.send_message(
            QueueUrl=infra.queues.url, MessageBody=json.dumps({"photoId": str(photo_ids[0])})
        )

    # WHEN the sweep runs
    summary = sweep()

    # THEN it sends nothing of the backfill: new uploads never wait behind it
    assert (summary["backfillSent"], summary["backfillLeft"]) == (0, 1)


def test_a_stopped_backfill_loses_nothing_and_resumes(
    infra: Infra, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a backfill of five photos, two of them sent
    photo_ids = publish_all(infra, db)
    infra.configure(thumb_size=320, variant_version=2, backfill_batch_size=2, backfill_spread_seconds=0)
    rerender(capsys, "--all")
    assert sweep()["backfillSent"] == 2

    # WHEN the operator stops it, and the photos in flight are processed
    stopped = rerender(capsys, "--stop")
    poll_until(infra, lambda: versions(db, photo_ids).count((3, 2)) == 2)

    # THEN the three not sent were unmarked; the sweep sends nothing more
    assert stopped == {"stopped": 3}
    assert sweep()["backfillSent"] == 0

    # WHEN it is started again, and runs to the end
    assert rerender(capsys, "--all") == {"version": 2, "marked": 3}
    while sweep()["backfillSent"]:
        poll_until(infra, lambda: versions(db, photo_ids).count((3, 2)) == 5 or queue_empty(infra))

    # THEN every photo was re-rendered exactly once
    assert versions(db, photo_ids) == [(3, 2)] * 5
    assert sum(1 for (_, kind) in events(db).elements() if kind == "photo.variants_updated") == 5


def lost_work(db: Engine, **values: Any) -> UUID:
    """A photo and its job, the job's columns set as given (as test_sweep.py makes its rows)."""
    photo_id = uuid.uuid4()
    with db.begin() as c:
        c.execute(
            insert(Photo).values(
                id=photo_id,
                album_id=uuid.uuid4(),
                original_key=f"{STAGE}/originals/albums/x/{photo_id}/p.jpg",
            )
        )
        c.execute(insert(PhotoJob).values(photo_id=photo_id, **values))
    return photo_id


def stamp(db: Engine, photo_id: UUID) -> Any:
    with db.connect() as c:
        return c.scalar(select(PhotoJob.enqueued_at).where(PhotoJob.photo_id == photo_id))


def test_a_resumed_backfill_never_breaks_the_sweep_on_a_failed_rerenders_owed_letter(
    infra: Infra, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    """Finding 2: re-marking keeps the owed letter and nulls its code; the sweep then raises on ErrorCode(None)."""
    # GIVEN a photo published at version 1, and a backfill to version 2 sent by the sweep
    infra.configure(retry_base_seconds=1)
    rerendered = upload(infra, db, "Aqua.jpg")
    poll_until(infra, published(db, rerendered.photo_id))
    infra.configure(retry_base_seconds=1, thumb_size=320, variant_version=2, backfill_spread_seconds=0)
    assert rerender(capsys, "--all") == {"version": 2, "marked": 1}
    assert sweep()["backfillSent"] == 1

    # ... whose re-render fails for good (S3 unreadable through its attempts), as does an unrelated
    # photo's first render, while the dead-letter queue refuses both letters
    with aws_fails(bootstrap.s3_client(), "GetObject"), aws_fails(bootstrap.sqs_client(), "SendMessage"):
        unrelated = upload(infra, db, "Wood.jpg")
        poll_until(
            infra,
            lambda: (
                job(db, rerendered.photo_id)[0] == "failed" and job(db, unrelated.photo_id)[0] == "failed"
            ),
        )
    assert job(db, rerendered.photo_id) == ("failed", 3, "STORAGE_READ_FAILED")
    assert photo(db, rerendered.photo_id)[0] == "ready" and versions(db, [rerendered.photo_id]) == [(2, 1)]
    assert job(db, unrelated.photo_id) == ("failed", 3, "STORAGE_READ_FAILED")
    assert owed(db, rerendered.photo_id) is not None and owed(db, unrelated.photo_id) is not None
    assert letter_codes(infra) == []

    # WHEN the operator resumes the backfill (`rerender --all` marks the photo again), the sweep sends
    # it and it is re-rendered
    assert rerender(capsys, "--all") == {"version": 2, "marked": 1}
    assert sweep()["backfillSent"] == 1
    poll_until(infra, lambda: versions(db, [rerendered.photo_id]) == [(3, 2)])

    # ... while lost work waits for the sweep: a pending row past its due time, a stale active one
    due = lost_work(db, created_at=func.now() - 20 * MINUTE)
    stale = lost_work(db, status="active", attempt=1, claimed_at=func.now() - 10 * MINUTE)

    # ... and the sweep runs once the owed letters' lease has passed
    lease_passes(db)
    summary = sweep()

    # THEN the run finished: the unrelated photo's letter was sent with its own code (by this run or,
    # refused letters being in nobody's hands, an earlier one), and none for the photo whose job is
    # no longer failed
    assert letter_codes(infra) == [(unrelated.photo_id, "STORAGE_READ_FAILED")]
    assert summary["errors"] == 0
    assert owed(db, rerendered.photo_id) is None
    # AND the rows it stamped were sent (or unstamped, for a later run)
    sent = {p for body in queued(infra) for p, *_ in carried(body)}
    for photo_id in (due, stale):
        assert photo_id in sent or stamp(db, photo_id) is None


def test_a_photo_published_meanwhile_at_the_new_version_is_skipped(
    infra: Infra, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a photo marked for the backfill whose variants are already at the new version (its
    # original was uploaded again and rendered by the new deployment before the sweep got to it)
    (photo_id,) = publish_all(infra, db, ("Storm.jpg",))
    infra.configure(thumb_size=320, variant_version=2, backfill_spread_seconds=0)
    rerender(capsys, "--all")
    with db.begin() as c:
        c.execute(update(Photo).where(Photo.id == photo_id).values(variant_version=2))

    # WHEN the sweep sends it and it is delivered
    assert sweep()["backfillSent"] == 1
    poll_until(infra, lambda: queue_empty(infra))

    # THEN it answered `already`: nothing rendered, no event, no version bump, the mark cleared
    assert versions(db, [photo_id]) == [(2, 2)]
    assert events(db) == Counter({(photo_id, "photo.published"): 1})
    with db.connect() as c:
        job = c.execute(
            select(PhotoJob.status, PhotoJob.rerender_to).where(PhotoJob.photo_id == photo_id)
        ).one()
    assert tuple(job) == ("done", None)


def test_a_runs_backfill_messages_trickle_in_over_the_sweeps_period(
    infra: Infra, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN two marked photos, and their run's messages spread over 4 seconds
    photo_ids = publish_all(infra, db, ("Aqua.jpg", "Wood.jpg"))
    infra.configure(thumb_size=320, variant_version=2, backfill_spread_seconds=4)
    rerender(capsys, "--all")

    # WHEN the sweep sends them
    assert sweep()["backfillSent"] == 2

    # THEN the first is there at once and the second only later: new uploads never queue behind a
    # whole batch
    def visible() -> int:
        attributes = infra.sqs.get_queue_attributes(
            QueueUrl=infra.queues.url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"])

    assert visible() == 1
    poll_until(infra, lambda: versions(db, photo_ids).count((3, 2)) == 2, timeout=15)


def test_marking_stops_before_a_batch_it_has_no_time_for_and_the_next_run_resumes_after_it(
    infra: Infra, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN five photos published at version 1, a version 2, and marking two photos a batch
    photo_ids = publish_all(infra, db)
    infra.configure(thumb_size=320, variant_version=2)
    monkeypatch.setattr(backfill, "MARK_BATCH", 2)

    def time_for(batches: int) -> Callable[[], float]:
        """A budget that has time for `batches` batches, then none."""
        checks = iter(range(batches + 1))
        return lambda: 60.0 if next(checks, batches) < batches else 0.0

    def marked() -> set[UUID]:
        with db.connect() as c:
            return set(c.scalars(select(PhotoJob.photo_id).where(PhotoJob.rerender_to == 2)))

    # WHEN marking runs with time for one batch
    first = backfill.mark(db, 2, backfill.Selection(), remaining=time_for(1))

    # THEN it marked (and committed) one batch and said it ran out of time
    assert first == backfill.Marked(2, out_of_time=True)
    assert len(marked()) == 2

    # WHEN it runs again with time for one batch, then with all the time it needs
    second = backfill.mark(db, 2, backfill.Selection(), remaining=time_for(1))
    third = backfill.mark(db, 2, backfill.Selection())

    # THEN each resumed after the photos already marked: every photo marked, none counted twice
    assert second == backfill.Marked(2, out_of_time=True)
    assert third == backfill.Marked(1)
    assert marked() == set(photo_ids)


def test_a_rerender_that_reads_an_original_written_again_publishes_it_as_a_new_picture(
    infra: Infra, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a photo published at version 1 from its first file
    (photo_id,) = publish_all(infra, db, ("GreenMeadow.jpg",))
    with db.connect() as c:
        key = c.scalar(select(Photo.original_key).where(Photo.id == photo_id))
    # AND its upload form posted again with another file, whose event has not been delivered yet
    uploads.put_original(infra.s3, BUCKET, key, (samples.IMAGES / "Storm.jpg").read_bytes())
    stack.drop_test_events(infra.sqs, infra.queues.url)

    # WHEN a new recipe's backfill re-renders the photo
    infra.configure(thumb_size=320, variant_version=2, backfill_spread_seconds=0)
    assert rerender(capsys, "--all") == {"version": 2, "marked": 1}
    assert sweep()["backfillSent"] == 1
    poll_until(infra, lambda: versions(db, [photo_id]) == [(3, 2)])

    # THEN what it read is a new picture, told as one (photo.published, not a routine
    # photo.variants_updated): the second file, under keys of its own
    assert events(db) == Counter({(photo_id, "photo.published"): 2})
    with db.connect() as c:
        photo = c.execute(select(Photo.width, Photo.height).where(Photo.id == photo_id)).one()
        browse = c.scalar(
            select(PhotoVariant.storage_key).where(
                PhotoVariant.photo_id == photo_id, PhotoVariant.kind == "browse"
            )
        )
    assert tuple(photo) == (1920, 1280)
    assert f"/{photo_id}/2-v3/browse.webp" in browse


# --- a re-render that fails for good -------------------------------------------------------------


def letters_in_full(infra: Infra) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """photoId -> (message attributes, body) of each dead letter, left in the queue."""
    found: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for letter in dead_letters(infra):
        named = attributes(letter)
        found[named["photoId"]] = (named, json.loads(letter["Body"]))
    return found


def test_a_rerender_that_fails_for_good_pages_as_a_rerender_not_as_a_failed_photo(
    infra: Infra, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    """SPEC 16 (4): a re-render that fails for good pages as what it is (the photo stays published
    on its old version), never as a failed photo."""
    # GIVEN a photo published at version 1, marked for a backfill to version 2 and sent
    infra.configure(retry_base_seconds=1)
    rerendered = upload(infra, db, "Aqua.jpg")
    poll_until(infra, published(db, rerendered.photo_id))
    infra.configure(retry_base_seconds=1, thumb_size=320, variant_version=2, backfill_spread_seconds=0)
    assert rerender(capsys, "--all") == {"version": 2, "marked": 1}
    assert sweep()["backfillSent"] == 1

    # WHEN S3 cannot be read through the attempts: the re-render fails for good, and so does a new
    # upload's first render
    with aws_fails(bootstrap.s3_client(), "GetObject"):
        failed = upload(infra, db, "Wood.jpg")
        poll_until(
            infra,
            lambda: job(db, rerendered.photo_id)[0] == "failed" and job(db, failed.photo_id)[0] == "failed",
        )
    assert (
        photo(db, rerendered.photo_id)[0] == "ready" and photo(db, failed.photo_id)[0] == "processing_failed"
    )

    # THEN the page for the re-render tells it from the page for the failed photo
    letters = letters_in_full(infra)
    assert set(letters) == {str(rerendered.photo_id), str(failed.photo_id)}

    def what(letter: tuple[dict[str, Any], dict[str, Any]]) -> Any:
        attributes, body = letter
        same = {"photoId", "attempt", "detail"}
        return (
            {k: v for k, v in attributes.items() if k not in same},
            {k: v for k, v in body.items() if k not in same},
        )

    assert what(letters[str(rerendered.photo_id)]) != what(letters[str(failed.photo_id)]), (
        f"the published photo's failed re-render pages exactly as a failed photo: {letters}"
    )


def test_a_redrive_of_a_failed_rerenders_letter_takes_the_rerender_up_again(
    infra: Infra, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    """Finding 6: redrive deletes a ready photo's re-render letter and retries nothing."""
    # GIVEN a photo published at version 1 whose backfill re-render to version 2 failed for good (S3
    # unreadable through its attempts): its dead letter is in the queue, the photo still published
    infra.configure(retry_base_seconds=1)
    shot = upload(infra, db, "Storm.jpg")
    poll_until(infra, published(db, shot.photo_id))
    infra.configure(retry_base_seconds=1, thumb_size=320, variant_version=2, backfill_spread_seconds=0)
    assert rerender(capsys, "--all") == {"version": 2, "marked": 1}
    assert sweep()["backfillSent"] == 1
    with aws_fails(bootstrap.s3_client(), "GetObject"):
        poll_until(infra, lambda: job(db, shot.photo_id)[0] == "failed")
    assert letter_codes(infra) == [(shot.photo_id, "STORAGE_READ_FAILED")]
    assert versions(db, [shot.photo_id]) == [(2, 1)] and photo(db, shot.photo_id)[0] == "ready"

    # WHEN S3 is back and the operator redrives the dead-letter queue; the sweep runs on its
    # schedule and the queue's messages reach the process function
    redriven = operator.redrive(bootstrap.engine(), infra.sqs, infra.settings)
    left = []
    for _ in range(3):
        left.append(sweep()["backfillLeft"])
        drain(infra, lambda: versions(db, [shot.photo_id]) == [(3, 2)])

    # THEN the re-render was taken up again (the photo is on version 2), or its letter was kept
    rerendered = versions(db, [shot.photo_id]) == [(3, 2)]
    kept = letter_codes(infra) == [(shot.photo_id, "STORAGE_READ_FAILED")]
    assert rerendered or kept, (
        f"the redrive ({redriven}) dropped the letter and retried nothing: the photo stays at"
        f" {versions(db, [shot.photo_id])}, job {job(db, shot.photo_id)}, backfillLeft {left}"
    )


# --- duplicates and the backfill's start ----------------------------------------------------------


def test_a_duplicate_delivery_racing_the_backfills_start_never_drops_the_rerender(
    infra: Infra, db: Engine, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC 14: a backfill re-renders every ready photo below the version; SPEC 16: a transition's
    condition is its precondition (settle_published: "the photo is published and not marked")."""
    # GIVEN a photo published at version 1, and the functions at version 2
    infra.configure(retry_base_seconds=1)
    shot = upload(infra, db, "Aqua.jpg")
    poll_until(infra, published(db, shot.photo_id))
    infra.configure(retry_base_seconds=1, thumb_size=320, variant_version=2, backfill_spread_seconds=0)

    # WHEN a duplicate message for the photo (a job message, as a sweep or an API sends) is being
    # answered "already published" while the operator starts the backfill and the sweep sends it
    real_settle = machine.settle_published
    raced: list[Any] = []

    def backfill_meanwhile(connection: Any, photo_id: Any) -> None:
        if not raced:
            # Another process's work (its calls to SQS are no waits inside this transaction).
            operator = threading.Thread(
                target=lambda: raced.extend([rerender(capsys, "--all"), sweep()["backfillSent"]])
            )
            operator.start()
            operator.join()
        real_settle(connection, photo_id)

    monkeypatch.setattr(machine, "settle_published", backfill_meanwhile)
    bootstrap.queue().send_job(shot.photo_id)
    drain(infra, lambda: versions(db, [shot.photo_id]) == [(3, 2)], timeout=20)
    assert raced == [{"version": 2, "marked": 1}, 1]
    left = sweep()["backfillLeft"]

    # THEN the photo was re-rendered at version 2 (or is still marked for it)
    assert versions(db, [shot.photo_id]) == [(3, 2)] or left == 1, (
        f"the backfill's re-render was dropped: versions {versions(db, [shot.photo_id])},"
        f" job {job(db, shot.photo_id)}, backfillLeft {left}"
    )
