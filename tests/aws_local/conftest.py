"""`make test-aws-local`: the built functions in Lambda containers, and the stack in LocalStack.

scripts/aws-local starts Docker and LocalStack (with AWS_LOCAL=1 and AWS_ENDPOINT_URL set) and
`make build` has built `.aws-sam/build`; this folder starts PostgreSQL on loopback (or uses
DATABASE_URL) and runs `sam local invoke` (awslocal.sam: host network) and `sam deploy`. Without
AWS_LOCAL=1 these tests skip (`make test` deselects them); with it, a missing part fails them.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from sqlalchemy import Engine, create_engine, text

from awslocal import postgres
from devkit import stack
from photo_publish.adapters.database import sqlalchemy_url

ROOT = Path(__file__).resolve().parents[2]
TOOLS_PYTHON = ROOT / ".venv-tools" / "bin" / "python"
BUILT_TEMPLATE = ROOT / ".aws-sam" / "build" / "template.yaml"
EVENTS = ROOT / "events"
LOCAL_ENV = json.loads((ROOT / "env" / "local.json").read_text())["Parameters"]
REGION = "us-east-1"
# The template's parameters for `sam local` (samconfig.toml's, but the database on loopback).
LOCAL_PARAMETERS = (
    "SamLocal=true Stage=dev Architecture=x86_64 "
    "DbSecretArn=arn:aws:secretsmanager:us-east-1:000000000000:secret:local DbHost=127.0.0.1"
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "aws_local: needs Docker and LocalStack (make test-aws-local)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.aws_local)


@pytest.fixture(scope="session", autouse=True)
def aws_local() -> str:
    """LocalStack's endpoint; the parts scripts/aws-local and `make build` provide, checked."""
    if os.environ.get("AWS_LOCAL") != "1":
        pytest.skip(
            "sam local invoke and sam deploy: run `make test-aws-local` (scripts/aws-local sets AWS_LOCAL=1)"
        )
    problems = []
    if not BUILT_TEMPLATE.exists():
        problems.append(f"{BUILT_TEMPLATE} is missing: `make build` first")
    if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode != 0:
        problems.append(f"Docker does not answer (DOCKER_HOST={os.environ.get('DOCKER_HOST')})")
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
    try:
        stack.check_localstack(endpoint)
    except RuntimeError as error:
        problems.append(str(error))
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)
    return endpoint


def client(service: str) -> Any:
    return boto3.client(service, region_name=REGION, endpoint_url=os.environ["AWS_ENDPOINT_URL"])


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A migrated database on a TCP address on loopback, which the function containers reach (its
    data outside pytest's basetemp, which a later pytest session on the machine may delete)."""
    with (
        tempfile.TemporaryDirectory(prefix="photo-publish-aws-local-pg-") as data,
        postgres.server(Path(data)) as server,
    ):
        name = f"photo_aws_local_{os.getpid()}"
        admin = create_engine(sqlalchemy_url(server), isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        url = sqlalchemy_url(server).set(database=name).render_as_string(hide_password=False)
        stack.migrate(url)
        try:
            yield url
        finally:
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_engine(sqlalchemy_url(database_url))
    yield engine
    engine.dispose()


@dataclass(frozen=True)
class Invocation:
    function: str
    result: Any
    logs: list[dict[str, Any]]
    seconds: float
    output: str

    def lines(self, message: str) -> list[dict[str, Any]]:
        return [line for line in self.logs if line.get("message") == message]


def _json_lines(text: str) -> list[dict[str, Any]]:
    found = []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return found


def sam_local_invoke(
    function: str, event: Path, env_vars: dict[str, str], tmp_path: Path, *, timeout: float = 300
) -> Invocation:
    """`sam local invoke FUNCTION -e EVENT` as a user runs it, on the host network (awslocal.sam)."""
    env_file = tmp_path / f"env-{uuid.uuid4().hex[:8]}.json"
    env_file.write_text(json.dumps({"Parameters": env_vars}))
    command = [
        str(TOOLS_PYTHON), "-m", "awslocal.sam", "local", "invoke", function,
        "--template-file", str(BUILT_TEMPLATE), "--event", str(event), "--env-vars", str(env_file),
        "--parameter-overrides", LOCAL_PARAMETERS, "--docker-network", "host", "--skip-pull-image",
    ]  # fmt: skip
    environment = os.environ | {
        "PYTHONPATH": str(ROOT),
        "SAM_CLI_TELEMETRY": "0",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": REGION,
    }
    started = time.monotonic()
    done = subprocess.run(
        command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=timeout, check=False
    )
    seconds = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    result_lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert result_lines, output[-4000:]
    return Invocation(function, json.loads(result_lines[-1]), _json_lines(done.stderr), seconds, output)


def function_environment(database_url: str, endpoint: str, **overrides: str) -> dict[str, str]:
    """env/local.json's variables, pointed at this run's LocalStack and PostgreSQL on loopback."""
    values = dict(LOCAL_ENV)
    values.update(
        DATABASE_URL=database_url,
        AWS_ENDPOINT_URL=endpoint,
        AWS_ENDPOINT_URL_S3=endpoint,
        AWS_ENDPOINT_URL_SQS=endpoint,
        POWERTOOLS_LOG_LEVEL="INFO",
    )
    for variable in ("PROCESS_QUEUE_URL", "DEAD_LETTER_QUEUE_URL"):
        if variable not in overrides:  # env/local.json's queue, in this LocalStack
            name = queue_name(LOCAL_ENV[variable])
            values[variable] = client("sqs").get_queue_url(QueueName=name)["QueueUrl"]
    values.update(overrides)
    return values


def queue_name(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


@pytest.fixture(scope="session")
def local_resources(aws_local: str) -> None:
    """What docker-compose.yml's `setup` makes, in this LocalStack: the bucket, the two queues and the
    event bus."""
    s3, sqs = client("s3"), client("sqs")
    client("events").create_event_bus(Name=LOCAL_ENV["EVENT_BUS_NAME"])
    s3.create_bucket(Bucket=LOCAL_ENV["PHOTO_BUCKET"])
    dead = sqs.create_queue(
        QueueName=queue_name(LOCAL_ENV["DEAD_LETTER_QUEUE_URL"]),
        Attributes={"MessageRetentionPeriod": "1209600"},
    )["QueueUrl"]
    dead_arn = sqs.get_queue_attributes(QueueUrl=dead, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sqs.create_queue(
        QueueName=queue_name(LOCAL_ENV["PROCESS_QUEUE_URL"]),
        Attributes={
            "VisibilityTimeout": "720",
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dead_arn, "maxReceiveCount": "5"}),
        },
    )
