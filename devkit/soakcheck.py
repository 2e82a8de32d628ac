"""The soak's verdict: the promise checked photo by photo, the figures, and each violation's history.

Invariants (issue 12, from SPEC 4.1, 5 and 6), for every photo of the run:
- it ended `ready` with exactly one `photo.published` event, entity_version 2 and both variants'
  objects in S3, or `processing_failed` with a code, no event and entity_version 1;
- its job is not `active` or `pending`, and `done` exactly when the photo is ready;
- a final failure (a code that is not the user's bad input) has a dead-letter message;
- a good photo never ends with a permanent code (a fault read as bad input), a hostile file never
  ends published, and ends with its own code unless chaos explains another (an out-of-memory or
  timeout kill while rendering it does not: that is a render the limits did not bound);
- variant objects of a photo that is not ready are counted and explained (an attempt stored them,
  then died or failed before its commit: the design writes before it commits);
- the dead-letter queue holds nothing that pages for no final failure: no malformed message, no
  letter for a photo that ended published unless a genuine re-upload or the operator's retry or
  redrive took the failure back, or it paged for a re-render that failed for good (the photo stays
  published); letters the operator's redrives removed are judged with those left at the end;
- with a backfill in the run, every published photo ends on its recipe, one version bump for each
  re-render;
- a photo deleted in whatever state (its render running, a retry due, a letter owed) leaves no row,
  no object and no event after its `photo.deleted`.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, select

from photo_publish.adapters.models import OutboxEvent, Photo, PhotoJob, PhotoVariant
from photo_publish.adapters.tables import deleted_photos
from photo_publish.errors import ErrorCode
from photo_publish.jobs.sweep import LETTER_VISIBILITY_SECONDS
from photo_publish.keys import is_ladder_kind
from photo_publish.retry import PERMANENT

UUID_TEXT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
VARIANT_PHOTO = re.compile(r"/variants/([0-9a-f-]{36})/")
ORIGINAL_PHOTO = re.compile(r"/originals/albums/[0-9a-f-]{36}/([0-9a-f-]{36})/")
SETTLED = ("ready", "processing_failed")
HISTORY_LINES = 120


@dataclass(frozen=True)
class Violation:
    rule: str
    detail: str
    photo_id: str | None = None
    # Which open issue this looks like, where the history says so.
    hint: str = ""


@dataclass
class Report:
    seed: int = 0
    violations: list[Violation] = field(default_factory=list)
    explained: Counter[str] = field(default_factory=Counter)
    figures: dict[str, Any] = field(default_factory=dict)
    histories: dict[str, str] = field(default_factory=dict)
    times: dict[str, float] = field(default_factory=dict)


@dataclass
class Inputs:
    config: dict[str, Any]
    photos: list[Any]  # soak.Planned
    engine: Engine
    s3: Any
    sqs: Any
    bucket: str
    stage: str
    queues: Any
    run_dir: Path
    lives: list[Any]  # soak.Life
    proxy_stats: dict[str, Any]
    tally: Any  # soak.Tally
    database: dict[str, Any]
    settled: bool
    max_attempts: int
    malformed: dict[str, str]
    # Messages the operator's redrives removed from the dead-letter queue (each as received, with
    # `removedAt`): they paged all the same, and are judged with those left at the end.
    removed_letters: list[dict[str, Any]] = field(default_factory=list)
    # The recipe a backfill moved every published photo to (None: no backfill in this run).
    recipe_version: int | None = None
    # The process queue's redrive policy: maxReceiveCount.
    redrive_receives: int = 5


def progress(engine: Engine, recipe_version: int | None = None) -> dict[str, int]:
    with engine.connect() as connection:
        below = 0
        if recipe_version is not None:
            below = connection.scalar(
                select(func.count()).where(
                    Photo.processing_state == "ready",
                    func.coalesce(Photo.variant_version, 0) < recipe_version,
                )
            )
        states = dict(
            connection.execute(
                select(Photo.processing_state, func.count()).group_by(Photo.processing_state)
            ).all()
        )
        jobs = dict(connection.execute(select(PhotoJob.status, func.count()).group_by(PhotoJob.status)).all())
        deleted, unpurged = connection.execute(
            select(func.count(), func.count().filter(deleted_photos.c.purged_at.is_(None)))
        ).one()
    return {
        "ready": states.get("ready", 0),
        "failed": states.get("processing_failed", 0),
        "unsettled": sum(n for s, n in states.items() if s not in SETTLED),
        "open_jobs": jobs.get("active", 0) + jobs.get("pending", 0),
        "deleted": deleted,
        # Deleted photos whose objects the sweep has yet to purge once more.
        "unpurged": unpurged,
        # Published photos a running backfill has yet to move to its recipe.
        "below_recipe": below or 0,
    }


def chaos_lines(log: Path) -> list[dict[str, Any]]:
    lines = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith('{"chaos"'):
            lines.append(json.loads(line))
    return lines


def killed_at(log: Path, stage: str) -> bool:
    return any(entry["chaos"] == "kill" and entry["stage"] == stage for entry in chaos_lines(log))


@dataclass
class Snapshot:
    photos: dict[str, Any]
    jobs: dict[str, Any]
    events: dict[str, list[Any]]
    variant_rows: dict[str, list[Any]]
    objects: dict[str, list[str]]
    originals: dict[str, list[str]]
    letters: dict[str, list[dict[str, Any]]]
    redriven: list[dict[str, Any]]


def snapshot(inputs: Inputs) -> Snapshot:
    with inputs.engine.connect() as connection:
        photos = {str(r.id): r for r in connection.execute(select(Photo)).all()}
        jobs = {str(r.photo_id): r for r in connection.execute(select(PhotoJob)).all()}
        events: dict[str, list[Any]] = defaultdict(list)
        for row in connection.execute(
            select(
                OutboxEvent.aggregate_id, OutboxEvent.event_type, OutboxEvent.payload, OutboxEvent.created_at
            )
        ):
            events[str(row.aggregate_id)].append(row)
        variant_rows: dict[str, list[Any]] = defaultdict(list)
        for row in connection.execute(select(PhotoVariant)):
            variant_rows[str(row.photo_id)].append(row)
    objects = _keys_by_photo(inputs, f"{inputs.stage}/albums/", VARIANT_PHOTO)
    originals = _keys_by_photo(inputs, f"{inputs.stage}/originals/albums/", ORIGINAL_PHOTO)
    letters: dict[str, list[dict[str, Any]]] = defaultdict(list)
    redriven = []
    found = dead_letter_messages(inputs.sqs, inputs.queues.dead_letter_url)
    for message in [*found, *inputs.removed_letters]:
        attributes = {k: v.get("StringValue") for k, v in message.get("MessageAttributes", {}).items()}
        if "errorCode" in attributes:
            sent = int(message.get("Attributes", {}).get("SentTimestamp", 0)) / 1000
            removed = {"removed": message["removedAt"]} if "removedAt" in message else {}
            letters[attributes.get("photoId") or ""].append(
                attributes | {"sent": sent, "body": message["Body"][:300]} | removed
            )
        else:
            redriven.append(message)
    return Snapshot(photos, jobs, events, variant_rows, objects, originals, letters, redriven)


def _keys_by_photo(inputs: Inputs, prefix: str, photo: re.Pattern[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for page in inputs.s3.get_paginator("list_objects_v2").paginate(Bucket=inputs.bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            match = photo.search(item["Key"])
            if match:
                found[match.group(1)].append(item["Key"])
    return found


def dead_letter_messages(sqs: Any, url: str) -> list[dict[str, Any]]:
    """Everything in the dead-letter queue (hidden for the rest of the check, left in the queue),
    once what a sweep held when it was stopped is visible again (the sweep reads the queue for
    letters of deleted photos, hiding them for LETTER_VISIBILITY_SECONDS)."""
    deadline = time.monotonic() + LETTER_VISIBILITY_SECONDS + 15
    while time.monotonic() < deadline:
        hidden = sqs.get_queue_attributes(
            QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
        )["Attributes"]["ApproximateNumberOfMessagesNotVisible"]
        if int(hidden) == 0:
            break
        time.sleep(1)
    messages: list[dict[str, Any]] = []
    empty = 0
    while empty < 2:
        batch = sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=600,
            MessageAttributeNames=["All"],
            AttributeNames=["All"],
        ).get("Messages", [])
        empty = 0 if batch else empty + 1
        messages.extend(batch)
    return messages


def redriven_photo(message: dict[str, Any], malformed: dict[str, str]) -> tuple[str, str | None]:
    """(what the redriven body is, the photo it names)."""
    body = message["Body"]
    for name, text in malformed.items():
        if body == text:
            return f"malformed:{name}", None
    try:
        decoded = json.loads(body)
    except ValueError:
        return "unknown", None
    if isinstance(decoded, dict) and "photoId" in decoded:
        return "job_message", str(decoded["photoId"])
    found = UUID_TEXT.findall(body)
    return "s3_notification", found[1] if len(found) > 1 else None


@dataclass
class Receive:
    """One receive of a message by a worker: its receive count, and how its run ended: `returned`
    (reported failed: back after its visibility), `acknowledged`, `unacknowledged` (answered, then
    the worker died or the poller's delete failed before the message was deleted), or `died` (the
    worker was killed before its handler answered)."""

    log: str
    receive_count: int
    ended: str = "died"


class _Receives:
    """Reads one worker life's batches in order (a life polls one batch at a time)."""

    def __init__(self, log: str, into: dict[str, list[Receive]]) -> None:
        self.log = log
        self.into = into
        self.batch: list[tuple[str, Receive]] = []

    def line(self, entry: dict[str, Any]) -> None:
        chaos = entry.get("chaos")
        if chaos == "batch":
            self._settle("acknowledged")  # the poller deleted the last batch, and polled again
            self.batch = [
                (message_id, Receive(self.log, int(count))) for message_id, count in entry["messages"]
            ]
            for message_id, receive in self.batch:
                self.into[message_id].append(receive)
        elif chaos == "answered":
            failed = set(entry["failed"])
            for message_id, receive in self.batch:
                receive.ended = "returned" if message_id in failed else "answered"
        elif chaos in ("kill", "poller_error"):
            self._settle("unacknowledged")

    def end(self) -> None:
        self._settle("acknowledged")  # stopped after its last poll, which deleted what it answered

    def _settle(self, ended: str) -> None:
        for _, receive in self.batch:
            if receive.ended == "answered":
                receive.ended = ended


class Logs:
    """Every process's lines, and the chaos entries among them."""

    def __init__(self, run_dir: Path) -> None:
        self.files = sorted(run_dir.glob("*.log"))
        self.kills: list[dict[str, Any]] = []
        self.counts: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.unexpected: Counter[str] = Counter()
        self.engines: Counter[str] = Counter()
        self.sweeps: Counter[str] = Counter()
        # photo id -> (attempt, code, invocation, time) of every failed attempt the workers logged, and the
        # (photo id, invocation) pairs whose failure was not recorded or was fenced out.
        self.failures: dict[str, list[tuple[int, str, str, float]]] = defaultdict(list)
        self.unrecorded: set[tuple[str, str]] = set()
        self.instant_retries: Counter[str] = Counter()
        # message id -> each of its receives by a worker, in order
        self.receives: dict[str, list[Receive]] = defaultdict(list)
        for path in self.files:
            receives = _Receives(path.name, self.receives)
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    self._read(path, line, receives)
                elif "Traceback" in line and path.name.startswith(("worker-", "sweep-")):
                    self.counts["tracebacks"] += 1  # the functions' own (moto's server logs its own)
            receives.end()

    def _read(self, path: Path, line: str, receives: _Receives) -> None:
        try:
            entry = json.loads(line)
        except ValueError:
            return
        receives.line(entry)
        chaos = entry.get("chaos")
        if chaos == "kill":
            self.kills.append(entry)
        elif chaos == "engine":
            self.engines[path.name] += 1
        elif chaos in ("sweep_error", "poller_error"):
            self.counts[chaos] += 1
            self.unexpected[f"{chaos}: {entry['error'][:90]}"] += 1
        elif chaos is None:
            self._function_line(entry)

    def _function_line(self, entry: dict[str, Any]) -> None:
        message = entry.get("message")
        invocation = (str(entry.get("photo_id")), str(entry.get("function_request_id")))
        if message == "photo processed":
            self.outcomes[str(entry.get("outcome"))] += 1
            if entry.get("outcome") == "superseded":
                self.unrecorded.add(invocation)
            retry_in = entry.get("retry_in")
            if entry.get("outcome") == "retry" and retry_in is not None and float(retry_in) < 0.5:
                # SqsQueue.retry_later rounds the visibility: under half a second it is 0.
                self.instant_retries[invocation[0]] += 1
        elif message == "unexpected error":
            self.counts["unexpected_error"] += 1
            exception = str(entry.get("exception_name") or entry.get("exception", "")[-120:])
            self.unexpected[f"unexpected error: {exception}"] += 1
        elif message == "attempt failed" and entry.get("photo_id") and entry.get("attempt"):
            self.failures[entry["photo_id"]].append(
                (int(entry["attempt"]), str(entry.get("error_code")), invocation[1], _epoch(entry))
            )
        elif message == "sweep finished":
            for name in ("resentPending", "resentStale", "workerLost", "deadLettersSent", "sendFailed"):
                self.sweeps[name] += int(entry.get(name, 0))
            self.sweeps["runs"] += 1
        elif message == "handed on to a fresh message":
            self.counts["handed_on"] += 1
        elif message == "failure not recorded":
            self.counts["failure_not_recorded"] += 1
            self.unrecorded.add(invocation)

    def killed_photos(self, stages: tuple[str, ...]) -> dict[str, list[str]]:
        """photo id -> the stages of the kills that hit it."""
        hit: dict[str, list[str]] = defaultdict(list)
        for kill in self.kills:
            if kill["stage"] in stages:
                for photo_id in kill.get("photos") or [kill.get("photo_id")]:
                    if photo_id:
                        hit[photo_id].append(kill["stage"])
        return hit

    def lines_about(self, photo_ids: set[str]) -> dict[str, list[str]]:
        found: dict[str, list[str]] = defaultdict(list)
        if not photo_ids:
            return found
        for path in self.files:
            for line in path.read_text(errors="replace").splitlines():
                for photo_id in set(UUID_TEXT.findall(line)) & photo_ids:
                    found[photo_id].append(f"{path.name}: {line[:600]}")
        return found


def check(inputs: Inputs) -> Report:
    checker = Checker(inputs)
    if not inputs.settled:
        checker.violated(
            None, "drain", "the run did not drain within its bound (see the per-photo violations)"
        )
    for photo_id, plan in checker.planned.items():
        checker.photo(photo_id, plan)
    for message in checker.snap.redriven:
        checker.redriven(message)
    checker.containers()
    report = checker.report
    report.figures = figures(inputs, checker.snap, checker.logs)
    photo_ids = {v.photo_id for v in report.violations if v.photo_id}
    report.histories = histories(checker.snap, checker.logs, checker.planned, photo_ids)
    return report


class Checker:
    """The invariants, one photo at a time, against one snapshot taken after the drain."""

    def __init__(self, inputs: Inputs) -> None:
        self.inputs = inputs
        self.report = Report()
        self.snap = snapshot(inputs)
        self.logs = Logs(inputs.run_dir)
        self.planned = {str(p.photo_id): p for p in inputs.photos}
        self.rendering_killed = self.logs.killed_photos(("out_of_memory", "lambda_timeout"))
        self.chaos_killed = self.logs.killed_photos(("before_claim", "render", "between_puts", "commit"))

    def violated(self, photo_id: str | None, rule: str, detail: str, hint: str = "") -> None:
        self.report.violations.append(Violation(rule, detail, photo_id, hint))

    def explained(self, reason: str) -> None:
        self.report.explained[reason] += 1

    def photo(self, photo_id: str, plan: Any) -> None:
        if plan.expected == "deleted":
            self.deleted(photo_id, plan)
            return
        row = self.snap.photos.get(photo_id)
        if row is None:
            self.violated(photo_id, "photo row", "the upload API's row is missing")
            return
        self.job(photo_id, plan, row)
        if row.processing_state == "ready":
            self.ready(photo_id, plan, row)
        elif row.processing_state == "processing_failed":
            self.failed(photo_id, plan, row)
        else:
            self.violated(photo_id, "settled", f"photo still {row.processing_state}")
        self.orphans(photo_id, row)
        self.letters_owed(photo_id, plan)

    def deleted(self, photo_id: str, plan: Any) -> None:
        """Nothing of a deleted photo is left (SPEC 17), whatever raced its deletion, and nothing of
        it was published after its `photo.deleted` event."""
        if plan.deleted is None:
            self.violated(photo_id, "deleted", "the harness never managed to delete it")
            return
        snap = self.snap
        left = [
            name
            for name, found in (
                ("the photo row", photo_id in snap.photos),
                ("the job row", photo_id in snap.jobs),
                ("variant rows", bool(snap.variant_rows.get(photo_id))),
                ("variant objects", bool(snap.objects.get(photo_id))),
                ("the original", bool(snap.originals.get(photo_id))),
            )
            if found
        ]
        if left:
            self.violated(photo_id, "nothing left of a deleted photo", ", ".join(left) + " still there")
        events = snap.events.get(photo_id, [])
        gone = [e for e in events if e.event_type == "photo.deleted"]
        if len(gone) != 1:
            self.violated(photo_id, "one photo.deleted event", f"{len(gone)} events")
            return
        later = [e.event_type for e in events if e.created_at > gone[0].created_at]
        if later:
            self.violated(photo_id, "nothing after the deletion", f"events after photo.deleted: {later}")

    def job(self, photo_id: str, plan: Any, row: Any) -> None:
        job = self.snap.jobs.get(photo_id)
        if job is None:
            self.violated(photo_id, "job row", "no job row")
            return
        new_picture = any("a new picture" in action for _, action in plan.actions)
        if job.status in ("active", "pending"):
            self.violated(photo_id, "no open job", f"job {job.status}, attempt {job.attempt}")
        elif row.processing_state == "ready" and job.status == "failed" and new_picture:
            # SPEC 19: a published photo's new picture is processed as an upload; failed for good
            # (chaos took its attempts), it pages and the photo stays on the picture before.
            self.explained("a published photo's new picture failed for good, the photo kept its picture")
        elif (row.processing_state == "ready") != (job.status == "done"):
            self.violated(photo_id, "job matches photo", f"photo {row.processing_state}, job {job.status}")
        if job.attempt > self.inputs.max_attempts:
            self.violated(photo_id, "attempts", f"attempt {job.attempt} > {self.inputs.max_attempts}")

    def ready(self, photo_id: str, plan: Any, row: Any) -> None:
        published = self.published(photo_id)
        # One photo.published, and one more for each new picture the user uploaded in its place
        # once it was published (SPEC 19: the shown picture is the original's current upload);
        # a new picture uploaded before the first publication adds none.
        pictures = 1 + sum("a new picture" in action for _, action in plan.actions)
        if not 1 <= len(published) <= pictures:
            self.violated(
                photo_id,
                "one photo.published event a picture",
                f"{len(published)} events, {pictures} pictures",
            )
        # One version bump for each publication and one for each re-render (SPEC 14).
        rerenders = [
            e for e in self.snap.events.get(photo_id, []) if e.event_type == "photo.variants_updated"
        ]
        if row.entity_version != 1 + len(published) + len(rerenders) or row.visibility != "published":
            self.violated(
                photo_id,
                "entity_version 1 + publications + re-renders, published",
                f"{row.entity_version} after {len(published)} publications and {len(rerenders)} re-renders,"
                f" {row.visibility}",
            )
        job = self.snap.jobs.get(photo_id)
        current = hashlib.md5(plan.data, usedforsecurity=False).hexdigest() if plan.data else None
        if job is not None and job.status == "done" and current and row.original_etag != current:
            self.violated(
                photo_id,
                "the original's current upload shown",
                f"published {row.original_etag}, stored {current}",
            )
        variants = self.snap.variant_rows.get(photo_id, [])
        kinds = sorted(v.kind for v in variants)
        missing = [
            v.storage_key for v in variants if v.storage_key not in self.snap.objects.get(photo_id, [])
        ]
        # thumb, browse and the ladder's steps (each a w{edge}-{format} kind: keys.LADDER_KIND)
        if kinds[:2] != ["browse", "thumb"] or not all(is_ladder_kind(k) for k in kinds[2:]) or missing:
            self.violated(photo_id, "variants", f"variant rows {kinds}, objects missing {missing}")
        recipe = self.inputs.recipe_version
        versions = {v.variant_version for v in variants} | {row.variant_version}
        if recipe is not None and versions != {recipe}:
            self.violated(
                photo_id, "backfilled", f"the backfill to version {recipe} left it at {sorted(versions)}"
            )
        if plan.expected != "ready":
            hint = "issue 11 item 1" if plan.kind == "shape_bomb" else ""
            self.violated(
                photo_id,
                "hostile file refused",
                f"a {plan.kind} file was published, not {plan.expected}",
                hint,
            )
        for letter in self.snap.letters.get(photo_id, []):
            reason = _letter_for_published(plan, letter, self.operated(plan, after=float(letter["sent"])))
            if reason.startswith("explained"):
                self.explained(reason)
            else:
                self.violated(
                    photo_id, "page for a published photo", f"{reason}: {letter}", "issue 11 item 5"
                )

    def failed(self, photo_id: str, plan: Any, row: Any) -> None:
        code = row.error_code
        if not code:
            self.violated(photo_id, "failed with a code", "no error_code")
            return
        if self.published(photo_id) or row.entity_version != 1:
            self.violated(photo_id, "no event for a failed photo", f"entity_version {row.entity_version}")
        final = ErrorCode(code) not in PERMANENT
        job = self.snap.jobs.get(photo_id)
        if final and not self.snap.letters.get(photo_id):
            attempt = job.attempt if job else "?"
            self.violated(
                photo_id,
                "final failure dead-lettered",
                f"{code} at attempt {attempt}: no dead-letter message",
                "issue 11 item 2",
            )
        if code == ErrorCode.UNEXPECTED_ERROR:
            self.violated(photo_id, "no unexpected error", "a bug ended this photo (see its log lines)")
        if plan.expected == "ready":
            if final:
                self.explained(f"good photo ({plan.kind}), final failure {code}")
            else:
                self.violated(
                    photo_id, "good photo misread as bad input", f"a {plan.kind} photo ended {code}"
                )
        elif code != plan.expected:
            if not final:
                self.violated(
                    photo_id,
                    "hostile file's own code",
                    f"a {plan.kind} file ended {code}, not {plan.expected}",
                )
            elif photo_id in self.rendering_killed:
                stages = ", ".join(self.rendering_killed[photo_id])
                self.violated(
                    photo_id,
                    "bounded render",
                    f"a {plan.kind} file ended {code}: Lambda's limits killed the worker rendering it ({stages})",
                    "issue 11 item 1",
                )
            else:
                self.explained(f"hostile ({plan.kind}), final failure {code} after chaos")

    def letters_owed(self, photo_id: str, plan: Any) -> None:
        """Each final failure a worker logged has a dead letter sent after it and before the next
        one (a redelivery that reopens the job, issue 11 item 5, would otherwise hide a lost letter).

        Folded, not lost: a genuinely new upload reopened the job while its letter was still owed,
        and the letter of the final failure that followed stands for both (SPEC 5 forbids a failed
        job whose letter was never sent; this one did not stay failed)."""
        finals = sorted(
            at
            for attempt, code, invocation, at in self.logs.failures.get(photo_id, [])
            if attempt >= self.inputs.max_attempts
            and code in ErrorCode.__members__
            and ErrorCode(code) not in PERMANENT
            and (photo_id, invocation) not in self.logs.unrecorded
        )
        sent = [float(letter.get("sent", 0)) for letter in self.snap.letters.get(photo_id, [])]
        uploads = [at for at, action in plan.actions if "a new picture" in action]
        already = any(
            v.photo_id == photo_id and v.rule == "final failure dead-lettered" for v in self.report.violations
        )
        for index, failed_at in enumerate(finals):
            following = finals[index + 1] if index + 1 < len(finals) else float("inf")
            # (A second of slack: the queue's SentTimestamp and the worker's clock are read apart.)
            if any(failed_at - 1 <= at < following for at in sent):
                continue
            if following < float("inf") and any(at < following for at in uploads):
                self.explained(
                    "a final failure's owed letter folded into the next one's (a new upload reopened it)"
                )
                continue
            if any(failed_at < at < following for at in self.operated(plan, after=failed_at)):
                # SPEC 5: a retry or redrive takes back a letter still owed (no page for a photo that
                # is not failed); the next final failure owes its own.
                self.explained("a final failure's owed letter taken back by the operator's retry or redrive")
                continue
            if not already:
                self.violated(
                    photo_id,
                    "final failure dead-lettered",
                    f"the final failure logged at {_clock(failed_at)} has no dead letter sent after it"
                    f" ({len(finals)} final failures, {len(sent)} letters)",
                    "issue 11 item 2",
                )
            return

    def orphans(self, photo_id: str, row: Any) -> None:
        if row.processing_state == "ready" or not self.snap.objects.get(photo_id):
            return
        if photo_id in self.chaos_killed or photo_id in self.rendering_killed:
            self.explained("variants of an unpublished photo: an attempt stored them, then was killed")
        elif row.error_code and ErrorCode(row.error_code) not in PERMANENT:
            self.explained("variants of an unpublished photo: an attempt stored them, then failed")
        else:
            self.violated(
                photo_id, "no variants of unpublished photos", "no attempt died or failed after storing them"
            )

    def redriven(self, message: dict[str, Any]) -> None:
        what, photo_id = redriven_photo(message, self.inputs.malformed)
        if what.startswith("malformed"):
            self.violated(
                None,
                "malformed messages are acknowledged",
                f"{what} was retried until the redrive dead-lettered it",
                "issue 11 item 6" if what == "malformed:nested_json" else "",
            )
            return
        row = self.snap.photos.get(photo_id or "")
        if (
            row is not None
            and row.processing_state == "processing_failed"
            and ErrorCode(row.error_code) not in PERMANENT
        ):
            self.explained("redriven after runs that never finished, photo failed for good")
            return
        ended = f"{row.processing_state} {row.error_code or ''}" if row is not None else "unknown"
        # The process function hands a message on at its second-last receive, so the redrive takes
        # one only where its runs from there on never ended: killed, answered but never deleted, or
        # never run at all (a receive no worker logged: the poller's ReceiveMessage answer was lost
        # on its way, the message counted as received all the same).
        receives = self.logs.receives.get(message["MessageId"], [])
        last = [r for r in receives if r.receive_count >= self.inputs.redrive_receives - 1]
        if all(r.ended in ("died", "unacknowledged") for r in last):
            self.explained("redriven after its last runs never ended (killed, unacknowledged or never run)")
            return
        received = message.get("Attributes", {}).get("ApproximateReceiveCount")
        spins = self.logs.instant_retries.get(photo_id or "", 0)
        self.violated(
            photo_id,
            "redrive only for runs that never finish",
            f"a {what} was dead-lettered by maxReceiveCount (received {received} times); the photo ended {ended};"
            f" its receives: {[(r.receive_count, r.ended, r.log) for r in receives]}"
            + (
                f"; {spins} deliveries came back at once (a visibility under 0.5 s rounded to 0)"
                if spins
                else ""
            ),
            "new: sub-second retry visibility rounds to 0 (queue.py retry_later)" if spins >= 3 else "",
        )

    def containers(self) -> None:
        """One engine (one small pool) per container (SPEC 8)."""
        doubled = sorted(name for name, engines in self.logs.engines.items() if engines > 1)
        if doubled:
            self.violated(
                None,
                "one engine per container",
                f"{len(doubled)} of {len(self.logs.engines)} worker lives built more than one engine"
                f" (their batch threads raced bootstrap), e.g. {doubled[0]}",
                "issue 11 item 3",
            )

    @staticmethod
    def operated(plan: Any, *, after: float) -> list[float]:
        """When the operator took this photo's failure back (retry, redrive) after `after`."""
        return [at for at, action in plan.actions if action.startswith("operator:") and at > after]

    def published(self, photo_id: str) -> list[Any]:
        return [e for e in self.snap.events.get(photo_id, []) if e.event_type == "photo.published"]


def _letter_for_published(plan: Any, letter: dict[str, Any], operated: list[float]) -> str:
    if letter.get("errorCode") == "PHOTO_NOT_FOUND" and plan.kind == "early_original":
        return "explained: an upload before its row was dead-lettered, then its row came"
    if letter.get("kind") == "rerender":
        # SPEC 16 (4): a re-render that fails for good pages as one, the photo stays published.
        return "explained: a re-render failed for good and paged as a re-render"
    if operated:
        return "explained: a final failure paged, then the operator took it back and it published"
    # (Its notification may be worked on after the failure even if the upload came before it.)
    if any("a new picture" in action for _, action in plan.actions):
        return "explained: a final failure, then a genuinely new upload reopened and published it"
    return "a redelivery reopened a final failure that had paged"


def figures(inputs: Inputs, snap: Snapshot, logs: Logs) -> dict[str, Any]:
    planned = inputs.photos
    latencies = []
    for plan in planned:
        row = snap.photos.get(str(plan.photo_id))
        if row is not None and row.processing_state == "ready" and plan.uploaded_at and row.published_at:
            latencies.append(row.published_at.timestamp() - plan.uploaded_at)
    latencies.sort()
    states = Counter(
        "ready" if r.processing_state == "ready" else f"failed {r.error_code}" for r in snap.photos.values()
    )
    kills = Counter(k["stage"] for k in logs.kills)
    commit_points = Counter(k.get("point", "?") for k in logs.kills if k["stage"] == "commit")
    lives = Counter(life.role for life in inputs.lives)
    return {
        "photos": len(planned),
        "by_kind": dict(Counter(p.kind for p in planned)),
        "outcome": dict(states.most_common()),
        "deliveries": dict(logs.outcomes.most_common()),
        "kills_by_stage": dict(kills),
        "commit_kill_points": dict(commit_points),
        "worker_lives": lives.get("worker", 0),
        # Issue 11 item 3: the batch's threads racing bootstrap build a second engine (and pool).
        "lives_with_two_engines": sum(1 for n in logs.engines.values() if n > 1),
        "sweep_lives": lives.get("sweep", 0),
        "faults_by_kind": inputs.proxy_stats.get("faults", {}),
        "requests": inputs.proxy_stats.get("requests", {}),
        "outages": dict(inputs.tally.outages),
        "database": inputs.database | {"faults": dict(inputs.tally.database)},
        "duplicates": dict(inputs.tally.duplicates),
        "deletions": dict(inputs.tally.deletions),
        "operator": dict(inputs.tally.operator),
        "backfill": dict(inputs.tally.backfill)
        | {
            "rerendered": sum(
                1
                for events in snap.events.values()
                if any(e.event_type == "photo.variants_updated" for e in events)
            )
        },
        "malformed_sent": inputs.tally.malformed,
        "sweeps": dict(logs.sweeps),
        "dead_letters": {
            "letters": sum(len(v) for v in snap.letters.values()),
            "redriven": len(snap.redriven),
            "removed_by_the_operator": len(inputs.removed_letters),
        },
        "errors": dict(logs.counts),
        "error_kinds": dict(logs.unexpected.most_common(12)),
        "latency_seconds": {
            "published": len(latencies),
            "p50": round(statistics.median(latencies), 2) if latencies else None,
            "p99": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 2)
            if latencies
            else None,
            "max": round(latencies[-1], 2) if latencies else None,
        },
    }


def histories(snap: Snapshot, logs: Logs, planned: dict[str, Any], photo_ids: set[str]) -> dict[str, str]:
    lines = logs.lines_about(photo_ids)
    out = {}
    for photo_id in sorted(photo_ids):
        plan = planned.get(photo_id)
        text = [f"photo {photo_id}"]
        if plan is not None:
            text.append(
                f"  planned: {plan.kind} {plan.file_name!r}, expected {plan.expected}, key {plan.key}"
            )
            text += [f"  harness {_clock(t)}: {action}" for t, action in plan.actions]
        row, job = snap.photos.get(photo_id), snap.jobs.get(photo_id)
        if row is not None:
            text.append(
                f"  photo: {row.processing_state} {row.visibility} error={row.error_code} "
                f"entity_version={row.entity_version} published_at={row.published_at} updated_at={row.updated_at}"
            )
        if job is not None:
            text.append(
                f"  job: {job.status} attempt={job.attempt} last_error={job.last_error_code} "
                f"claimed_at={job.claimed_at} next_retry_at={job.next_retry_at} enqueued_at={job.enqueued_at} "
                f"updated_at={job.updated_at}"
            )
        for event in snap.events.get(photo_id, []):
            text.append(
                f"  event: {event.event_type} v{event.payload.get('entityVersion')} at {event.created_at}"
            )
        for variant in snap.variant_rows.get(photo_id, []):
            text.append(f"  variant row: {variant.kind} {variant.storage_key}")
        text += [f"  object: {key}" for key in snap.objects.get(photo_id, [])]
        text += [f"  dead letter: {letter}" for letter in snap.letters.get(photo_id, [])]
        found = lines.get(photo_id, [])
        text.append(
            f"  log lines ({len(found)}{', the last ' + str(HISTORY_LINES) if len(found) > HISTORY_LINES else ''}):"
        )
        text += [f"    {line}" for line in found[-HISTORY_LINES:]]
        out[photo_id] = "\n".join(text)
    return out


def _epoch(entry: dict[str, Any]) -> float:
    """A function log line's time (Powertools: `2026-12-01 12:10:54,784+0000`)."""
    stamp = str(entry.get("timestamp", ""))
    try:
        return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f%z").timestamp()
    except ValueError:
        return 0.0


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%H:%M:%S.%f")[:-3]


def publish(report: Report, run_dir: Path) -> None:
    """Print the verdict and the figures; write summary.json and violations.txt beside the logs."""
    figures = report.figures
    settled_seconds = report.times.get("to_settled") or 0
    photos = figures.get("photos", 0)
    figures["throughput_photos_per_second"] = round(photos / settled_seconds, 2) if settled_seconds else None
    summary = {
        "seed": report.seed,
        "violations": len(report.violations),
        "times_seconds": report.times,
        "figures": figures,
        "explained": dict(report.explained),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    detail = []
    for violation in report.violations:
        hint = f" [{violation.hint}]" if violation.hint else ""
        detail.append(f"VIOLATION {violation.rule}{hint}: {violation.detail} (photo {violation.photo_id})")
    detail += ["", *report.histories.values()]
    (run_dir / "violations.txt").write_text(f"SOAK_SEED={report.seed}\n" + "\n".join(detail) + "\n")

    print(f"\nsoak SOAK_SEED={report.seed}: {photos} photos in {report.times.get('total')}s {report.times}")
    for name in (
        "by_kind",
        "outcome",
        "deliveries",
        "kills_by_stage",
        "commit_kill_points",
        "faults_by_kind",
        "outages",
        "database",
        "duplicates",
        "deletions",
        "operator",
        "backfill",
        "malformed_sent",
        "sweeps",
        "dead_letters",
        "errors",
        "error_kinds",
        "latency_seconds",
    ):
        print(f"  {name}: {figures.get(name)}")
    print(
        f"  worker lives: {figures.get('worker_lives')}, sweep lives: {figures.get('sweep_lives')},"
        f" lives that built two engines: {figures.get('lives_with_two_engines')}"
    )
    print(
        f"  throughput: {figures['throughput_photos_per_second']} photos/s (upload of the first to all settled)"
    )
    for reason, count in report.explained.most_common():
        print(f"  explained: {count} x {reason}")
    if not report.violations:
        print(f"  0 violations. Logs: {run_dir}")
        return
    print(f"  {len(report.violations)} VIOLATIONS (SOAK_SEED={report.seed} replays the schedule):")
    for line in detail:
        print(f"  {line}")
    print(f"  (also in {run_dir / 'violations.txt'})")
