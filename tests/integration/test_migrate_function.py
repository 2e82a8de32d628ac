"""The migrate function's handler (functions/migrate/app.py) in-process, as CloudFormation and an
operator call it: a real PostgreSQL (a fresh database of its own), the owner's and the runtime
role's secrets in Secrets Manager (moto's server), and CloudFormation's response URL stood in for
by an HTTP server on loopback that records the PUT."""

from __future__ import annotations

import json
import shutil
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from alembic import command
from sqlalchemy import Engine, create_engine, make_url, text

from devkit import handlers
from devkit.poller import LambdaContext
from photo_publish import migrate
from photo_publish.adapters.database import sqlalchemy_url
from tests.cfn_responses import Put, ResponseUrl, response_url
from tests.conftest import STAGE, Infra
from tests.rows import scalar_at

# The project's newest migration: a test's own step goes after it.
HEAD = migrate.head()

SCHEMA = "photo_publish"


@dataclass
class Database:
    name: str
    url: str  # the owner's
    runtime_role: str
    owner_secret: str
    runtime_secret: str


def _secret(value: dict[str, Any]) -> str:
    arn: str = boto3.client("secretsmanager").create_secret(
        Name=f"photo-publish-db-{uuid.uuid4().hex[:10]}", SecretString=json.dumps(value)
    )["ARN"]
    return arn


@pytest.fixture
def fresh(database_url: str, infra: Infra, monkeypatch: pytest.MonkeyPatch) -> Iterator[Database]:
    """A new, empty database on the test server; the function configured as the template does it:
    DB_SECRET_ARN the owner's secret (with DB_HOST), DB_RUNTIME_SECRET_ARN the runtime role's."""
    server = make_url(sqlalchemy_url(database_url))
    name, role = f"migrate_{uuid.uuid4().hex[:10]}", f"runtime_{uuid.uuid4().hex[:10]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE DATABASE {name}")
        # The server's socket, whichever way the tests reach it: a login built from a secret takes
        # TLS over TCP (DB_SSLMODE), which a local server does not offer.
        sockets = connection.exec_driver_sql("SHOW unix_socket_directories").scalar() or ""
    owner = _secret({"username": server.username, "password": server.password or "", "dbname": name})
    runtime = _secret({"username": role, "password": "Gen3ratedWithoutPunctuation"})
    monkeypatch.delenv("DATABASE_URL", raising=False)
    infra.configure(
        database_url=None,
        db_secret_arn=owner,
        db_host=server.query.get("host") or sockets.split(",")[0].strip(),
        db_runtime_secret_arn=runtime,
        db_schema=SCHEMA,
    )
    try:
        yield Database(
            name, server.set(database=name).render_as_string(hide_password=False), role, owner, runtime
        )
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            connection.exec_driver_sql(f"DROP ROLE IF EXISTS {role}")
        admin.dispose()


def request(kind: str, url: str, **extra: Any) -> dict[str, Any]:
    return {
        "RequestType": kind,
        "ServiceToken": "arn:aws:lambda:us-east-1:000000000000:function:photo-publish-dev-migrate",
        "ResponseURL": url,
        "StackId": "arn:aws:cloudformation:us-east-1:000000000000:stack/photo-publish-dev/1f2e",
        "RequestId": str(uuid.uuid4()),
        "LogicalResourceId": "Migrations",
        "ResourceType": "Custom::Migrations",
        "ResourceProperties": {"ServiceToken": "arn:...", "Head": migrate.head(), "Stage": STAGE},
        **extra,
    }


def context(seconds: float = 120) -> LambdaContext:
    return LambdaContext(
        timeout_seconds=seconds,
        function_name="photo-publish-dev-migrate",
        log_group_name="/aws/lambda/photo-publish-dev-migrate",
        log_stream_name="2026/12/03/[$LATEST]0123abcd",
    )


@pytest.fixture
def answers() -> Iterator[ResponseUrl]:
    with response_url() as server:
        yield server


def test_a_direct_invocation_migrates_a_fresh_database_to_head_and_again_changes_nothing(
    fresh: Database,
) -> None:
    app = handlers.load("migrate")
    # WHEN the function is invoked with {} (aws lambda invoke), twice
    first = app.lambda_handler({}, context())
    second = app.lambda_handler({}, context())

    # THEN the schema is at head, in DB_SCHEMA, with one history row
    assert first == second == {"revision": migrate.head()}
    assert scalar_at(fresh.url, f"SELECT array_agg(version_num) FROM {SCHEMA}.{migrate.VERSION_TABLE}") == [
        migrate.head()
    ]
    assert scalar_at(fresh.url, "SELECT to_regclass('public.photos') IS NULL") is True
    # AND the runtime role of its secret logs in with that secret's password and has only row rights
    assert scalar_at(fresh.url, "SELECT rolcanlogin FROM pg_roles WHERE rolname = :r", r=fresh.runtime_role)
    assert scalar_at(
        fresh.url, "SELECT rolpassword IS NOT NULL FROM pg_authid WHERE rolname = :r", r=fresh.runtime_role
    )
    privileges = scalar_at(
        fresh.url,
        "SELECT array_agg(DISTINCT privilege_type::text) FROM information_schema.role_table_grants"
        " WHERE grantee = :r AND table_schema = :s",
        r=fresh.runtime_role,
        s=SCHEMA,
    )
    assert set(privileges) == {"SELECT", "INSERT", "UPDATE", "DELETE"}


def test_a_create_request_answers_success_with_the_revision_at_the_response_url(
    fresh: Database, answers: ResponseUrl
) -> None:
    # WHEN CloudFormation's Create, then an Update of the same head, are handled
    app = handlers.load("migrate")
    created = app.lambda_handler(request("Create", answers.url("create")), context())
    app.lambda_handler(
        request("Update", answers.url("update"), PhysicalResourceId=created["PhysicalResourceId"]), context()
    )

    # THEN each was PUT to its URL: SUCCESS, the head in Data, the same physical id both times
    create, update = answers.wait(2)
    assert create.path.startswith("/cfn/create?X-Amz-Algorithm=")
    assert create.headers.get("Content-Type") == ""
    assert create.body == created
    assert create.body["Status"] == update.body["Status"] == "SUCCESS"
    assert create.body["Data"] == update.body["Data"] == {"Revision": migrate.head()}
    assert (
        create.body["PhysicalResourceId"]
        == update.body["PhysicalResourceId"]
        == f"photo-publish-migrations-{STAGE}"
    )
    assert create.body["LogicalResourceId"] == "Migrations"
    assert scalar_at(fresh.url, f"SELECT version_num FROM {SCHEMA}.{migrate.VERSION_TABLE}") == migrate.head()


def test_a_database_that_refuses_is_answered_failed_within_seconds(
    fresh: Database, infra: Infra, answers: ResponseUrl
) -> None:
    # GIVEN an owner's secret for a port nothing listens on
    infra.configure(
        db_secret_arn=_secret(
            {"username": "owner", "password": "Sup3rS3cret", "dbname": fresh.name, "port": 1}
        ),
        db_host="127.0.0.1",
    )
    # WHEN CloudFormation's Create is handled
    started = time.monotonic()
    handlers.load("migrate").lambda_handler(request("Create", answers.url()), context())

    # THEN FAILED, at once, saying why and where the log is, and never the password
    (put,) = answers.wait()
    assert time.monotonic() - started < 15
    assert put.body["Status"] == "FAILED"
    assert "OperationalError" in put.body["Reason"] and "127.0.0.1" in put.body["Reason"]
    assert "[$LATEST]0123abcd" in put.body["Reason"]
    assert "Sup3rS3cret" not in json.dumps(put.body)
    assert put.body["PhysicalResourceId"] == f"photo-publish-migrations-{STAGE}"


def test_delete_answers_success_and_touches_nothing(
    fresh: Database, infra: Infra, answers: ResponseUrl
) -> None:
    # GIVEN a migrated database, and a configuration that could not even connect
    handlers.load("migrate").lambda_handler({}, context())
    infra.configure(db_host="127.0.0.1", db_secret_arn=_secret({"username": "x", "password": "y", "port": 1}))
    # WHEN the stack is deleted
    handlers.load("migrate").lambda_handler(
        request("Delete", answers.url(), PhysicalResourceId=f"photo-publish-migrations-{STAGE}"), context()
    )
    # THEN SUCCESS, and the data is all there
    (put,) = answers.wait()
    assert put.body["Status"] == "SUCCESS"
    assert scalar_at(fresh.url, f"SELECT to_regclass('{SCHEMA}.photos') IS NOT NULL") is True


def test_migrations_that_wait_past_the_functions_time_are_answered_failed_before_its_timeout(
    fresh: Database, answers: ResponseUrl
) -> None:
    # GIVEN another migration run holding the migrations' lock
    holder = create_engine(sqlalchemy_url(fresh.url))
    with holder.connect() as connection:
        connection.exec_driver_sql("BEGIN")
        connection.exec_driver_sql("SELECT pg_advisory_xact_lock(7012943)")
        # WHEN CloudFormation's Create comes to a function with 20 s left (10 kept to answer, 6 to
        # stop a run: 4 to migrate, which a busy machine's set-up does not use up)
        started = time.monotonic()
        handlers.load("migrate").lambda_handler(request("Create", answers.url()), context(20))
        (put,) = answers.wait()
        elapsed = time.monotonic() - started
        connection.exec_driver_sql("ROLLBACK")
    holder.dispose()
    # THEN FAILED, with time to spare
    assert elapsed < 8
    assert put.body["Status"] == "FAILED" and "not finished within" in put.body["Reason"]


def test_a_deployment_from_before_db_schema_is_not_forked_into_an_empty_schema(
    fresh: Database, infra: Infra, answers: ResponseUrl
) -> None:
    # GIVEN a database whose project tables are in the search path's schema (no DB_SCHEMA then)
    migrate.upgrade(fresh.url)
    # WHEN the stack, now with DbSchema set, is updated
    handlers.load("migrate").lambda_handler(request("Update", answers.url()), context())
    # THEN FAILED, saying what to set; no second copy of the tables
    (put,) = answers.wait()
    assert put.body["Status"] == "FAILED"
    assert "DB_SCHEMA" in put.body["Reason"] and "empty copy" in put.body["Reason"]
    assert scalar_at(fresh.url, "SELECT to_regnamespace(:s) IS NULL", s=SCHEMA) is True


def _others(observer: Engine, database: str, *, besides: int) -> tuple[list[str], int]:
    """The states of the database's client sessions other than the observer's and `besides`, and
    how many hold the migrations' advisory lock."""
    with observer.connect() as connection:
        states = connection.scalars(
            text(
                "SELECT state FROM pg_stat_activity WHERE datname = :db AND backend_type = 'client backend'"
                " AND pid NOT IN (pg_backend_pid(), :besides) ORDER BY pid"
            ),
            {"db": database, "besides": besides},
        ).all()
        locks = connection.scalar(
            text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 7012943"
                " AND database = (SELECT oid FROM pg_database WHERE datname = :db)"
            ),
            {"db": database},
        )
    return [str(state) for state in states], int(locks or 0)


def test_a_migration_past_its_deadline_is_rolled_back_and_its_locks_released_before_failed_is_answered(
    fresh: Database, answers: ResponseUrl
) -> None:
    # GIVEN a database at 0011, and a function's open read of photos (its ACCESS SHARE lock), so
    # that 0012's ALTER TABLE photos waits for it
    command.upgrade(migrate.config(fresh.url, schema=SCHEMA), "0011")
    reader = create_engine(sqlalchemy_url(fresh.url))
    observer = create_engine(sqlalchemy_url(fresh.url), isolation_level="AUTOCOMMIT")
    at_the_answer: list[tuple[list[str], int]] = []
    with reader.connect() as connection:
        connection.exec_driver_sql(f"SELECT count(*) FROM {SCHEMA}.photos")
        reading = int(connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())

        def look(_put: Put) -> None:
            at_the_answer.append(_others(observer, fresh.name, besides=reading))

        answers.on_put = look
        # WHEN CloudFormation's Create comes to a function with 20 s left (10 kept to answer, 6 to
        # stop a run: 4 to migrate, which a busy machine's set-up does not use up)
        handlers.load("migrate").lambda_handler(request("Create", answers.url()), context(20))
        (put,) = answers.wait()
        # ... and then the reader commits
        connection.rollback()
    reader.dispose()

    # THEN FAILED, and while it was being sent no session of the migration was left (none
    # running, none idle in its transaction) and nobody held the migrations' lock
    assert put.body["Status"] == "FAILED" and "not finished within" in put.body["Reason"]
    assert at_the_answer == [([], 0)]
    # AND with the lock free, nothing of the migration commits later: the schema is still at 0011
    deadline = time.monotonic() + 30
    while _others(observer, fresh.name, besides=reading) != ([], 0) and time.monotonic() < deadline:
        time.sleep(0.1)
    observer.dispose()
    assert scalar_at(fresh.url, f"SELECT version_num FROM {SCHEMA}.{migrate.VERSION_TABLE}") == "0011"
    assert scalar_at(fresh.url, f"SELECT to_regclass('{SCHEMA}.albums') IS NULL") is True


def assert_nothing_of_9999_committed(fresh: Database, table: str) -> None:
    """The database is still at the project's head, without the table the test's step made."""
    assert scalar_at(fresh.url, f"SELECT version_num FROM {SCHEMA}.{migrate.VERSION_TABLE}") == HEAD
    assert scalar_at(fresh.url, f"SELECT to_regclass('{SCHEMA}.{table}') IS NULL") is True


def with_a_migration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, upgrade: str) -> None:
    """The project's migrations and one more after them (9999, whose upgrade() is `upgrade`), in a
    test-only script directory the function migrates from."""
    scripts = tmp_path / "migrations"
    shutil.copytree(migrate.SCRIPTS, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    (scripts / "versions" / "9999_test_step.py").write_text(
        f'import time\n\nfrom alembic import op\n\nrevision = "9999"\ndown_revision = "{HEAD}"\n'
        "branch_labels = None\ndepends_on = None\n\n\ndef upgrade() -> None:\n"
        + textwrap.indent(textwrap.dedent(upgrade).strip(), "    ")
        + "\n"
    )
    monkeypatch.setattr(migrate, "SCRIPTS", scripts)


def test_a_migration_that_ignores_its_cancel_has_its_session_ended_before_failed_is_answered(
    fresh: Database, answers: ResponseUrl, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a database at the head, and a migration 9999 whose statement swallows every cancel
    command.upgrade(migrate.config(fresh.url, schema=SCHEMA), HEAD)
    with_a_migration(
        tmp_path,
        monkeypatch,
        """
        op.execute("CREATE TABLE stubborn (id int)")
        op.execute(
            "DO $$ BEGIN LOOP BEGIN PERFORM pg_sleep(60);"
            " EXCEPTION WHEN query_canceled THEN NULL; END; END LOOP; END $$"
        )
        """,
    )
    observer = create_engine(sqlalchemy_url(fresh.url), isolation_level="AUTOCOMMIT")
    at_the_answer: list[tuple[list[str], int]] = []
    answers.on_put = lambda _put: at_the_answer.append(_others(observer, fresh.name, besides=0))

    # WHEN CloudFormation's Create comes to a function with 20 s left (4 to migrate)
    handlers.load("migrate").lambda_handler(request("Create", answers.url()), context(20))
    (put,) = answers.wait()

    # THEN FAILED, saying the server ended the run's session; when it was sent, no session of the
    # run was left and the migrations' lock was free; nothing of 9999 was committed
    assert put.body["Status"] == "FAILED" and "pg_terminate_backend" in put.body["Reason"]
    assert at_the_answer == [([], 0)]
    observer.dispose()
    assert_nothing_of_9999_committed(fresh, "stubborn")


def test_a_migration_stopped_between_two_statements_sends_no_other(
    fresh: Database, answers: ResponseUrl, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a database at the head, a sequence (whose nextval no rollback undoes), and a migration 9999
    # that pauses on the client between two statements past the function's deadline
    command.upgrade(migrate.config(fresh.url, schema=SCHEMA), HEAD)
    owner = create_engine(sqlalchemy_url(fresh.url))
    with owner.begin() as connection:
        connection.exec_driver_sql("CREATE SEQUENCE public.probe")
    owner.dispose()
    with_a_migration(
        tmp_path,
        monkeypatch,
        """
        op.execute("CREATE TABLE paused (id int)")
        time.sleep(6)
        op.execute("SELECT nextval('public.probe')")
        """,
    )

    # WHEN CloudFormation's Create comes to a function with 20 s left (4 to migrate)
    handlers.load("migrate").lambda_handler(request("Create", answers.url()), context(20))
    (put,) = answers.wait()

    # THEN FAILED; the statement after the pause never reached the server, and nothing committed
    assert put.body["Status"] == "FAILED" and "not finished within" in put.body["Reason"]
    assert scalar_at(fresh.url, "SELECT is_called FROM public.probe") is False
    assert_nothing_of_9999_committed(fresh, "paused")


def test_a_migration_whose_client_goes_quiet_in_its_transaction_is_ended_by_the_server(
    fresh: Database, answers: ResponseUrl, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a database at the head, a migration 9999 whose client stops between two statements (as a
    # container frozen mid-run does), and an idle-in-transaction timeout of half a second
    command.upgrade(migrate.config(fresh.url, schema=SCHEMA), HEAD)
    with_a_migration(
        tmp_path,
        monkeypatch,
        """
        op.execute("CREATE TABLE quiet (id int)")
        time.sleep(3)
        op.execute("CREATE TABLE after_the_pause (id int)")
        """,
    )
    monkeypatch.setattr(migrate, "IDLE_IN_TRANSACTION_SECONDS", 0.5)

    # WHEN CloudFormation's Create comes with all the time it needs
    handlers.load("migrate").lambda_handler(request("Create", answers.url()), context())
    (put,) = answers.wait()

    # THEN the server ended the quiet session (its locks with it) and rolled it back: FAILED, and
    # nothing of 9999 committed
    assert put.body["Status"] == "FAILED" and "idle-in-transaction timeout" in put.body["Reason"]
    assert_nothing_of_9999_committed(fresh, "quiet")
