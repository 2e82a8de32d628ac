"""The database's credentials from Secrets Manager (moto's server), and their rotation under a warm
container, against a PostgreSQL of this test's own that checks passwords."""

from __future__ import annotations

import json
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from sqlalchemy import text

from photo_publish import bootstrap
from tests.conftest import Infra


@pytest.fixture(scope="module")
def password_server() -> Iterator[tuple[object, Path]]:
    """An embedded PostgreSQL whose role `rotating` logs in with a password (scram), on its socket."""
    import pgserver

    # Outside pytest's basetemp, which a later pytest session on the machine may delete.
    folder = tempfile.TemporaryDirectory(prefix="photo-publish-pg-password-")
    data = Path(folder.name)
    server = pgserver.get_server(data, cleanup_mode="stop")
    server.psql("CREATE ROLE rotating LOGIN PASSWORD 'first';")
    hba = data / "pg_hba.conf"
    hba.write_text("local all rotating scram-sha-256\n" + hba.read_text())
    server.psql("SELECT pg_reload_conf();")
    yield server, data
    server.cleanup()
    folder.cleanup()


def test_a_rotated_password_is_read_again_and_new_connections_log_in(
    infra: Infra, password_server: tuple[object, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a warm container connected with the secret's password (DB_SECRET_ARN + DB_HOST)
    server, socket_dir = password_server
    secrets = boto3.client("secretsmanager")
    arn = secrets.create_secret(
        Name=f"photo-publish-db-{uuid.uuid4().hex[:8]}",
        SecretString=json.dumps({"username": "rotating", "password": "first", "dbname": "postgres"}),
    )["ARN"]
    monkeypatch.delenv("DATABASE_URL")
    infra.configure(database_url=None, db_secret_arn=arn, db_host=str(socket_dir))
    engine = bootstrap.engine()
    with engine.connect() as connection:
        assert connection.scalar(text("SELECT current_user")) == "rotating"

    # WHEN Secrets Manager rotates the password (the database's, then the secret's), and the pool's
    # connections are gone (recycled, or closed by the server) so the container must log in again
    server.psql("ALTER ROLE rotating PASSWORD 'second';")  # type: ignore[attr-defined]
    secrets.put_secret_value(
        SecretId=arn,
        SecretString=json.dumps({"username": "rotating", "password": "second", "dbname": "postgres"}),
    )
    engine.dispose()

    # THEN the failed login reads the secret again and the new connection succeeds, on the same engine
    with engine.connect() as connection:
        assert connection.scalar(text("SELECT current_user")) == "rotating"
    assert bootstrap.engine() is engine
