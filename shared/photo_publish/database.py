"""The engine: one small pool per container, READ COMMITTED pinned, RDS Proxy friendly."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sqlalchemy import URL, Engine, create_engine, make_url

from photo_publish.settings import Settings


def sqlalchemy_url(url: str | URL) -> URL:
    """A plain `postgresql://` URL (as pgserver, psql and most tools print it) driven by psycopg 3."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def url_from_secret(secret_string: str, settings: Settings) -> URL:
    """The URL for an RDS-style secret (username, password, and optionally host, port, dbname)."""
    secret = json.loads(secret_string)
    return URL.create(
        "postgresql+psycopg",
        username=secret["username"],
        password=secret["password"],
        host=settings.db_host or secret.get("host"),
        port=int(secret.get("port") or 5432),
        database=secret.get("dbname") or settings.db_name,
        query={"sslmode": "require"},
    )


def create_database_engine(settings: Settings, read_secret: Callable[[str], str] | None = None) -> Engine:
    if settings.database_url:
        url = sqlalchemy_url(settings.database_url)
    elif read_secret is not None and settings.db_secret_arn:
        url = url_from_secret(read_secret(settings.db_secret_arn), settings)
    else:
        raise ValueError("no database configured")
    connect_args: dict[str, Any] = {"connect_timeout": 5, "application_name": "photo-publish"}
    if not settings.db_prepare_statements:
        connect_args["prepare_threshold"] = None
    return create_engine(
        url,
        # Pinned, not inherited: the conditional updates rely on READ COMMITTED's re-check of the
        # WHERE clause after a concurrent commit.
        isolation_level="READ COMMITTED",
        pool_size=settings.record_concurrency,
        max_overflow=0,
        pool_pre_ping=True,
        # A frozen Lambda container wakes with connections the proxy or server may have closed.
        pool_recycle=240,
        connect_args=connect_args,
    )
