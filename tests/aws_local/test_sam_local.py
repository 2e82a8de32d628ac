"""`sam local invoke` of the built functions with the shipped events, in Lambda containers.

Each invoke is SAM's own: the built template, its layers at /opt, python3.12 in the image SAM
builds on the python3.12 base image, awslambdaric talking to the emulator, on the host's network
(awslocal.sam) against LocalStack's S3 and SQS and PostgreSQL on loopback. The assertions read
the database and the bucket, not only the function's answer.
"""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus, unquote_plus

import pytest
from sqlalchemy import Engine, create_engine, func, insert, make_url, select, text
from sqlalchemy.orm import Session

from awslocal import sockets
from devkit import samples
from photo_publish import migrate
from photo_publish.adapters.database import sqlalchemy_url
from photo_publish.adapters.models import OutboxEvent, Photo, PhotoJob, PhotoVariant
from photo_publish.image import ladder
from photo_publish.keys import ladder_kind
from photo_publish.settings import Settings
from tests.aws_local.conftest import (
    EVENTS,
    LOCAL_ENV,
    ROOT,
    Invocation,
    client,
    function_environment,
    sam_local_invoke,
)
from tests.cfn_responses import response_url

pytestmark = pytest.mark.aws_local

BUCKET = LOCAL_ENV["PHOTO_BUCKET"]
STAGE = LOCAL_ENV["STAGE"]


def shipped(name: str) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS / f"{name}.json").read_text())
    return event


def notified_key(event: dict[str, Any]) -> str:
    """The object key of an SQS-wrapped S3 notification, decoded as S3 encodes it."""
    body = json.loads(event["Records"][0]["body"])
    return unquote_plus(body["Records"][0]["s3"]["object"]["key"])


def register(engine: Engine, key: str) -> str:
    """What the upload API writes for an original at `key`: the photo row and its job row."""
    album_id, photo_id = key.split("/")[3], key.split("/")[4]
    with engine.begin() as connection:
        connection.execute(insert(Photo).values(id=photo_id, album_id=album_id, original_key=key))
        connection.execute(insert(PhotoJob).values(photo_id=photo_id))
    return photo_id


def upload(key: str, data: bytes, bucket: str = BUCKET) -> None:
    client("s3").put_object(Bucket=bucket, Key=key, Body=data)


def notification_for(key: str, tmp_path: Path, data: bytes) -> Path:
    """The shipped S3 notification event, for another original: its key encoded as S3 does, the
    eTag of its bytes (the function reads the upload the event names)."""
    event = shipped("process-s3-notification")
    body = json.loads(event["Records"][0]["body"])
    body["Records"][0]["s3"]["object"]["key"] = quote_plus(key, safe="/")
    body["Records"][0]["s3"]["object"]["eTag"] = hashlib.md5(data).hexdigest()
    event["Records"][0]["body"] = json.dumps(body)
    event["Records"][0]["messageId"] = str(uuid.uuid4())
    path = tmp_path / "event.json"
    path.write_text(json.dumps(event))
    return path


def assert_published(engine: Engine, photo_id: str, invocation: Invocation) -> None:
    assert_published_in(engine, photo_id, invocation, bucket=BUCKET, stage=STAGE)


def assert_published_in(
    engine: Engine, photo_id: str, invocation: Invocation, *, bucket: str, stage: str
) -> None:
    """The photo is ready with its variants in the bucket, one outbox event, its job done."""
    assert invocation.result == {"batchItemFailures": []}, invocation.output[-3000:]
    (line,) = invocation.lines("photo processed")
    assert line["outcome"] == "published", line
    with Session(engine) as connection:
        photo = connection.execute(select(Photo).where(Photo.id == photo_id)).scalar_one()
        job = connection.execute(select(PhotoJob).where(PhotoJob.photo_id == photo_id)).scalar_one()
        variants = (
            connection.execute(select(PhotoVariant).where(PhotoVariant.photo_id == photo_id)).scalars().all()
        )
        events = connection.scalar(
            select(func.count()).select_from(OutboxEvent).where(OutboxEvent.aggregate_id == photo_id)
        )
    assert (photo.processing_state, photo.visibility, photo.entity_version) == ("ready", "published", 2)
    assert job.status == "done"
    assert events == 1
    # thumb, browse and the default ladder's steps up to the browse's own long edge, in WebP
    browse = next(v for v in variants if v.kind == "browse")
    steps = ladder.steps(
        Settings.__dataclass_fields__["variant_widths"].default, max(browse.width, browse.height)
    )
    assert sorted(v.kind for v in variants) == sorted(
        ["browse", "thumb", *(ladder_kind(s, "webp") for s in steps)]
    )
    s3 = client("s3")
    for variant in variants:
        head = s3.head_object(Bucket=bucket, Key=variant.storage_key)
        assert head["ContentType"] == "image/webp"
        assert head["ContentLength"] == variant.bytes > 0
        assert variant.storage_key.startswith(f"{stage}/albums/{photo.album_id}/variants/{photo_id}/")


# What env/local.json gives the migrate function alone: no runtime role's secret, locally.
MIGRATE = json.loads((ROOT / "env" / "local.json").read_text())["MigrateFunction"]


@pytest.fixture(scope="module")
def environment(database_url: str, aws_local: str, local_resources: None) -> dict[str, str]:
    return function_environment(database_url, aws_local)


@pytest.fixture(scope="module")
def published(
    engine: Engine, environment: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Invocation]:
    """The shipped S3 notification (a key with spaces and a plus), invoked once for the module."""
    event = EVENTS / "process-s3-notification.json"
    key = notified_key(shipped("process-s3-notification"))
    assert " " in key and "+" in key  # what the event is for: S3's form encoding, decoded once
    photo_id = register(engine, key)
    upload(key, (samples.IMAGES / "Wood.jpg").read_bytes())
    return photo_id, sam_local_invoke(
        "ProcessFunction", event, environment, tmp_path_factory.mktemp("invoke")
    )


def test_the_shipped_s3_notification_publishes_the_photo(
    engine: Engine, published: tuple[str, Invocation]
) -> None:
    photo_id, invocation = published
    assert_published(engine, photo_id, invocation)
    # the function ran as Lambda's python3.12 runtime does (awslambdaric, /var/task, layers at /opt)
    assert "REPORT RequestId" in invocation.output


def test_the_shipped_job_message_answers_already(
    engine: Engine, published: tuple[str, Invocation], environment: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN the photo the shipped events name, published by the notification
    photo_id, _ = published
    # WHEN the shipped job message for it is invoked
    invocation = sam_local_invoke(
        "ProcessFunction", EVENTS / "process-job-message.json", environment, tmp_path
    )
    # THEN it answers `already`: no new event, no version bump
    assert invocation.result == {"batchItemFailures": []}
    (line,) = invocation.lines("photo processed")
    assert line["outcome"] == "already", line
    with Session(engine) as connection:
        photo = connection.execute(select(Photo).where(Photo.id == photo_id)).scalar_one()
        events = connection.scalar(
            select(func.count()).select_from(OutboxEvent).where(OutboxEvent.aggregate_id == photo_id)
        )
    assert (photo.entity_version, events) == (2, 1)


def new_key(name: str) -> str:
    return f"{STAGE}/originals/albums/{uuid.uuid4()}/{uuid.uuid4()}/{name}"


def test_a_truncated_jpeg_fails_with_its_code(
    engine: Engine, environment: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN a registered upload whose bytes stop half-way
    key = new_key("Broken upload.jpg")
    photo_id = register(engine, key)
    data = samples.truncated((samples.IMAGES / "Wood.jpg").read_bytes())
    upload(key, data)
    # WHEN its notification is invoked
    invocation = sam_local_invoke(
        "ProcessFunction", notification_for(key, tmp_path, data), environment, tmp_path
    )
    # THEN a permanent failure: acknowledged, recorded with its code, no variant written
    assert invocation.result == {"batchItemFailures": []}
    with Session(engine) as connection:
        photo = connection.execute(select(Photo).where(Photo.id == photo_id)).scalar_one()
        job = connection.execute(select(PhotoJob).where(PhotoJob.photo_id == photo_id)).scalar_one()
    assert (photo.processing_state, photo.error_code) == ("processing_failed", "DECODE_FAILED")
    assert (job.status, job.last_error_code) == ("failed", "DECODE_FAILED")
    listed = client("s3").list_objects_v2(Bucket=BUCKET, Prefix=f"{STAGE}/albums/{photo.album_id}/")
    assert listed["KeyCount"] == 0


def test_an_iphone_heic_publishes_with_pi_heif_from_the_layer(
    engine: Engine, environment: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN an iPhone-style HEIC (HEVC, Display P3, stored sideways with irot and EXIF 6)
    key = new_key("IMG_0001.HEIC")
    photo_id = register(engine, key)
    upright = samples.photograph("Wood.jpg")
    data = samples.heic(upright, 6, profile="p3")
    upload(key, data)
    # WHEN its notification is invoked
    invocation = sam_local_invoke(
        "ProcessFunction", notification_for(key, tmp_path, data), environment, tmp_path
    )
    # THEN the layer's pi-heif decoded it inside the container: published, upright
    assert_published(engine, photo_id, invocation)
    with Session(engine) as connection:
        photo = connection.execute(select(Photo).where(Photo.id == photo_id)).scalar_one()
    assert (photo.width, photo.height) == (upright.width, upright.height)


def test_the_sweep_resends_a_due_row(engine: Engine, environment: dict[str, str], tmp_path: Path) -> None:
    # GIVEN an upload whose message was lost: its job pending for 20 minutes
    key = new_key("Lost message.jpg")
    photo_id = register(engine, key)
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE photo_jobs SET created_at = now() - interval '20 minutes' WHERE photo_id = :id"),
            {"id": photo_id},
        )
    sqs = client("sqs")
    queue_url = environment["PROCESS_QUEUE_URL"]
    sqs.purge_queue(QueueUrl=queue_url)
    # WHEN the shipped scheduled event invokes the sweep
    invocation = sam_local_invoke("SweepFunction", EVENTS / "sweep-scheduled.json", environment, tmp_path)
    # THEN it re-sent that row: a job message on the queue, the row stamped
    assert invocation.result["resentPending"] == 1, invocation.output[-3000:]
    received = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=5)
    bodies = [json.loads(m["Body"]) for m in received.get("Messages", [])]
    assert {"photoId": photo_id} in bodies or any(b.get("photoId") == photo_id for b in bodies), bodies
    with Session(engine) as connection:
        job = connection.execute(select(PhotoJob).where(PhotoJob.photo_id == photo_id)).scalar_one()
    assert job.status == "pending" and job.enqueued_at is not None


def container_of(pid: int) -> str | None:
    """The Docker container a process runs in, from its cgroup (None: not in one)."""
    try:
        cgroups = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    for line in cgroups.splitlines():
        if "/docker/" in line:
            return line.rsplit("/docker/", 1)[1].split("/")[0][:64]
    return None


def test_the_function_container_is_on_the_host_network_and_listens_on_loopback_only(
    environment: dict[str, str], tmp_path: Path
) -> None:
    import docker

    # GIVEN a watcher of SAM's function containers and of what processes in containers listen on
    before = sockets.listeners()
    containers: dict[str, dict[str, Any]] = {}
    listening: dict[sockets.Listener, str] = {}
    stop = threading.Event()
    engine_client = docker.from_env()

    def watch() -> None:
        while not stop.is_set():
            for container in engine_client.containers.list(
                filters={"label": "sam.cli.container.type=lambda"}
            ):
                containers[container.id] = container.attrs
            for listener in sockets.listeners() - before - set(listening):
                holder = sockets.owner(listener)
                container = container_of(holder) if holder is not None else None
                if container is not None:
                    listening[listener] = container
            stop.wait(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    # WHEN a function is invoked
    try:
        invocation = sam_local_invoke("SweepFunction", EVENTS / "sweep-scheduled.json", environment, tmp_path)
    finally:
        stop.set()
        watcher.join()
    assert "resentPending" in invocation.result
    # THEN its container was in the host's network, with no port published through Docker...
    assert containers, "no function container was seen"
    for attrs in containers.values():
        assert attrs["HostConfig"]["NetworkMode"] == "host"
        assert not attrs["HostConfig"].get("PortBindings")
    # ...and what listened in it (the emulator, the Runtime API) listened on loopback alone
    assert {container[:12] for container in listening.values()} <= {c[:12] for c in containers}
    assert len(listening) >= 2, sorted(map(str, listening))
    assert all(listener.loopback for listener in listening), sorted(map(str, listening))


# --- the migrate function (SPEC 11, 17) -------------------------------------------------------


@pytest.fixture
def fresh_database(database_url: str) -> Iterator[str]:
    """A new, empty database on the test server (which the function container reaches on loopback)."""
    server = make_url(database_url)
    name = f"migrate_{uuid.uuid4().hex[:10]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE DATABASE {name}")
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.dispose()


def custom_resource_event(kind: str, response_url: str, tmp_path: Path) -> Path:
    event = {
        "RequestType": kind,
        "ServiceToken": "arn:aws:lambda:us-east-1:000000000000:function:photo-publish-dev-migrate",
        "ResponseURL": response_url,
        "StackId": "arn:aws:cloudformation:us-east-1:000000000000:stack/photo-publish-dev/1f2e",
        "RequestId": str(uuid.uuid4()),
        "LogicalResourceId": "Migrations",
        "ResourceType": "Custom::Migrations",
        "ResourceProperties": {"Head": migrate.head(), "Stage": STAGE},
    }
    path = tmp_path / f"custom-resource-{uuid.uuid4().hex[:8]}.json"
    path.write_text(json.dumps(event))
    return path


def test_the_migrate_function_migrates_a_fresh_database_to_head_when_invoked_directly(
    fresh_database: str, environment: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN a fresh database and the function told to use a schema of its own
    env = environment | MIGRATE | {"DATABASE_URL": fresh_database, "DB_SCHEMA": "photo_publish"}
    # WHEN the shipped direct event ({}) is invoked, as `aws lambda invoke` would
    invocation = sam_local_invoke("MigrateFunction", EVENTS / "migrate-direct.json", env, tmp_path)
    # THEN the schema is at head, in its schema, with alembic and mako from the function's own package
    assert invocation.result == {"revision": migrate.head()}, invocation.output[-3000:]
    engine = create_engine(sqlalchemy_url(fresh_database))
    with engine.connect() as connection:
        version = connection.scalar(text(f"SELECT version_num FROM photo_publish.{migrate.VERSION_TABLE}"))
    engine.dispose()
    assert version == migrate.head()


def test_the_migrate_function_answers_cloudformation_success_and_failed_at_the_response_url(
    fresh_database: str, environment: dict[str, str], tmp_path: Path
) -> None:
    with response_url() as answers:
        # WHEN a Create comes for a database that answers, then for one that refuses (nothing on port 1)
        env = environment | MIGRATE | {"DATABASE_URL": fresh_database, "DB_SCHEMA": "photo_publish"}
        sam_local_invoke(
            "MigrateFunction", custom_resource_event("Create", answers.url("ok"), tmp_path), env, tmp_path
        )
        refused = (
            environment | MIGRATE | {"DATABASE_URL": "postgresql://owner:Sup3rS3cret@127.0.0.1:1/photos"}
        )
        failing = sam_local_invoke(
            "MigrateFunction",
            custom_resource_event("Create", answers.url("refused"), tmp_path),
            refused,
            tmp_path,
        )
        ok, failed = answers.wait(2)
    # THEN each PUT its answer from inside the container: SUCCESS with the revision, FAILED at once
    assert ok.path.startswith("/cfn/ok?") and ok.headers.get("Content-Type") == ""
    assert ok.body["Status"] == "SUCCESS" and ok.body["Data"] == {"Revision": migrate.head()}
    assert ok.body["PhysicalResourceId"] == f"photo-publish-migrations-{STAGE}"
    assert failed.path.startswith("/cfn/refused?")
    assert failed.body["Status"] == "FAILED" and "OperationalError" in failed.body["Reason"]
    assert "Sup3rS3cret" not in json.dumps(failed.body)
    assert failing.seconds < 60  # the container's start included; the connection fails in under 10 s
