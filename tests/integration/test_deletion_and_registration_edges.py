"""Deletion and registration at their edges, each case reproduced on real parts (PostgreSQL, moto's server, the
real handlers) before its fix: a deleted photo's dead letters, its retired variants' rows, its delete
markers; malformed registrations; the status of a photo given its attempts again; another user's
token behind a JWT authorizer."""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import requests
import yaml
from sqlalchemy import Engine, func, select, text

from devkit import gallery, handlers, samples
from devkit import uploads as dev_uploads
from devkit.poller import LambdaContext
from photo_publish import bootstrap, operator, uploads
from photo_publish.adapters.models import Photo, RetiredVariant
from photo_publish.adapters.queue import SqsQueue
from photo_publish.adapters.storage import S3Store
from photo_publish.keys import photo_prefixes
from tests.conftest import BUCKET, STAGE, Infra
from tests.faults import aws_fails
from tests.integration.test_backfill import sweep
from tests.letters import dead_letters
from tests.polling import poll_until
from tests.rows import job, published

# --- deletion ----------------------------------------------------------------------------------


def failed_for_good(fast: Infra, db: Engine) -> dev_uploads.Upload:
    """A photograph whose every read of its original fails: three attempts, then failed for good."""
    shot = dev_uploads.upload(
        db,
        fast.s3,
        BUCKET,
        STAGE,
        file_name="LadyBird.jpg",
        data=(samples.IMAGES / "LadyBird.jpg").read_bytes(),
    )
    poll_until(fast, lambda: job(db, shot.photo_id)[0] == "failed")
    return shot


def test_a_deleted_photos_dead_letter_is_removed_by_the_redrive(fast: Infra, db: Engine) -> None:
    """SPEC 16 (2): the DLQ holds a letter only for a photo that is failed. SPEC 17: deletion leaves
    nothing behind. Here the user deletes a finally-failed photo (the common thing to do with a
    broken tile); its letter stays in the DLQ (alarm > 0) and the operator's redrive refuses to
    remove it, calling it 'an upload the API never registered'."""
    with aws_fails(bootstrap.s3_client(), "GetObject"):
        shot = failed_for_good(fast, db)
    assert len(dead_letters(fast)) == 1

    # WHEN the user deletes the failed photo
    assert uploads.delete(db, S3Store(fast.s3, BUCKET), fast.settings, shot.photo_id, caller=uploads.BACKEND)

    # AND the operator redrives the DLQ, as the alarm's runbook says
    summary = operator.redrive(bootstrap.engine(), fast.sqs, fast.settings)
    print("redrive summary:", summary)
    attrs = fast.sqs.get_queue_attributes(
        QueueUrl=fast.queues.dead_letter_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    print("DLQ after the redrive:", attrs)
    # THEN (promise) no letter remains for a photo that no longer exists
    assert summary.left_in_queue == 0 and attrs == {
        "ApproximateNumberOfMessages": "0",
        "ApproximateNumberOfMessagesNotVisible": "0",
    }, "a deleted photo's dead letter stays in the DLQ; every redrive leaves it there"
    # AND a second redrive, after the letter's 300 s invisibility, would say the same (unknown photo)


def test_a_letter_the_sweep_sends_as_the_photo_is_deleted_is_removed_by_the_sweep(
    fast: Infra, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race the brief names: a final failure whose letter is owed (the DLQ refused it once), the
    sweep leases it, the user deletes the photo, the sweep sends it: a page for a deleted photo."""
    with aws_fails(bootstrap.s3_client(), "GetObject"), aws_fails(bootstrap.sqs_client(), "SendMessage"):
        shot = failed_for_good(fast, db)
    with db.connect() as c:
        owed = c.execute(
            text("select dead_letter_owed_at from photo_jobs where photo_id=:p"), {"p": shot.photo_id}
        ).scalar()
    print("letter owed since", owed)
    assert owed is not None and dead_letters(fast) == []
    # the lease has passed (the sender that was refused released it)
    with db.begin() as c:
        c.execute(
            text("update photo_jobs set dead_letter_owed_at = now() - interval '1 hour' where photo_id=:p"),
            {"p": shot.photo_id},
        )

    real = SqsQueue.send_dead_letter

    def deleted_meanwhile(self: SqsQueue, photo_id: UUID, *args: Any, **kw: Any) -> bool:
        # the user's DELETE commits while the sweep holds the letter
        assert uploads.delete(db, S3Store(fast.s3, BUCKET), fast.settings, photo_id, caller=uploads.BACKEND)
        return real(self, photo_id, *args, **kw)

    monkeypatch.setattr(SqsQueue, "send_dead_letter", deleted_meanwhile)
    bootstrap.reset()
    summary = sweep()
    print("sweep summary:", json.dumps(summary))
    left = dead_letters(fast)
    with db.connect() as c:
        assert c.scalar(select(func.count()).select_from(Photo)) == 0
    # THEN the letter on its way as the deletion committed landed, and the same run's sweep of the
    # dead-letter queue removed it (SPEC 19: letters follow the photo)
    assert left == [] and summary["lettersRemoved"] == 1
    # AND a redrive finds nothing to do
    redriven = operator.redrive(bootstrap.engine(), fast.sqs, fast.settings)
    assert (redriven.messages_removed, redriven.left_in_queue, redriven.photos) == (0, 0, [])


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


# --- the upload function ---------------------------------------------------------------------------


upload = handlers.load("upload")


def event(
    method: str, path: str, route: str, params: dict[str, str], body: str | None, *, b64: bool = False
) -> dict[str, Any]:
    """The request as API Gateway's HTTP API hands it over (payload 2.0, the gallery's stand-in)."""
    data = b"" if body is None else (base64.b64decode(body) if b64 else body.encode())
    answer = gallery.json_request(method, route, path, params, data)
    if body == "":
        answer["body"] = ""
    return answer


def register(body: str | None, b64: bool = False) -> dict[str, Any]:
    album = str(uuid.uuid4())
    return upload.lambda_handler(
        event(
            "POST", f"/albums/{album}/photos", "/albums/{albumId}/photos", {"albumId": album}, body, b64=b64
        ),
        LambdaContext(10, function_name="upload"),
    )


@pytest.mark.parametrize(
    ("body", "b64", "status"),
    [
        # a lone surrogate is valid JSON ("\ud800") but no UTF-8: cleaned away like a control
        ('{"fileName": "a\\ud800.jpg", "contentType": "image/jpeg", "size": 10}', False, 201),
        # a content type of the wrong JSON type: unhashable in `not in ACCEPTED_TYPES`
        ('{"fileName": "a.jpg", "contentType": ["image/jpeg"], "size": 10}', False, 400),
        ('{"fileName": "a.jpg", "contentType": {"x": 1}, "size": 10}', False, 400),
        # a base64 body that is not UTF-8 (API Gateway base64-encodes a binary body)
        (base64.b64encode(b"\xff\xfe{}").decode(), True, 400),
    ],
    ids=["lone-surrogate-file-name", "content-type-list", "content-type-object", "base64-not-utf8"],
)
def test_a_malformed_registration_is_answered_never_a_crash(
    infra: Infra, db: Engine, body: str, b64: bool, status: int
) -> None:
    """SPEC 17: bad requests get 400 with a reason (a crash is API Gateway's 500)."""
    answer = register(body, b64)
    assert answer["statusCode"] == status, answer
    with db.connect() as c:
        assert c.scalar(select(func.count()).select_from(Photo)) == (status == 201)
    if status == 400:
        assert json.loads(answer["body"])["reason"] in ("BODY_INVALID", "CONTENT_TYPE_UNSUPPORTED")
    else:
        assert json.loads(answer["body"])["key"].endswith("/a.jpg")


def call(
    method: str, path: str, route: str, params: dict[str, str], body: str | None = None
) -> dict[str, Any]:
    return upload.lambda_handler(
        event(method, path, route, params, body), LambdaContext(10, function_name="upload")
    )


@pytest.mark.parametrize(
    "body, status",
    [
        (None, 400),
        ("", 400),
        ("[]", 400),
        ("nul", 400),
        ('"x"', 400),
        ('{"fileName": "..", "contentType": "image/jpeg"}', 400),
        ('{"fileName": "a.jpg", "contentType": "image/jpeg", "size": "10"}', 400),
        ('{"fileName": "a.jpg", "contentType": "image/jpeg", "size": true}', 400),
        ('{"fileName": "a.jpg", "contentType": "image/jpeg", "size": 1e400}', 400),
        ('{"fileName": "a.jpg", "contentType": "image/svg+xml"}', 400),
        ('{"fileName": "a.jpg", "contentType": "image/jpeg", "size": 104857601}', 400),
        ('{"fileName": "' + "\u00e9" * 300 + '.jpeg", "contentType": "image/jpeg"}', 201),
        # a right-to-left override (shown as "exe.jpg") is a format character: cleaned away
        ('{"fileName": "\u202egpj.exe", "contentType": "image/jpeg"}', 201),
    ],
)
def test_a_registration_is_refused_or_cleaned(
    infra: Infra, db: Engine, body: str | None, status: int
) -> None:
    answer = register(body)
    assert answer["statusCode"] == status, answer
    if status == 201:
        name = json.loads(answer["body"])["key"].rsplit("/", 1)[1]
        assert len(name.encode()) <= 255
        assert "\u202e" not in name


def test_an_unknown_photo_or_route_is_404(infra: Infra, db: Engine) -> None:
    for method in ("GET", "DELETE"):
        for pid in (str(uuid.uuid4()), "nonsense", str(uuid.uuid4()).upper()):
            a = call(method, f"/photos/{pid}", "/photos/{photoId}", {"photoId": pid})
            assert a["statusCode"] == 404, (method, pid, a)
    a = call("PUT", "/photos/x", "/photos/{photoId}", {"photoId": "x"})
    assert a["statusCode"] == 404


def _with_jwt(e: dict[str, Any], sub: str) -> dict[str, Any]:
    e["requestContext"]["authorizer"] = {"jwt": {"claims": {"sub": sub, "aud": "app"}, "scopes": None}}
    e["headers"]["authorization"] = f"Bearer token-of-{sub}"
    return e


def test_behind_a_jwt_authorizer_only_the_user_who_registered_a_photo_reads_or_deletes_it(
    infra: Infra, db: Engine
) -> None:
    """SPEC 17, who may call: behind a JWT authorizer the function is called with end users' tokens,
    and a photo's id is in every URL of its variants: seeing an image must not be enough to delete
    it. The token's subject that registered a photo owns it."""
    album = str(uuid.uuid4())
    body = '{"fileName": "alice.jpg", "contentType": "image/jpeg"}'
    e = event("POST", f"/albums/{album}/photos", "/albums/{albumId}/photos", {"albumId": album}, body)
    made = upload.lambda_handler(_with_jwt(e, "alice"), LambdaContext(10, function_name="upload"))
    assert made["statusCode"] == 201
    photo = json.loads(made["body"])["photoId"]

    def as_user(method: str, sub: str) -> int:
        e = event(method, f"/photos/{photo}", "/photos/{photoId}", {"photoId": photo}, None)
        answer: dict[str, Any] = upload.lambda_handler(
            _with_jwt(e, sub), LambdaContext(10, function_name="upload")
        )
        return int(answer["statusCode"])

    # another user's token is answered as for an unknown photo, and changes nothing
    assert (as_user("GET", "mallory"), as_user("DELETE", "mallory")) == (404, 404)
    assert as_user("GET", "alice") == 200
    # the owner's deletion goes through; the app's backend (AWS_IAM, no token) may delete any photo
    assert as_user("DELETE", "alice") == 204
    again = uploads.register(
        db,
        infra.s3,
        infra.settings,
        album_id=album,
        file_name="b.jpg",
        content_type="image/jpeg",
        caller=uploads.User("alice"),
    )
    assert (
        call("DELETE", f"/photos/{again.photo_id}", "/photos/{photoId}", {"photoId": str(again.photo_id)})[
            "statusCode"
        ]
        == 204
    )


# --- status ---------------------------------------------------------------------------------------


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


# --- what outlives a deletion ---------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_multi_constructor("!", lambda loader, suffix, node: None)


def test_a_deleted_photos_delete_markers_expire_with_its_versions(infra: Infra, db: Engine) -> None:
    """SPEC 17: 'the copies that outlive a deletion ... are said, with their retention as
    parameters'. The template's bucket is versioned; the deletion (S3Store.delete_under, a plain
    DeleteObject) leaves a delete marker per key, whose key is the user's cleaned file name. The
    lifecycle has NoncurrentVersionExpiration only: per AWS (ManagingDelMarkers), an expired object
    delete marker is removed only when the configuration expires current versions or sets
    ExpiredObjectDeleteMarker. Neither is set, so the markers (file names) stay for ever."""
    rules = yaml.load(Path("template.yaml").read_text(), Loader=_Loader)["Resources"]["PhotoBucket"][
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


def test_the_roles_that_list_the_bucket_list_only_a_photos_prefixes() -> None:
    """Issue 22 item 4, least privilege: the upload and sweep functions list the bucket only to find
    a deleted photo's objects, so their s3:ListBucket is held to the originals' and variants' keys
    (the process function's, for a missing original's 404, has no prefix to hold it to)."""
    resources = yaml.load(Path("template.yaml").read_text(), Loader=_Loader)["Resources"]
    listing = {}
    for name in ("UploadRole", "SweepRole"):
        for policy in resources[name]["Properties"]["Policies"]:
            for statement in policy["PolicyDocument"]["Statement"]:
                if isinstance(statement, dict) and statement.get("Action") == "s3:ListBucket":
                    listing[name] = statement.get("Condition", {}).get("StringLike", {}).get("s3:prefix")
    assert set(listing) == {"UploadRole", "SweepRole"}
    assert all(prefixes is not None and len(prefixes) == 2 for prefixes in listing.values()), listing
