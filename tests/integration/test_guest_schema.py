"""A guest in a shared database (SPEC 17): the project's tables in a schema of their own, its own
Alembic version table beside an app's, and the functions running as a runtime role that has the
statements they use and no DDL. On a database of its own on the test server, with an app already in
it: its own `photos` table and its own Alembic history in `public`."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import requests
from alembic import command
from psycopg.errors import InsufficientPrivilege
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.exc import ProgrammingError

from devkit import handlers, samples, stack
from devkit.poller import LambdaContext
from photo_publish import bootstrap, migrate, uploads
from photo_publish.adapters.database import create_database_engine, sqlalchemy_url
from photo_publish.adapters.storage import S3Store
from photo_publish.migrate import RuntimeRole
from tests.conftest import BUCKET, Infra
from tests.polling import poll_until
from tests.rows import scalar_at

SCHEMA = "photo_publish_guest"
TABLES = {
    "photos",
    "photo_jobs",
    "photo_variants",
    "outbox_events",
    "retired_variants",
    "deleted_photos",
    "variant_recipes",
    "albums",
    "album_members",
    "cdn_invalidations",
}


@dataclass
class Shared:
    owner_url: str  # the owner's login: what the migrate function holds
    runtime_url: str  # the runtime role's: what the other functions hold
    role: RuntimeRole


@pytest.fixture
def shared(database_url: str) -> Iterator[Shared]:
    """A database with an app in it: its own `photos` and its own Alembic history."""
    server = make_url(sqlalchemy_url(database_url))
    name, role = (
        f"shared_{uuid.uuid4().hex[:10]}",
        RuntimeRole(f"runtime_{uuid.uuid4().hex[:10]}", "a-secret"),
    )
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE DATABASE {name}")
    owner = server.set(database=name)
    app = create_engine(owner)
    with app.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE photos (id serial PRIMARY KEY, caption text)")
        connection.exec_driver_sql("CREATE TABLE photos_app (id serial PRIMARY KEY, owner_email text)")
        connection.exec_driver_sql("CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)")
        connection.exec_driver_sql("INSERT INTO alembic_version VALUES ('app_0042')")
    app.dispose()
    runtime = owner.set(username=role.name, password=role.password)
    try:
        yield Shared(
            owner.render_as_string(hide_password=False), runtime.render_as_string(hide_password=False), role
        )
    finally:
        bootstrap.reset()
        with admin.connect() as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            connection.exec_driver_sql(f"DROP ROLE IF EXISTS {role.name}")
        admin.dispose()


def test_the_migrations_keep_to_their_schema_and_their_history(shared: Shared) -> None:
    # WHEN the project's migrations run twice in the app's database
    for _ in range(2):
        assert migrate.upgrade(shared.owner_url, schema=SCHEMA, runtime_role=shared.role) == migrate.head()

    # THEN its tables are in its schema, its history in its own table there
    tables = scalar_at(
        shared.owner_url,
        "SELECT array_agg(table_name::text) FROM information_schema.tables WHERE table_schema = :s",
        s=SCHEMA,
    )
    assert set(tables) == TABLES | {migrate.VERSION_TABLE}
    assert (
        scalar_at(shared.owner_url, f"SELECT version_num FROM {SCHEMA}.{migrate.VERSION_TABLE}")
        == migrate.head()
    )
    # AND the app's table and history are as the app left them
    assert scalar_at(shared.owner_url, "SELECT version_num FROM public.alembic_version") == "app_0042"
    columns = scalar_at(
        shared.owner_url,
        "SELECT array_agg(column_name::text ORDER BY ordinal_position) FROM information_schema.columns"
        " WHERE table_schema = 'public' AND table_name = 'photos'",
    )
    assert columns == ["id", "caption"]


def test_the_runtime_role_runs_the_whole_flow_and_no_ddl(shared: Shared, infra: Infra) -> None:
    # GIVEN the schema migrated, and the functions configured as the runtime role
    migrate.upgrade(shared.owner_url, schema=SCHEMA, runtime_role=shared.role)
    bus = stack.subscribe(stack.events_client(), infra.sqs, f"photo-publish-{uuid.uuid4().hex[:10]}")
    settings = infra.configure(database_url=shared.runtime_url, db_schema=SCHEMA, event_bus_name=bus.bus_name)
    engine = create_database_engine(settings)

    # WHEN a photo is registered, posted, processed, swept, relayed and deleted
    registration = uploads.register(
        engine,
        bootstrap.s3_client(),
        settings,
        album_id=uuid.uuid4(),
        file_name="g.jpg",
        content_type="image/jpeg",
        caller=uploads.BACKEND,
    )
    data = (samples.IMAGES / "Garden.jpg").read_bytes()
    form = requests.post(
        registration.url, data=registration.fields, files={"file": ("g.jpg", data)}, timeout=30
    )
    assert form.ok
    poll_until(
        infra,
        lambda: (
            (uploads.status(engine, registration.photo_id, caller=uploads.BACKEND) or {}).get("state")
            == "published"
        ),
    )
    context = LambdaContext(timeout_seconds=60)
    assert handlers.load("sweep").lambda_handler({"source": "aws.events"}, context)["errors"] == 0
    handlers.load("relay").lambda_handler({"source": "aws.events"}, context)
    assert uploads.delete(
        engine, S3Store(infra.s3, BUCKET), settings, registration.photo_id, caller=uploads.BACKEND
    )
    handlers.load("relay").lambda_handler({"source": "aws.events"}, context)
    events = [e["detail-type"] for e in stack.received(infra.sqs, bus.queue_url)]
    assert sorted(events) == ["photo.deleted", "photo.published"]

    # THEN it all ran as the runtime role, which can change rows but not the schema
    with engine.connect() as connection:
        assert connection.scalar(text("SELECT current_user")) == shared.role.name
    for ddl in (
        f"CREATE TABLE {SCHEMA}.intruder (a int)",
        f"DROP TABLE {SCHEMA}.photos",
        f"TRUNCATE {SCHEMA}.photo_jobs",
        f"ALTER TABLE {SCHEMA}.photos ADD COLUMN intruder int",
        f"SELECT * FROM {SCHEMA}.{migrate.VERSION_TABLE}",
        "CREATE TABLE public.intruder (a int)",
    ):
        with engine.connect() as connection, pytest.raises(ProgrammingError) as refused:
            connection.exec_driver_sql(ddl)
        assert isinstance(refused.value.orig, InsufficientPrivilege), ddl
    engine.dispose()


def test_a_deployment_from_before_takes_its_history_over_from_alembics_default_table(
    shared: Shared, database_url: str
) -> None:
    # GIVEN a database migrated when the history lived in `alembic_version` (and no app's did)
    fresh = shared.owner_url
    engine = create_engine(sqlalchemy_url(fresh))
    with engine.begin() as connection:
        connection.exec_driver_sql("DROP TABLE photos, alembic_version")
    engine.dispose()
    migrate.upgrade(fresh)
    # (Down to 0009 by the migrations' own downgrades: whatever later ones add is gone again.)
    command.downgrade(migrate.config(fresh), "0009")
    engine = create_engine(sqlalchemy_url(fresh))
    with engine.begin() as connection:
        connection.exec_driver_sql(f"ALTER TABLE {migrate.VERSION_TABLE} RENAME TO alembic_version")
    engine.dispose()

    # WHEN the migrations run
    migrate.upgrade(fresh)

    # THEN they carried on from its revision, in a table of their own
    assert scalar_at(fresh, f"SELECT version_num FROM {migrate.VERSION_TABLE}") == migrate.head()
    assert scalar_at(fresh, "SELECT to_regclass('alembic_version') IS NULL") is True
    assert (
        scalar_at(
            fresh,
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_schema = 'public' AND table_name = 'photos' AND column_name = 'owner'",
        )
        == 1
    )


def test_the_runtime_role_gets_only_the_projects_tables_when_they_share_public(shared: Shared) -> None:
    """With no DB_SCHEMA (an existing deployment in `public`), the app's own tables there stay the
    app's: the grants name the project's tables, never all of a schema's."""
    owner = create_engine(sqlalchemy_url(shared.owner_url))
    with owner.begin() as connection:  # (in `public`, the app's table may not be named as one of ours)
        connection.exec_driver_sql("DROP TABLE photos")
    owner.dispose()
    migrate.upgrade(shared.owner_url, runtime_role=shared.role)
    runtime = create_engine(sqlalchemy_url(shared.runtime_url))
    with runtime.connect() as connection:
        assert connection.scalar(text("SELECT count(*) FROM photo_jobs")) == 0
    for statement in ("SELECT * FROM public.photos_app", "UPDATE alembic_version SET version_num = 'x'"):
        with runtime.connect() as connection, pytest.raises(ProgrammingError) as refused:
            connection.exec_driver_sql(statement)
        assert isinstance(refused.value.orig, InsufficientPrivilege), statement
    runtime.dispose()


def test_the_runtime_roles_password_never_travels_in_a_statement(shared: Shared) -> None:
    """Its SCRAM verifier is made on the client: a failed ALTER ROLE (logged with its statement, by
    the server and in the error) shows no password."""
    migrate.upgrade(shared.owner_url, schema=SCHEMA, runtime_role=shared.role)
    stored = scalar_at(
        shared.owner_url, "SELECT rolpassword FROM pg_authid WHERE rolname = :n", n=shared.role.name
    )
    assert stored.startswith("SCRAM-SHA-256$") and shared.role.password not in stored

    # WHEN another session holds the role (its own ALTER ROLE, uncommitted) and the run times out
    holder = create_engine(sqlalchemy_url(shared.owner_url))
    with holder.connect() as connection:
        connection.exec_driver_sql(f'ALTER ROLE "{shared.role.name}" CONNECTION LIMIT 10')
        with pytest.raises(Exception) as failed:
            migrate.upgrade(
                shared.owner_url, schema=SCHEMA, runtime_role=shared.role, lock_timeout_seconds=0.5
            )
        connection.rollback()
    holder.dispose()

    # THEN the error names the statement, never the password
    assert "ALTER ROLE" in str(failed.value) and shared.role.password not in str(failed.value)
