"""Real parts for every test: PostgreSQL (embedded, or DATABASE_URL), moto's server over HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

# The functions read these at import, as in Lambda; X-Ray has no daemon here.
os.environ.setdefault("POWERTOOLS_SERVICE_NAME", "photo-publish")
os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "PhotoPublishTest")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
os.environ.setdefault("MALLOC_ARENA_MAX", "2")

from devkit import stack
from photo_publish import bootstrap
from photo_publish.adapters.database import create_database_engine
from photo_publish.settings import Settings
from tests.network_guard import GUARD

# Before any engine or client exists: every one the tests or the code make is watched.
GUARD.install()

EVENTS = Path(__file__).parent / "events"
STAGE = "dev"
BUCKET = "photo-publish-test"
TABLES = (
    "photos, photo_variants, photo_jobs, outbox_events, variant_recipes, retired_variants, deleted_photos,"
    " albums, album_members, cdn_invalidations"
)


@pytest.fixture(autouse=True)
def no_network_in_transaction() -> Iterator[None]:
    """Every test fails if an AWS call was made while its thread had a database transaction open
    (SPEC 19), even one the code under test caught: tests/network_guard.py."""
    with GUARD.checking() as violations:
        yield
    if violations:
        pytest.fail("\n\n".join(str(v) for v in violations), pytrace=False)


def load_event(name: str) -> dict[str, Any]:
    import json

    return json.loads((EVENTS / f"{name}.json").read_text())


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    # Not under pytest's basetemp: a later pytest session on the machine deletes all but the newest
    # three of those, and with them a running server's data folder.
    with (
        tempfile.TemporaryDirectory(prefix="photo-publish-pg-") as data,
        stack.database(Path(data), name=f"photo_test_{os.getpid()}", keep=False) as url,
    ):
        stack.migrate(url)
        yield url


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_database_engine(settings_for(database_url, queue_url="", dead_letter_url=""))
    yield engine
    engine.dispose()


@pytest.fixture
def db(engine: Engine) -> Engine:
    """The database, emptied for this test."""
    with engine.begin() as connection:
        connection.execute(text(f"TRUNCATE {TABLES} CASCADE"))
    return engine


@pytest.fixture(scope="session")
def aws_endpoint() -> Iterator[None]:
    with stack.aws_endpoint():
        s3, _ = stack.clients()
        s3.create_bucket(Bucket=BUCKET)
        yield


def settings_for(database_url: str, *, queue_url: str, dead_letter_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": database_url,
        "photo_bucket": BUCKET,
        "stage": STAGE,
        "process_queue_url": queue_url,
        "dead_letter_queue_url": dead_letter_url,
    }
    return Settings(**(values | overrides))


@dataclass
class Infra:
    s3: Any
    sqs: Any
    queues: stack.Queues
    settings: Settings
    monkeypatch: pytest.MonkeyPatch

    def configure(self, **overrides: Any) -> Settings:
        """Point the functions' environment at this test's stack (as the template would)."""
        self.settings = replace(self.settings, **overrides)
        for name, value in self.settings.environment().items():
            self.monkeypatch.setenv(name, value)
        bootstrap.reset()
        return self.settings

    def use_queues(
        self, name: str, *, max_receive_count: int = 5, visibility_timeout: int = 60, **overrides: Any
    ) -> Settings:
        """A fresh queue pair of its own (a redrive or a visibility the test needs) notified by the test
        bucket, and the functions pointed at it (their MAX_RECEIVE_COUNT its redrive's), with
        `overrides`."""
        queues = stack.create_queues(
            self.sqs, name, max_receive_count=max_receive_count, visibility_timeout=visibility_timeout
        )
        stack.notify(self.s3, BUCKET, queue_arn=queues.arn, originals_prefix=f"{STAGE}/originals/")
        stack.drop_test_events(self.sqs, queues.url)
        self.queues = queues
        return self.configure(
            process_queue_url=queues.url,
            dead_letter_queue_url=queues.dead_letter_url,
            max_receive_count=max_receive_count,
            **overrides,
        )


@pytest.fixture
def infra(
    db: Engine, database_url: str, aws_endpoint: None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Infra]:
    """A fresh queue pair wired to the test bucket, and the functions' environment pointing at it."""
    s3, sqs = stack.clients()
    queues = stack.create_queues(
        sqs, f"process-{uuid.uuid4().hex[:12]}", max_receive_count=5, visibility_timeout=60
    )
    stack.notify(s3, BUCKET, queue_arn=queues.arn, originals_prefix=f"{STAGE}/originals/")
    stack.drop_test_events(sqs, queues.url)
    infra = Infra(
        s3,
        sqs,
        queues,
        settings_for(database_url, queue_url=queues.url, dead_letter_url=queues.dead_letter_url),
        monkeypatch,
    )
    infra.configure()
    yield infra
    bootstrap.reset()


@pytest.fixture
def recipe_before_the_ladder(infra: Infra) -> Infra:
    """Photos published at version 1, the recipe before the responsive ladder (thumb and browse
    alone): where every deployment's photos are before a backfill moves them to a newer recipe."""
    infra.configure(variant_version=1, variant_widths=())
    return infra


@pytest.fixture
def fast(infra: Infra) -> Infra:
    """Backoffs of 1 s and 2 s instead of 30 s and 60 s."""
    infra.configure(retry_base_seconds=1)
    return infra


# --- the full-size corpus: made once, while the other tests run ----------------------------------

FULLSIZE_TESTS = (
    "tests/unit/test_fullsize.py",
    "tests/unit/test_decode_budget_counts.py",
    "tests/integration/test_large_photos.py",
)
# The first test to need the corpus may wait for its making (minutes on a fresh clone).
FULLSIZE_TIMEOUT = 1200
_FULLSIZE_MAKER = pytest.StashKey[subprocess.Popen[bytes]]()


def _make_fullsize(**options: Any) -> subprocess.Popen[bytes]:
    """devkit/fullsize.py in a child process (making the photos holds 100 MP pictures)."""
    from benchmarks import child
    from devkit import fullsize

    command = [sys.executable, "-m", "devkit.fullsize", str(fullsize.FOLDER)]
    return subprocess.Popen(command, cwd=stack.ROOT, env=child.env(), stdout=subprocess.DEVNULL, **options)


def pytest_configure(config: pytest.Config) -> None:
    """The run's first process (xdist's controller, or the only one) starts making the corpus where
    it is missing and a test of this run may need it: it is made while the other tests run, and
    the tests that read it run last."""
    from devkit import fullsize

    if hasattr(config, "workerinput") or fullsize.made():
        return
    root = stack.ROOT.resolve()
    asked = [(root / arg.split("::")[0]).resolve() for arg in config.args]
    if any(
        path == user or path in user.parents for path in asked for user in map(root.joinpath, FULLSIZE_TESTS)
    ):
        config.stash[_FULLSIZE_MAKER] = _make_fullsize(start_new_session=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    maker = config.stash.get(_FULLSIZE_MAKER, None)
    if maker is not None and maker.poll() is None:
        maker.terminate()  # a run that ended early: its partial files are never taken for made ones
        maker.wait()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    reads_corpus = [item for item in items if "fullsize_corpus" in getattr(item, "fixturenames", ())]
    for item in reads_corpus:
        item.add_marker(pytest.mark.timeout(FULLSIZE_TIMEOUT))
    later = set(map(id, reads_corpus))
    items[:] = [item for item in items if id(item) not in later] + reads_corpus


@pytest.fixture(scope="session")
def fullsize_corpus() -> Path:
    """devkit/fullsize.py's photos at the pixel limit: kept under .local/fullsize, keyed by what made
    them; made here where missing, after waiting for a maker already at work."""
    from devkit import fullsize

    assert _make_fullsize().wait() == 0, "devkit.fullsize could not make the corpus"
    return fullsize.FOLDER
