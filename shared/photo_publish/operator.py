"""The operator's commands: `retry` failed photos, `redrive` the dead-letter queue (SPEC 5),
`rerender` published photos at the current recipe (SPEC 14), and `delete` photos (SPEC 17).

    python -m photo_publish.operator retry PHOTO_ID [PHOTO_ID ...]
    python -m photo_publish.operator retry --all
    python -m photo_publish.operator redrive [--move-task]
    python -m photo_publish.operator rerender --all | --album ALBUM_ID | PHOTO_ID ... [--dry-run]
    python -m photo_publish.operator rerender --stop
    python -m photo_publish.operator delete PHOTO_ID [PHOTO_ID ...] | --album ALBUM_ID

All read the functions' environment (DATABASE_URL or DB_SECRET_ARN + DB_HOST, PROCESS_QUEUE_URL,
DEAD_LETTER_QUEUE_URL, VARIANT_VERSION and the recipe's settings, ...). `retry` and `redrive` give
each photo exactly one job message; `rerender` marks photos for the sweep to send, a few at a time.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from uuid import UUID

from botocore.exceptions import BotoCoreError, ClientError
from sqlalchemy import Engine, select

from photo_publish.adapters.models import Photo
from photo_publish.adapters.queue import SqsQueue, letter_photo
from photo_publish.adapters.storage import S3Store
from photo_publish.adapters.tables import deleted_photos
from photo_publish.adapters.unit_of_work import unit_of_work
from photo_publish.jobs import machine
from photo_publish.observability import logger
from photo_publish.settings import STALE_AFTER_SECONDS, Settings

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient


def reset_failed(
    engine: Engine, photo_ids: Sequence[UUID] | None, *, lease_seconds: int = STALE_AFTER_SECONDS
) -> list[UUID]:
    """The failed jobs of the given photos (or of every failed photo) back to pending, attempt 0,
    any dead letter still owed for them taken back (SPEC 5: no page for a photo that is not failed).
    One whose letter a sender holds right now is left, for a retry once it is sent (`lease_seconds`,
    STALE_AFTER_SECONDS, at most)."""
    with unit_of_work(engine) as connection:
        return machine.retry(connection, photo_ids, lease_seconds=lease_seconds)


def retry(
    engine: Engine,
    queue: SqsQueue,
    photo_ids: Sequence[UUID] | None,
    *,
    lease_seconds: int = STALE_AFTER_SECONDS,
) -> list[UUID]:
    """Reset the failed photos' jobs and send one job message each; the ids that were sent."""
    reset = reset_failed(engine, photo_ids, lease_seconds=lease_seconds)
    unsent = set(queue.send_jobs(reset))
    if unsent:
        # Left for the sweep: a pending row without a stamp is re-sent once it is due.
        with unit_of_work(engine) as connection:
            machine.unstamp(connection, list(unsent))
    return [photo_id for photo_id in reset if photo_id not in unsent]


@dataclass
class RedriveSummary:
    photos: list[UUID] = field(default_factory=list)
    messages_removed: int = 0
    left_in_queue: int = 0
    moved_by_task: bool = False


def _dead_letters(sqs: SQSClient, url: str) -> list[dict[str, Any]]:
    """Every message of the dead-letter queue, kept invisible while the redrive works."""
    messages: list[Any] = []
    while True:
        batch = sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=300,
            WaitTimeSeconds=0,
            MessageAttributeNames=["All"],
        ).get("Messages", [])
        if not batch:
            return messages
        messages.extend(batch)


def redrive(engine: Engine, sqs: SQSClient, settings: Settings, *, move_task: bool = False) -> RedriveSummary:
    """Retry the photos whose messages sit in the dead-letter queue, then remove those messages.

    With `move_task`, one message per photo is moved back by StartMessageMoveTask (duplicates of a
    photo are deleted first); where the endpoint lacks it, or by default, a fresh job message per
    photo is sent and the dead letters are deleted.
    """
    queue = SqsQueue(sqs, settings.process_queue_url, settings.dead_letter_queue_url)
    summary = RedriveSummary()
    by_photo: dict[UUID, list[dict[str, Any]]] = {}
    not_photos: list[dict[str, Any]] = []
    for message in _dead_letters(sqs, settings.dead_letter_queue_url):
        photo_id = letter_photo(message, bucket=settings.photo_bucket, stage=settings.stage)
        if photo_id is None:
            # Not a photo's message: left for a person to read (visible again at the end).
            not_photos.append(message)
            summary.left_in_queue += 1
            continue
        by_photo.setdefault(photo_id, []).append(message)

    photo_ids = list(by_photo)
    reset = set(reset_failed(engine, photo_ids, lease_seconds=settings.stale_after_seconds))
    with unit_of_work(engine) as connection:
        states = dict(
            connection.execute(select(Photo.id, Photo.processing_state).where(Photo.id.in_(photo_ids))).all()
        )
        # A deleted photo's letter (its failure paged, then the user deleted it; or a sender held
        # the letter while the deletion committed) speaks of nothing left: removed, never resent.
        deleted = set(
            connection.scalars(
                select(deleted_photos.c.photo_id).where(deleted_photos.c.photo_id.in_(photo_ids))
            )
        )
    # Failed jobs were reset (a published photo's is its re-render's, taken up again); uploaded
    # photos still need a message; other published ones need none.
    to_send = [p for p in photo_ids if p in reset or states.get(p) == "uploaded"]
    # A photo with no row (an upload the API never registered) stays for a person to look at.
    unknown = {p for p in photo_ids if p not in states and p not in deleted}
    summary.left_in_queue += sum(len(by_photo[p]) for p in unknown)

    if move_task and to_send and _move_back(sqs, settings, by_photo, to_send, unknown):
        summary.moved_by_task = True
        summary.photos = to_send
    else:
        unsent = set(queue.send_jobs(to_send))
        for photo_id, messages in by_photo.items():
            if photo_id in unsent or photo_id in unknown:
                continue  # visible again after its timeout, for the next redrive
            for message in messages:
                sqs.delete_message(
                    QueueUrl=settings.dead_letter_queue_url, ReceiptHandle=message["ReceiptHandle"]
                )
                summary.messages_removed += 1
        summary.photos = [p for p in to_send if p not in unsent]
    # Only now, when no move task can take them to the process queue (whose handler would drop them).
    for message in not_photos:
        sqs.change_message_visibility(
            QueueUrl=settings.dead_letter_queue_url,
            ReceiptHandle=message["ReceiptHandle"],
            VisibilityTimeout=0,
        )
    return summary


# How long a redrive waits for its move task before trusting it to finish on its own.
MOVE_TASK_WAIT_SECONDS = 60.0


def _queue_arn(sqs: SQSClient, url: str) -> str:
    return sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]


def _move_back(
    sqs: SQSClient,
    settings: Settings,
    by_photo: dict[UUID, list[dict[str, Any]]],
    to_send: list[UUID],
    unknown: set[UUID],
) -> bool:
    """Keep one dead letter per photo to send, delete the other dead letters of known photos, and
    move the kept ones to the process queue; True unless the task could not start or failed.
    Photos with no row keep theirs, in flight (unseen by the task), for a person."""
    dead_arn = _queue_arn(sqs, settings.dead_letter_queue_url)
    for photo_id, messages in by_photo.items():
        if photo_id in unknown:
            continue
        keep = messages[:1] if photo_id in to_send else []
        for message in messages[len(keep) :]:
            sqs.delete_message(
                QueueUrl=settings.dead_letter_queue_url, ReceiptHandle=message["ReceiptHandle"]
            )
        for message in keep:
            sqs.change_message_visibility(
                QueueUrl=settings.dead_letter_queue_url,
                ReceiptHandle=message["ReceiptHandle"],
                VisibilityTimeout=0,
            )
    try:
        # To the process queue by name: the function's own dead letters (SendMessage, SPEC 5) have no
        # DeadLetterQueueSourceArn, and a task "back to their original source" fails on them.
        sqs.start_message_move_task(
            SourceArn=dead_arn, DestinationArn=_queue_arn(sqs, settings.process_queue_url)
        )
        return _move_task_succeeded(sqs, dead_arn)
    except (ClientError, BotoCoreError, NotImplementedError):
        return False


def _move_task_succeeded(sqs: SQSClient, dead_arn: str) -> bool:
    """The task runs after StartMessageMoveTask has answered: wait for the queue's newest task (at
    most one is active per queue: ours) to complete; one still running past the wait is trusted."""
    deadline = time.monotonic() + MOVE_TASK_WAIT_SECONDS
    while True:
        status = sqs.list_message_move_tasks(SourceArn=dead_arn, MaxResults=1)["Results"][0]["Status"]
        if status in ("FAILED", "CANCELLED"):
            return False
        if status == "COMPLETED" or time.monotonic() >= deadline:
            return True
        time.sleep(0.5)


def main(argv: Sequence[str] | None = None) -> None:
    from photo_publish import bootstrap

    parser = argparse.ArgumentParser(
        prog="python -m photo_publish.operator", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    retry_cmd = commands.add_parser("retry", help="retry processing_failed photos")
    retry_cmd.add_argument("photo_ids", nargs="*", type=UUID)
    retry_cmd.add_argument("--all", action="store_true", help="every processing_failed photo")
    redrive_cmd = commands.add_parser("redrive", help="retry the photos in the dead-letter queue")
    redrive_cmd.add_argument(
        "--move-task", action="store_true", help="move messages back with StartMessageMoveTask"
    )
    rerender_cmd = commands.add_parser("rerender", help="re-render published photos at VARIANT_VERSION")
    rerender_cmd.add_argument("photo_ids", nargs="*", type=UUID)
    rerender_cmd.add_argument("--all", action="store_true", help="every published photo below the version")
    rerender_cmd.add_argument("--album", type=UUID, help="one album's published photos")
    rerender_cmd.add_argument("--dry-run", action="store_true", help="count, estimated render time and cost")
    rerender_cmd.add_argument("--stop", action="store_true", help="clear the marks not sent yet")
    delete_cmd = commands.add_parser(
        "delete", help="delete photos: objects, rows, a photo.deleted event each"
    )
    delete_cmd.add_argument("photo_ids", nargs="*", type=UUID)
    delete_cmd.add_argument("--album", type=UUID, help="every photo of one album (an erasure request)")
    args = parser.parse_args(argv)

    if args.command == "delete":
        if not (args.photo_ids or args.album):
            parser.error("name photo ids, or --album")
        print(json.dumps({"deleted": [str(p) for p in delete_photos(args.photo_ids, args.album)]}))
        return

    if args.command == "rerender":
        print(json.dumps(_rerender(parser, args, bootstrap.engine(), bootstrap.settings())))
        return

    if args.command == "retry":
        if not args.photo_ids and not args.all:
            parser.error("name photo ids, or --all")
        sent = retry(
            bootstrap.engine(),
            bootstrap.queue(),
            None if args.all else args.photo_ids,
            lease_seconds=bootstrap.settings().stale_after_seconds,
        )
        print(json.dumps({"retried": [str(p) for p in sent]}))
    else:
        summary = redrive(
            bootstrap.engine(), bootstrap.sqs_client(), bootstrap.settings(), move_task=args.move_task
        )
        print(
            json.dumps(
                {
                    "retried": [str(p) for p in summary.photos],
                    "messagesRemoved": summary.messages_removed,
                    "leftInQueue": summary.left_in_queue,
                    "movedByTask": summary.moved_by_task,
                }
            )
        )


def delete_photos(photo_ids: Sequence[UUID], album_id: UUID | None) -> list[UUID]:
    """Delete the named photos, or an album's; the ids deleted (unknown ones are not)."""
    from photo_publish import bootstrap, uploads
    from photo_publish.jobs import invalidations

    engine, settings = bootstrap.engine(), bootstrap.settings()
    chosen = list(photo_ids)
    with unit_of_work(engine) as connection:
        if album_id is not None:
            chosen += connection.scalars(select(Photo.id).where(Photo.album_id == album_id)).all()
        found = connection.execute(select(Photo.id, Photo.album_id).where(Photo.id.in_(chosen)))
        albums = {row.id: row.album_id for row in found}
    store = S3Store(bootstrap.s3_client(), settings.photo_bucket)
    deleted = [
        photo_id
        for photo_id in dict.fromkeys(chosen)
        if uploads.delete(engine, store, settings, photo_id, caller=uploads.BACKEND)
    ]
    cdn = bootstrap.cdn()
    if cdn is not None and deleted:
        # One call for them all once their objects are gone, not one a photo: an album erasure is
        # the album's one path (what this call could not send, the sweep sends).
        paths = [invalidations.photo_path(settings.stage, albums[p], p) for p in deleted if p in albums]
        sent = invalidations.send_invalidations(engine, cdn, paths=paths)
        logger.info(
            "cdn paths sent", invalidated=sent.invalidated, left_to_sweep=len(paths) - sent.invalidated
        )
    return deleted


def _rerender(
    parser: argparse.ArgumentParser, args: argparse.Namespace, engine: Engine, settings: Settings
) -> dict[str, Any]:
    from photo_publish.image.recipes import Recipe
    from photo_publish.jobs import backfill
    from photo_publish.publish import repository

    if args.stop:
        return {"stopped": backfill.stop(engine)}
    if not (args.all or args.album or args.photo_ids):
        parser.error("name photo ids, --album, or --all")
    selection = backfill.Selection(photo_ids=args.photo_ids or None, album_id=args.album)
    version = settings.variant_version
    if args.dry_run:
        return {"version": version} | backfill.estimate(engine, version, selection).as_dict()
    # The version is the functions' recipe, or the backfill is refused before anything is marked.
    with unit_of_work(engine) as connection:
        repository.ensure_recipe(connection, version, Recipe.from_settings(settings))
    marked = backfill.mark(engine, version, selection, lease_seconds=settings.stale_after_seconds).marked
    return {"version": version, "marked": marked}


if __name__ == "__main__":
    main()
