"""A PostgreSQL that a function container on the host's network reaches: TCP on loopback.

DATABASE_URL's server when it is set (a TCP address); otherwise pgserver's own PostgreSQL (the
embedded one of `make test`), started on 127.0.0.1 and a free port instead of pgserver's Unix
socket, which a container does not share.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import make_url


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def server(data_dir: Path) -> Iterator[str]:
    """A server URL (database `postgres`); an embedded server is stopped on exit."""
    given = os.environ.get("DATABASE_URL")
    if given:
        host = make_url(given).host or ""
        if host in ("", "localhost") or host.startswith("/"):
            raise RuntimeError(
                f"DATABASE_URL must name a TCP address a container can reach, such as 127.0.0.1 (has {host!r})"
            )
        yield given
        return

    # pgserver's own building blocks (its server listens on a Unix socket only): its commands are
    # made at import, one per binary of its PostgreSQL.
    from pgserver import _commands
    from pgserver._commands import POSTGRES_BIN_PATH
    from pgserver.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

    shutil.rmtree(data_dir, ignore_errors=True)
    pgdata = data_dir / "pgdata"
    pgdata.mkdir(parents=True)
    user = None
    if os.geteuid() == 0:
        # PostgreSQL refuses to run as root: pgserver's way, a system user of its own.
        user = "pgserver"
        entry = ensure_user_exists(user)
        assert entry is not None
        ensure_prefix_permissions(pgdata)
        ensure_prefix_permissions(POSTGRES_BIN_PATH)
        ensure_folder_permissions(POSTGRES_BIN_PATH, 0o555)
        ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", 0o444)
        for path in (data_dir, pgdata):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    initdb, pg_ctl = _commands.initdb, _commands.pg_ctl  # type: ignore[attr-defined]
    initdb(["--auth=trust", "--encoding=utf8", "-U", "postgres"], pgdata=pgdata, user=user)
    port = free_port()
    options = f"-h 127.0.0.1 -p {port} -k {data_dir}"
    pg_ctl(
        ["-w", "-o", options, "-l", str(data_dir / "postgres.log"), "start"],
        pgdata=pgdata,
        user=user,
        timeout=60,
    )
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user, timeout=60)
