"""The local stack: PostgreSQL, S3, SQS and EventBridge on loopback, and the wiring between them.

Every embedded default yields to its setting (SPEC 10): DATABASE_URL names a database to use
instead of an embedded one, AWS_ENDPOINT_URL (or _S3 / _SQS / _EVENTBRIDGE) an endpoint instead of
moto's server.
LOCALSTACK=1 (set by scripts/localstack) says that endpoint is LocalStack: it must answer, and
devkit's own clients come from localstack-client.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parent.parent
# pgserver asks platformdirs for a runtime folder that root shells often lack; the fallback is fine.
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR", module="platformdirs")
REGION = "us-east-1"


@dataclass(frozen=True)
class Queues:
    url: str
    arn: str
    dead_letter_url: str
    dead_letter_arn: str


@dataclass(frozen=True)
class Subscriber:
    """An event bus and a consumer of it: a rule for the relay's events, to a queue."""

    bus_name: str
    bus_arn: str
    queue_url: str


def migrate(database_url: str) -> None:
    """Apply the migrations (what `make migrate` runs), in DB_SCHEMA when one is set."""
    from photo_publish import migrate as migrations

    migrations.upgrade(database_url, schema=os.environ.get("DB_SCHEMA") or None)


@contextmanager
def database(data_dir: Path, name: str = "photos", *, keep: bool = True) -> Iterator[str]:
    """A database URL: DATABASE_URL's server, or an embedded PostgreSQL in `data_dir` (pgserver)."""
    base = os.environ.get("DATABASE_URL")
    server = None
    if not base:
        import pgserver

        data_dir.mkdir(parents=True, exist_ok=True)
        server = pgserver.get_server(data_dir, cleanup_mode="stop")
        base = server.get_uri()
    from photo_publish.adapters.database import sqlalchemy_url

    admin = create_engine(sqlalchemy_url(base), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = sqlalchemy_url(base).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        if not keep:
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()
        if server is not None:
            server.cleanup()


def localstack() -> bool:
    """LOCALSTACK=1: the AWS endpoint is LocalStack (explicit, so a port number decides nothing)."""
    return os.environ.get("LOCALSTACK", "").strip().lower() in ("1", "true", "yes")


def localstack_endpoint() -> str:
    """LocalStack's endpoint: AWS_ENDPOINT_URL, else LOCALSTACK_HOST, else localhost:4566."""
    from localstack_client import config

    endpoint = config.get_service_endpoint("sqs")
    assert endpoint is not None
    return endpoint.rstrip("/")


def check_localstack(endpoint: str, services: tuple[str, ...] = ("s3", "sqs")) -> None:
    """Raise unless LocalStack answers at `endpoint` with `services` available."""
    import urllib.request

    url = f"{endpoint}/_localstack/health"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            health = json.load(response).get("services", {})
    except (OSError, ValueError) as error:
        raise RuntimeError(f"LOCALSTACK=1 but LocalStack does not answer at {url}: {error}") from None
    missing = {s: health.get(s) for s in services if health.get(s) not in ("available", "running")}
    if missing:
        raise RuntimeError(f"LocalStack at {endpoint} lacks services {missing} (SERVICES=s3,sqs?)")


def endpoint_named() -> bool:
    """The environment names an AWS endpoint (moto's or another's) for the clients to use."""
    names = (
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_ENDPOINT_URL_SQS",
        "AWS_ENDPOINT_URL_EVENTBRIDGE",
    )
    return any(os.environ.get(name) for name in names)


@contextmanager
def aws_endpoint() -> Iterator[None]:
    """moto's server on loopback, unless AWS_ENDPOINT_URL(_S3/_SQS) already names an endpoint.

    With LOCALSTACK=1 the endpoint is LocalStack's, which must answer: it is never replaced by moto.
    """
    os.environ.setdefault("AWS_DEFAULT_REGION", REGION)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    if localstack():
        endpoint = localstack_endpoint()
        check_localstack(endpoint)
        # The functions use plain boto3, as in Lambda: they find LocalStack through AWS_ENDPOINT_URL.
        added = "AWS_ENDPOINT_URL" not in os.environ
        os.environ.setdefault("AWS_ENDPOINT_URL", endpoint)
        try:
            yield
        finally:
            if added:
                os.environ.pop("AWS_ENDPOINT_URL", None)
        return
    if endpoint_named():
        yield
        return
    from moto.server import ThreadedMotoServer

    # One line per HTTP request would bury the demo's own output.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ["AWS_ENDPOINT_URL"] = f"http://{host}:{port}"
    try:
        yield
    finally:
        server.stop()
        del os.environ["AWS_ENDPOINT_URL"]


def create_queues(sqs: Any, name: str, *, max_receive_count: int, visibility_timeout: int) -> Queues:
    """The process queue and its dead-letter queue, wired by a redrive policy as the template does."""
    dead_url = sqs.create_queue(QueueName=f"{name}-dlq", Attributes={"MessageRetentionPeriod": "1209600"})[
        "QueueUrl"
    ]
    dead_arn = sqs.get_queue_attributes(QueueUrl=dead_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    redrive = {"deadLetterTargetArn": dead_arn, "maxReceiveCount": str(max_receive_count)}
    url = sqs.create_queue(
        QueueName=name,
        Attributes={"RedrivePolicy": json.dumps(redrive), "VisibilityTimeout": str(visibility_timeout)},
    )["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return Queues(url, arn, dead_url, dead_arn)


def create_bucket(s3: Any, bucket: str, *, queue_arn: str, originals_prefix: str) -> None:
    s3.create_bucket(Bucket=bucket)
    notify(s3, bucket, queue_arn=queue_arn, originals_prefix=originals_prefix)


def notify(s3: Any, bucket: str, *, queue_arn: str, originals_prefix: str) -> None:
    """New originals, and only they, notify the queue (variants are written to the same bucket)."""
    s3.put_bucket_notification_configuration(
        Bucket=bucket,
        NotificationConfiguration={
            "QueueConfigurations": [
                {
                    "QueueArn": queue_arn,
                    "Events": ["s3:ObjectCreated:*"],
                    "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": originals_prefix}]}},
                }
            ]
        },
    )


def drop_test_events(sqs: Any, queue_url: str) -> None:
    """S3 sends an s3:TestEvent when a notification is configured: start from an empty queue."""
    while messages := sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get(
        "Messages"
    ):
        for message in messages:
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])


def subscribe(events: Any, sqs: Any, name: str, *, source: str = "photo-publish") -> Subscriber:
    """A custom bus `name`, as the template creates it, and what a consuming service would add: a
    rule matching the relay's events (by their Source) that sends them to a queue of its own."""
    bus_arn = events.create_event_bus(Name=name)["EventBusArn"]
    queue_url = sqs.create_queue(QueueName=f"{name}-subscriber")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    rule_arn = events.put_rule(
        Name=f"{name}-subscriber", EventBusName=name, EventPattern=json.dumps({"source": [source]})
    )["RuleArn"]
    # EventBridge may send to the queue only from that rule (AWS checks it; the emulators need not).
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "events.amazonaws.com"},
                "Action": "sqs:SendMessage",
                "Resource": queue_arn,
                "Condition": {"ArnEquals": {"aws:SourceArn": rule_arn}},
            }
        ],
    }
    sqs.set_queue_attributes(QueueUrl=queue_url, Attributes={"Policy": json.dumps(policy)})
    events.put_targets(
        Rule=f"{name}-subscriber", EventBusName=name, Targets=[{"Id": "subscriber", "Arn": queue_arn}]
    )
    return Subscriber(name, bus_arn, queue_url)


def received(sqs: Any, queue_url: str) -> list[dict[str, Any]]:
    """The EventBridge events the subscriber's queue holds, in the order it gives them; deleted."""
    found: list[dict[str, Any]] = []
    while messages := sqs.receive_message(
        QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0, VisibilityTimeout=60
    ).get("Messages"):
        found.extend(json.loads(m["Body"]) for m in messages)
        sqs.delete_message_batch(
            QueueUrl=queue_url,
            Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)],
        )
    return found


def events_client() -> Any:
    """An EventBridge client for devkit and the tests (the functions build their own, with boto3)."""
    if localstack():
        from localstack_client.session import Session

        session = Session(
            aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "test"),
            aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "test"),
            region_name=os.environ.get("AWS_DEFAULT_REGION", REGION),
        )
        return session.client("events")
    return boto3.client("events")


def clients() -> tuple[Any, Any]:
    """S3 and SQS clients for devkit and the tests (the functions build their own, with boto3)."""
    if localstack():
        from localstack_client.session import Session

        # The functions' credentials: LocalStack derives the account from the access key id.
        session = Session(
            aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "test"),
            aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "test"),
            region_name=os.environ.get("AWS_DEFAULT_REGION", REGION),
        )
        return session.client("s3"), session.client("sqs")
    return boto3.client("s3"), boto3.client("sqs")
