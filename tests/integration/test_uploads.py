"""The app's side (SPEC 17) through its real parts: a registration's POST to S3 (moto's server),
the process function, the status a client polls (a failed photo given its attempts again is
processing), and deletion, racing renders included, with what outlives it: no retired variant's row,
delete markers that expire with the versions under them.

moto's S3 accepts a browser's POST and stores the object, but does not check the policy it
carries (a wrong size, type or key is stored all the same): what S3 refuses is shown against
LocalStack, which does (tests/localstack).
"""

from __future__ import annotations

import base64
import json
import threading
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import requests
import yaml
from sqlalchemy import Engine, func, select, text, update

from devkit import handlers, samples
from devkit import uploads as dev_uploads
from devkit.poller import LambdaContext
from photo_publish import bootstrap, operator, uploads
from photo_publish.adapters.models import OutboxEvent, Photo, PhotoJob, PhotoVariant, RetiredVariant
from photo_publish.adapters.storage import S3Store
from photo_publish.adapters.tables import cdn_invalidations, deleted_photos
from photo_publish.contracts import PHOTO_DELETED, PHOTO_PUBLISHED, PhotoDeletedPayload
from photo_publish.keys import photo_prefixes
from tests import cdn
from tests.conftest import BUCKET, STAGE, Infra
from tests.network_guard import GUARD
from tests.polling import poll_until, sweep
from tests.rows import job, published
from tests.template.test_template import CfnLoader

JPEG = (samples.IMAGES / "Garden.jpg").read_bytes()


def post(registration: uploads.Registration, data: bytes, file_name: str = "photo.jpg") -> requests.Response:
    """What the browser does with the answer: a multipart POST of the fields, then the file."""
    return requests.post(
        registration.url, data=registration.fields, files={"file": (file_name, data)}, timeout=30
    )


def register(infra: Infra, db: Engine, **overrides: Any) -> uploads.Registration:
    request = {
        "album_id": str(uuid.uuid4()),
        "file_name": "Garden.jpg",
        "content_type": "image/jpeg",
        "caller": uploads.BACKEND,
    }
    return uploads.register(db, infra.s3, infra.settings, **(request | overrides))


def keys_under(infra: Infra, album_id: uuid.UUID, photo_id: uuid.UUID) -> list[str]:
    found = []
    for prefix in photo_prefixes(STAGE, album_id, photo_id):
        found += [
            o["Key"] for o in infra.s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
        ]
    return found


def test_a_registered_upload_posted_by_a_browser_is_published(infra: Infra, db: Engine) -> None:
    # GIVEN a registration (the photo's and its job's rows, and a POST to S3)
    registration = register(infra, db, file_name="Summer/../evening\x07 walk.jpg", size=len(JPEG))

    # THEN its key is the cleaned name under a photo id the server chose, and the rows are there
    assert registration.key == (
        f"{STAGE}/originals/albums/{registration.album_id}/{registration.photo_id}/Summer..evening walk.jpg"
    )
    assert registration.fields["key"] == registration.key
    with db.connect() as c:
        assert (
            c.scalar(select(PhotoJob.status).where(PhotoJob.photo_id == registration.photo_id)) == "pending"
        )
    assert uploads.status(db, registration.photo_id, caller=uploads.BACKEND)["state"] == "processing"  # type: ignore[index]

    # WHEN the browser posts the file with the returned fields, and the queue runs
    assert post(registration, JPEG).status_code in (200, 201, 204)
    poll_until(infra, published(db, registration.photo_id))

    # THEN the photo is published, and its status says so with URLs under the configured base
    answer = uploads.status(
        db, registration.photo_id, base_url="https://cdn.example.com/", caller=uploads.BACKEND
    )
    assert answer is not None and answer["state"] == "published" and answer["error"] is None
    browse = answer["variants"]["browse"]
    assert browse["url"] == f"https://cdn.example.com/{browse['key']}"
    assert answer["placeholder"]["averageColor"].startswith("#")
    with db.connect() as c:
        assert (
            c.scalar(
                select(func.count()).where(
                    OutboxEvent.aggregate_id == registration.photo_id,
                    OutboxEvent.event_type == PHOTO_PUBLISHED,
                )
            )
            == 1
        )


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"album_id": "not-a-uuid"}, "ALBUM_ID_INVALID"),
        ({"file_name": "/\x00\x1f/"}, "FILE_NAME_INVALID"),
        ({"file_name": " . "}, "FILE_NAME_INVALID"),
        ({"content_type": "application/pdf"}, "CONTENT_TYPE_UNSUPPORTED"),
        ({"size": 0}, "SIZE_INVALID"),
        ({"size": 104_857_601}, "SIZE_INVALID"),
    ],
)
def test_a_request_that_cannot_be_an_upload_is_refused_with_its_reason_and_writes_nothing(
    infra: Infra, db: Engine, overrides: dict[str, Any], reason: str
) -> None:
    with pytest.raises(uploads.Refused) as refused:
        register(infra, db, **overrides)
    assert refused.value.reason == reason
    with db.connect() as c:
        assert c.scalar(select(func.count()).select_from(Photo)) == 0


def test_the_policy_binds_the_key_the_size_the_type_and_the_encryption(infra: Infra, db: Engine) -> None:
    import base64
    import json

    registration = register(infra, db, content_type="image/heic", size=1234)
    policy = json.loads(base64.b64decode(registration.fields["policy"]))
    assert {"bucket": BUCKET} in policy["conditions"]
    assert ["eq", "$key", registration.key] in policy["conditions"]
    assert ["content-length-range", 1, 1234] in policy["conditions"]
    assert {"Content-Type": "image/heic"} in policy["conditions"]
    assert {"x-amz-server-side-encryption": "AES256"} in policy["conditions"]


def test_the_upload_functions_client_signs_the_post_with_sigv4(infra: Infra, db: Engine) -> None:
    """botocore presigns S3 with SigV2 unless told otherwise, and S3 refuses SigV2 on buckets
    created since June 2020 (the template's bucket is one); no emulator here checks signatures."""
    registration = uploads.register(
        db,
        bootstrap.s3_client(),
        infra.settings,
        album_id=uuid.uuid4(),
        file_name="a.jpg",
        content_type="image/jpeg",
        caller=uploads.BACKEND,
    )
    assert registration.fields["x-amz-algorithm"] == "AWS4-HMAC-SHA256"
    assert {"x-amz-credential", "x-amz-date", "x-amz-signature"} <= set(registration.fields)
    assert not {"AWSAccessKeyId", "signature"} & set(registration.fields)


def test_motos_server_stores_a_post_that_breaks_its_policy(infra: Infra, db: Engine) -> None:
    """Why tests/localstack/test_upload_policy.py exists: here a body over the declared size, of
    another type and without the encryption is stored all the same (S3 answers 400 EntityTooLarge
    and 403 AccessDenied, shown against LocalStack)."""
    # GIVEN a registration for a JPEG of a declared size
    registration = register(infra, db, size=len(JPEG))
    fields = registration.fields | {"Content-Type": "text/html"}
    del fields["x-amz-server-side-encryption"]

    # WHEN the browser posts more than that, as another type, without the encryption
    response = requests.post(
        registration.url, data=fields, files={"file": ("photo.jpg", JPEG + b"\0" * 100)}, timeout=30
    )

    # THEN moto's server stores it
    assert response.status_code in (200, 201, 204)
    head = infra.s3.head_object(Bucket=BUCKET, Key=registration.key)
    assert (head["ContentLength"], head["ContentType"]) == (len(JPEG) + 100, "text/html")
    assert "ServerSideEncryption" not in head


def test_a_failed_photo_says_why_in_words(infra: Infra, db: Engine) -> None:
    registration = register(infra, db)
    post(registration, b"not a picture at all")
    poll_until(
        infra, lambda: uploads.status(db, registration.photo_id, caller=uploads.BACKEND)["state"] == "failed"
    )  # type: ignore[index]
    answer = uploads.status(db, registration.photo_id, caller=uploads.BACKEND)
    assert answer is not None
    assert answer["errorCode"] in ("UNSUPPORTED_FORMAT", "DECODE_FAILED")
    assert answer["error"] == uploads.IN_WORDS[uploads.ErrorCode(answer["errorCode"])]
    assert (
        uploads.status(db, uuid.uuid4(), caller=uploads.BACKEND) is None
        and uploads.status(db, "nonsense", caller=uploads.BACKEND) is None
    )


def test_status_says_processing_while_a_failed_photo_is_given_its_attempts_again(
    infra: Infra, db: Engine
) -> None:
    """SPEC 17 / issue 22 item 2: the status answers 'the state'. After an operator retry (or a
    new upload that reopens the job) the job is pending again, yet the answer stays
    state=failed with the old error: a polling client (the gallery's watch() returns on 'failed')
    stops and never sees the photo published."""
    reg = uploads.register(
        db,
        infra.s3,
        infra.settings,
        album_id=str(uuid.uuid4()),
        file_name="a.jpg",
        content_type="image/jpeg",
        caller=uploads.BACKEND,
    )
    requests.post(reg.url, data=reg.fields, files={"file": ("a.jpg", b"not a picture")}, timeout=30)
    poll_until(infra, lambda: uploads.status(db, reg.photo_id, caller=uploads.BACKEND)["state"] == "failed")

    # the user uploads the real file again with the same (still valid) POST: the job reopens
    data = (samples.IMAGES / "Garden.jpg").read_bytes()
    requests.post(reg.url, data=reg.fields, files={"file": ("a.jpg", data)}, timeout=30)
    # (the operator's retry does the same: operator.reset_failed)
    operator.reset_failed(bootstrap.engine(), [reg.photo_id])
    print("job:", job(db, reg.photo_id))
    answer = uploads.status(db, reg.photo_id, caller=uploads.BACKEND)
    print("status:", {k: answer[k] for k in ("state", "errorCode", "error")})
    assert job(db, reg.photo_id)[0] == "pending"
    assert answer["state"] == "processing", "status says failed for a photo whose job is pending again"


def test_a_deleted_photo_leaves_no_object_no_row_and_one_photo_deleted_event(
    infra: Infra, db: Engine
) -> None:
    # GIVEN a published photo
    registration = register(infra, db)
    post(registration, JPEG)
    poll_until(infra, published(db, registration.photo_id))
    assert keys_under(infra, registration.album_id, registration.photo_id)

    # WHEN it is deleted
    store = S3Store(infra.s3, BUCKET)
    assert uploads.delete(db, store, infra.settings, registration.photo_id, caller=uploads.BACKEND)

    # THEN no object and no row is left; one photo.deleted event, one version past the photo's last
    assert keys_under(infra, registration.album_id, registration.photo_id) == []
    with db.connect() as c:
        for table in (Photo, PhotoJob, PhotoVariant):
            key = Photo.id if table is Photo else table.photo_id  # type: ignore[attr-defined]
            assert c.scalar(select(func.count()).select_from(table).where(key == registration.photo_id)) == 0
        events = c.execute(
            select(OutboxEvent.event_type, OutboxEvent.payload)
            .where(OutboxEvent.aggregate_id == registration.photo_id)
            .order_by(OutboxEvent.created_at)
        ).all()
    assert [e.event_type for e in events][-1] == PHOTO_DELETED
    deleted = PhotoDeletedPayload.from_json(events[-1].payload)
    assert deleted.entity_version == 3  # 1, published 2, deleted 3
    # AND a second deletion is an unknown photo's
    assert not uploads.delete(db, store, infra.settings, registration.photo_id, caller=uploads.BACKEND)
    assert uploads.status(db, registration.photo_id, caller=uploads.BACKEND) is None


@pytest.mark.usefixtures("recipe_before_the_ladder")
def test_a_deleted_photo_that_was_rerendered_leaves_no_retired_variant_rows(
    infra: Infra, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    """SPEC 17: 'its rows ... go'. A photo re-rendered by a backfill has retired_variants rows (the
    old version's keys, photo_id); deletion leaves them (no FK, not in machine.delete) until the
    grace period, VARIANT_GRACE_SECONDS = 7 days, and they are not among docs/integrating.md's
    'what outlives a deletion'."""
    shot = dev_uploads.upload(
        db, infra.s3, BUCKET, STAGE, file_name="Garden.jpg", data=(samples.IMAGES / "Garden.jpg").read_bytes()
    )
    poll_until(infra, published(db, shot.photo_id))
    infra.configure(thumb_size=320, variant_version=2, backfill_spread_seconds=0)
    operator.main(["rerender", "--all"])
    capsys.readouterr()
    sweep()
    poll_until(infra, lambda: _variant_version(db, shot.photo_id) == 2)
    with db.connect() as c:
        assert c.scalar(select(func.count()).select_from(RetiredVariant)) > 0

    assert uploads.delete(
        db, S3Store(infra.s3, BUCKET), infra.settings, shot.photo_id, caller=uploads.BACKEND
    )
    with db.connect() as c:
        rows = c.execute(
            select(RetiredVariant.storage_key, RetiredVariant.delete_after).where(
                RetiredVariant.photo_id == shot.photo_id
            )
        ).all()
    print("rows left for the deleted photo in retired_variants:", rows)
    assert rows == [], "the deleted photo keeps rows (its keys, its id) in retired_variants"


def _variant_version(db: Engine, photo_id: UUID) -> int | None:
    with db.connect() as c:
        return c.scalar(select(Photo.variant_version).where(Photo.id == photo_id))


def test_a_deleted_photos_delete_markers_expire_with_its_versions(infra: Infra, db: Engine) -> None:
    """SPEC 17: 'the copies that outlive a deletion ... are said, with their retention as
    parameters'. The template's bucket is versioned; the deletion (S3Store.delete_under, a plain
    DeleteObject) leaves a delete marker per key, whose key is the user's cleaned file name. The
    lifecycle has NoncurrentVersionExpiration only: per AWS (ManagingDelMarkers), an expired object
    delete marker is removed only when the configuration expires current versions or sets
    ExpiredObjectDeleteMarker. Neither is set, so the markers (file names) stay for ever."""
    rules = yaml.load(Path("template.yaml").read_text(), Loader=CfnLoader)["Resources"]["PhotoBucket"][
        "Properties"
    ]["LifecycleConfiguration"]["Rules"]
    print("PhotoBucket lifecycle rules:", rules)

    # the same bucket settings on moto's server: versioned, a photo's original and variants, deleted
    bucket = f"versioned-{uuid.uuid4().hex[:8]}"
    infra.s3.create_bucket(Bucket=bucket)
    infra.s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    album, photo = uuid.uuid4(), uuid.uuid4()
    name = "Jane Doe - passport scan.jpg"
    keys = [
        f"{STAGE}/originals/albums/{album}/{photo}/{name}",
        f"{STAGE}/albums/{album}/variants/{photo}/1/thumb.webp",
    ]
    for key in keys:
        infra.s3.put_object(Bucket=bucket, Key=key, Body=(samples.IMAGES / "Garden.jpg").read_bytes())
    assert S3Store(infra.s3, bucket).delete_under(photo_prefixes(STAGE, album, photo))
    listed = infra.s3.list_object_versions(Bucket=bucket, Prefix=f"{STAGE}/")
    markers = [m["Key"] for m in listed.get("DeleteMarkers", [])]
    versions = [v["Key"] for v in listed.get("Versions", [])]
    print("after the deletion: noncurrent versions", versions, "delete markers", markers)
    assert markers  # what the lifecycle must eventually remove
    removes_markers = any(
        (r.get("ExpiredObjectDeleteMarker") or (r.get("ExpirationInDays") is not None))
        and r.get("Status") == "Enabled"
        for r in rules
    )
    assert removes_markers, "no lifecycle rule removes expired delete markers: the file names stay for ever"


def test_an_album_erasure_reaches_the_cdn_in_a_bounded_number_of_calls(
    infra: Infra, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN an album of 200 photos, another album's photo, and the stack's distribution named
    distribution = cdn.distribution(BUCKET)
    infra.monkeypatch.setenv("CDN_DISTRIBUTION_ID", distribution)
    bootstrap.reset()
    album = uuid.uuid4()
    photos = [register(infra, db, album_id=str(album)).photo_id for _ in range(200)]
    other = register(infra, db)

    # WHEN the operator erases the album
    operator.main(["delete", "--album", str(album)])

    # THEN every photo is deleted, and every one's variants are invalidated at the distribution in a
    # call or two, not one a photo (CloudFront holds at most 15 wildcard paths in progress)
    assert len(json.loads(capsys.readouterr().out)["deleted"]) == 200
    calls = cdn.invalidations(distribution)
    assert 1 <= len(calls) <= 2, calls
    paths = {path for call in calls for path in call}
    assert all(len(call) <= 15 for call in calls)
    for photo in photos:
        assert {f"/{STAGE}/albums/{album}/variants/{photo}/*", f"/{STAGE}/albums/{album}/variants/*"} & paths
    # AND the other album's photo is not touched, and nothing is left for the sweep
    assert not {p for p in paths if str(other.album_id) in p}
    assert cdn.waiting(db) == {}


def test_a_deletion_by_a_process_that_knows_no_cdn_reaches_it_through_the_sweep(
    infra: Infra, db: Engine
) -> None:
    # GIVEN a stack's distribution, and an app's own API deleting through the library in a process
    # that is not told of it (CDN_DISTRIBUTION_ID unset there)
    distribution = cdn.distribution(BUCKET)
    registration = register(infra, db)
    with db.connect() as c:
        album = c.scalar(select(Photo.album_id).where(Photo.id == registration.photo_id))
    path = f"/{STAGE}/albums/{album}/variants/{registration.photo_id}/*"

    # WHEN the photo is deleted
    assert uploads.delete(
        db, S3Store(infra.s3, BUCKET), infra.settings, registration.photo_id, caller=uploads.BACKEND
    )

    # THEN its path waits, CloudFront not called by the deleter
    assert set(cdn.waiting(db)) == {path}
    assert cdn.invalidations(distribution) == []

    # WHEN the sweep, which the template tells the distribution, runs once the path is due
    infra.monkeypatch.setenv("CDN_DISTRIBUTION_ID", distribution)
    with db.begin() as c:
        c.execute(update(cdn_invalidations).values(next_try_at=func.now() - timedelta(minutes=1)))
    bootstrap.reset()
    handlers.load("sweep").lambda_handler({"source": "aws.events"}, LambdaContext(timeout_seconds=60))

    # THEN the path is invalidated at the distribution, and waits no more
    assert cdn.invalidations(distribution) == [[path]]
    assert cdn.waiting(db) == {}


def test_without_a_cdn_the_sweep_drops_the_paths_deletions_recorded(infra: Infra, db: Engine) -> None:
    # GIVEN a stack without a CDN (the sweep told of no distribution), and a photo deleted
    registration = register(infra, db)
    assert uploads.delete(
        db, S3Store(infra.s3, BUCKET), infra.settings, registration.photo_id, caller=uploads.BACKEND
    )
    assert len(cdn.waiting(db)) == 1

    # WHEN the sweep runs
    bootstrap.reset()
    handlers.load("sweep").lambda_handler({"source": "aws.events"}, LambdaContext(timeout_seconds=60))

    # THEN nothing is left waiting for a CDN that is not there
    assert cdn.waiting(db) == {}


def test_an_upload_event_for_a_deleted_photo_is_acknowledged_not_retried_until_it_pages(
    infra: Infra, db: Engine
) -> None:
    # GIVEN a photo deleted before its upload's notification was processed
    registration = register(infra, db)
    post(registration, JPEG)
    assert uploads.delete(
        db, S3Store(infra.s3, BUCKET), infra.settings, registration.photo_id, caller=uploads.BACKEND
    )

    # WHEN the notification is delivered
    poller = poll_until(infra, lambda: True)
    poller.poll_once()

    # THEN it is acknowledged at once: nothing comes back, nothing is dead-lettered
    assert poller.failed == 0
    assert (
        infra.sqs.receive_message(QueueUrl=infra.queues.dead_letter_url, WaitTimeSeconds=0).get("Messages")
        is None
    )


def test_a_deletion_racing_a_render_leaves_nothing_once_the_sweep_purged(
    infra: Infra, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a render that is putting its variants when the photo is deleted
    registration = register(infra, db)
    post(registration, JPEG)
    putting, deleted = threading.Event(), threading.Event()
    real_put = S3Store.put_variant

    def put_after_the_deletion(self: S3Store, key: str, data: bytes, content_type: str) -> None:
        putting.set()
        deleted.wait(30)
        real_put(self, key, data, content_type)

    monkeypatch.setattr(S3Store, "put_variant", put_after_the_deletion)
    worker = threading.Thread(target=lambda: poll_until(infra, putting.is_set).poll_once())
    worker.start()
    assert putting.wait(30)
    assert uploads.delete(
        db, S3Store(infra.s3, BUCKET), infra.settings, registration.photo_id, caller=uploads.BACKEND
    )
    deleted.set()
    worker.join(60)

    # THEN nothing was published: the worker found its claim gone
    with db.connect() as c:
        assert c.scalar(select(func.count()).where(OutboxEvent.event_type == PHOTO_PUBLISHED)) == 0
        assert c.scalar(select(func.count()).select_from(Photo)) == 0
    # AND what the worker put after the deletion is there until the sweep purges it, once no worker
    # can still hold the photo
    assert keys_under(infra, registration.album_id, registration.photo_id)
    monkeypatch.setattr(S3Store, "put_variant", real_put)
    with db.begin() as c:
        c.execute(update(deleted_photos).values(purge_after=func.now() - timedelta(seconds=1)))
    bootstrap.reset()
    summary = handlers.load("sweep").lambda_handler({"source": "aws.events"}, _context())
    assert summary["deletedPurged"] == 1
    assert keys_under(infra, registration.album_id, registration.photo_id) == []


def test_an_upload_that_finishes_after_the_deletion_and_its_purge_is_purged_again(
    infra: Infra, db: Engine
) -> None:
    # GIVEN a photo deleted while its browser was still uploading, and the sweep's purge done
    registration = register(infra, db)
    store = S3Store(infra.s3, BUCKET)
    assert uploads.delete(db, store, infra.settings, registration.photo_id, caller=uploads.BACKEND)
    with db.begin() as c:
        c.execute(update(deleted_photos).values(purge_after=func.now() - timedelta(seconds=1)))
    bootstrap.reset()
    assert handlers.load("sweep").lambda_handler({"source": "aws.events"}, _context())["deletedPurged"] == 1

    # WHEN the upload (a presigned POST is good until it expires) lands, and its event is delivered
    post(registration, JPEG)
    poll_until(infra, lambda: True).poll_once()
    assert keys_under(infra, registration.album_id, registration.photo_id) == [registration.key]

    # THEN the next purge, once no worker can hold the photo, deletes the original it left
    with db.begin() as c:
        purge_after = c.scalar(select(deleted_photos.c.purge_after))
        assert purge_after > c.scalar(select(func.now()))
        c.execute(update(deleted_photos).values(purge_after=func.now() - timedelta(seconds=1)))
    bootstrap.reset()
    assert handlers.load("sweep").lambda_handler({"source": "aws.events"}, _context())["deletedPurged"] == 1
    assert keys_under(infra, registration.album_id, registration.photo_id) == []


def _context() -> Any:
    from devkit.poller import LambdaContext

    return LambdaContext(timeout_seconds=60)


@pytest.mark.parametrize(
    "file_name",
    [
        "${filename}",
        "holiday-${filename}",
        "$${filename}}",
        "${",
        "a$\x00{filename}.jpg",
        "$\u202e{filename}",
        "${filename}" * 40,
        "x" * 250 + "${filename}",
        "ok.jpg",
        "Été ${x}.jpg",
    ],
)
def test_the_policy_binds_exactly_the_key_the_server_built(infra: Infra, db: Engine, file_name: str) -> None:
    # GIVEN a registration whose file name holds what S3 substitutes in a POST form (`${filename}`)
    registration = register(infra, db, file_name=file_name)

    # THEN the key holds no `${`, and the policy has only exact conditions on the key, no prefix
    assert "${" not in registration.key
    policy = json.loads(base64.b64decode(registration.fields["policy"]))
    on_key = [
        c
        for c in policy["conditions"]
        if (isinstance(c, dict) and "key" in c) or (isinstance(c, list) and c[1] == "$key")
    ]
    assert on_key and all(c in ({"key": registration.key}, ["eq", "$key", registration.key]) for c in on_key)
    assert registration.fields["key"] == registration.key


def test_two_users_racing_to_create_one_album_leave_one_owner(infra: Infra, db: Engine) -> None:
    # GIVEN photos' inserts held back, so that both registrations are inside their transactions
    album = uuid.uuid4()
    answers: dict[str, object] = {}

    def register_in(user: str) -> None:
        try:
            answers[user] = register(infra, db, album_id=album, caller=uploads.User(user))
        except uploads.Forbidden as forbidden:
            answers[user] = forbidden.reason

    with db.connect() as holder:
        GUARD.another_session(holder)  # the test's lock, not the code's: polling may go on under it
        holder.execute(text("LOCK TABLE photos IN SHARE MODE"))
        threads = [threading.Thread(target=register_in, args=(user,)) for user in ("alice", "bob")]
        for thread in threads:
            thread.start()

        # WHEN both wait: one for the photos' lock, the other for the first one's album row
        def both_waiting() -> bool:
            with db.connect() as c:
                waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                return bool(c.execute(text(waiting)).scalar_one() >= 2)

        poll_until(infra, both_waiting)
        holder.rollback()
    for thread in threads:
        thread.join(timeout=30)

    # THEN one owns the album and registered; the other is refused, and wrote nothing
    winner = next(user for user, answer in answers.items() if isinstance(answer, uploads.Registration))
    assert sorted(map(str, answers.values()))[0] == "ALBUM_FORBIDDEN" and len(answers) == 2
    with db.connect() as c:
        assert c.execute(text("SELECT id, owner FROM albums")).all() == [(album, winner)]
        assert c.execute(text("SELECT owner FROM photos")).scalars().all() == [winner]


def test_a_users_registration_needs_the_album_to_be_theirs_or_shared_and_the_backend_may_do_anything(
    infra: Infra, db: Engine
) -> None:
    # GIVEN alice's album
    album = uuid.uuid4()
    register(infra, db, album_id=album, caller=uploads.User("alice"))

    # THEN bob is refused, until the backend shares it; the backend registers into it at will
    with pytest.raises(uploads.Forbidden) as refused:
        register(infra, db, album_id=album, caller=uploads.User("bob"))
    assert refused.value.reason == "ALBUM_FORBIDDEN"
    register(infra, db, album_id=album, caller=uploads.BACKEND)
    uploads.share_album(db, album, "bob", caller=uploads.BACKEND)
    register(infra, db, album_id=album, caller=uploads.User("bob"))
    # AND only the backend shares, and only with a user id a token could carry
    with pytest.raises(uploads.Forbidden):
        uploads.share_album(db, album, "mallory", caller=uploads.User("alice"))
    with pytest.raises(uploads.Refused) as bad:
        uploads.share_album(db, album, "bob\x00", caller=uploads.BACKEND)
    assert bad.value.reason == "USER_ID_INVALID"
    with pytest.raises(ValueError):
        uploads.User("")
    # AND no value stands for the backend but BACKEND: a None is refused, never trusted
    for call in (
        lambda: register(infra, db, album_id=album, caller=None),
        lambda: uploads.status(db, uuid.uuid4(), caller=None),  # type: ignore[arg-type]
        lambda: uploads.delete(db, S3Store(infra.s3, BUCKET), infra.settings, "x", caller=None),  # type: ignore[arg-type]
    ):
        with pytest.raises(TypeError):
            call()
