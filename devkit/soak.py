"""`make soak`: the real functions under chaos, at volume, and the promise checked at the end.

Several worker processes run the real process handler the way devkit's poller feeds it (Lambda's
SQS batches; what succeeded deleted, visibility and redrive left to the queue), two sweep processes
run the real sweep handler on a short schedule, over moto's server (or LocalStack / the endpoint in
AWS_ENDPOINT_URL) and PostgreSQL (embedded, or DATABASE_URL). Timeouts are short and keep the
settings' timing invariant: function timeout < STALE_AFTER_SECONDS < visibility (6 x the timeout).

While photos are uploaded (small real JPEGs made from tests/images, and a share of broken and
hostile files), at moments drawn from one seed (SOAK_SEED, printed):
- workers SIGKILL themselves at each stage of a delivery (devkit.chaos) and are restarted;
- the database's connections are terminated, and PostgreSQL is restarted once;
- S3 and SQS answer with errors, slowly, or drop connections (devkit.faultproxy, in front of the
  endpoint; outage windows let faults outlast botocore's retries);
- job messages and S3 notifications are delivered twice, originals uploaded again, and malformed
  messages sent.
Then the faults stop, the queue and the sweeps drain the work (bounded), and devkit.soakcheck checks
the invariants and prints the figures; any violation prints the seed and the photo's history.

The seed fixes the schedule (the file mix, each worker life's kill stage and countdown, the proxy's
dice, the times of database faults, outages and duplicates); the operating system still decides the
interleaving, so a replay repeats the pressure, not the exact race.

`python -m devkit.soak` (what `make soak` runs); SOAK_* variables override Config's fields.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

from botocore.exceptions import ClientError
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError, IntegrityError

from devkit import chaos, samples, soakcheck, stack, uploads
from devkit.faultproxy import ProxyControl, TcpGate, database_through, database_upstream, tcp_address
from photo_publish import operator
from photo_publish import uploads as photo_uploads
from photo_publish.adapters.database import sqlalchemy_url
from photo_publish.adapters.queue import SqsQueue
from photo_publish.adapters.storage import S3Store
from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.jobs import backfill
from photo_publish.keys import original_key
from photo_publish.retry import PERMANENT
from photo_publish.settings import Settings

ROOT = stack.ROOT
STAGE = "dev"
# The process queue's redrive policy, as the template's MaxReceiveCount.
REDRIVE_RECEIVES = 5
T = TypeVar("T")


@dataclass(frozen=True)
class Config:
    seed: int
    photos: int = 2000
    workers: int = 4
    sweeps: int = 2
    # SIGKILLs planned at the five stages (evenly); each worker life is armed with one.
    kills: int = 60
    # Uploads per second while the chaos runs.
    upload_rate: float = 6.0
    function_timeout: float = 4.0
    stale_after: int = 6
    visibility: int = 24
    # Above the queue's backlog age: a pending row older than this is sent again by every sweep
    # lease (a backlog older than SWEEP_AFTER_SECONDS multiplies the queue's messages).
    sweep_after: int = 20
    sweep_every: float = 3.0
    retry_base: int = 1
    batch_size: int = 5  # the template's BatchSize
    max_original_bytes: int = 2 * 1024 * 1024
    memory_mb: int = 1769  # the template's ProcessMemorySize
    # PNGs of 1,000,000 x 100 pixels under the pixel limit (issue 11 item 1).
    shape_bombs: int = 2
    hostile_share: float = 0.08
    # Originals whose every GetObject fails until the drain: the photo's attempts run out.
    unlucky_share: float = 0.01
    duplicate_every: float = 0.4
    # A user's deletion, of a photo in any state (its render may be running), every this many seconds.
    delete_every: float = 5.0
    # The drain's bound: it goes on while the work left shrinks, and gives up once it has not shrunk
    # for this long (a backfill's backlog of a few thousand re-renders drains for minutes), or at
    # four times it in all.
    drain_seconds: float = 360.0
    restart_postgres: bool = True
    # Database outages for the functions (their connections cut, new ones refused), each long enough
    # to outlast a notification's receives up to its hand-on to a fresh message; meanwhile fixed
    # files are uploaded for photos that failed for good (issue 21, finding 1).
    database_outages: int = 2
    database_outage_seconds: float = 12.0
    fixed_uploads_per_outage: int = 3
    # The operator: `redrive` (or `retry` of a few failed photos) about every this many seconds.
    operator_every: float = 25.0
    # A new recipe deployed to the fleet a quarter into the uploads and backfilled (`rerender
    # --all`), the backfill stopped and resumed, and run again until it marks nothing.
    backfill: bool = True
    # False: no kills, faults, duplicates or cursed originals (a baseline for the figures).
    chaos: bool = True
    output: Path = ROOT / ".local" / "soak"

    def __post_init__(self) -> None:
        # The template's timing invariant, which the stale and visibility logic relies on.
        if not self.function_timeout < self.stale_after < self.visibility:
            raise ValueError("need function timeout < stale after < visibility")
        if self.visibility < 6 * self.function_timeout:
            raise ValueError("the visibility timeout must be at least 6 x the function timeout")

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **defaults: Any) -> Config:
        """Fields from SOAK_<NAME> variables; the seed from SOAK_SEED, else a fresh one."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {"seed": random.SystemRandom().randrange(10**9)} | defaults
        for spec in fields(cls):
            raw = env.get(f"SOAK_{spec.name.upper()}")
            if raw:
                kind = type(values.get(spec.name, spec.default))
                values[spec.name] = raw.lower() in ("1", "true", "yes") if kind is bool else kind(raw)
        return cls(**values)


@dataclass
class Planned:
    """One photo of the run: what it is, what it must end as, and what the harness did to it."""

    index: int
    kind: str
    file_name: str
    data: bytes | None
    expected: str  # "ready", or the error code a hostile file must end with
    photo_id: UUID
    album_id: UUID
    uploaded_at: float | None = None
    # Its current put's S3 notification as first sent: a redelivery sends these very bytes (S3's
    # copies are identical; one stamped even a millisecond apart reads as another upload).
    notified: str | None = None
    targeted: bool = False
    deleted: float | None = None  # when its deletion committed (expected is then "deleted")
    actions: list[tuple[float, str]] = field(default_factory=list)

    @property
    def key(self) -> str:
        return original_key(STAGE, self.album_id, self.photo_id, self.file_name)

    def did(self, action: str) -> None:
        self.actions.append((time.time(), action))


# Hostile files: (name suffix, expected code); their bytes come from hostile_files().
HOSTILE = {
    "truncated": (".jpg", "DECODE_FAILED"),
    "not_an_image": (".jpg", "UNSUPPORTED_FORMAT"),
    "empty": (".jpg", "UNSUPPORTED_FORMAT"),
    "pixel_bomb": (".png", "DIMENSIONS_EXCEEDED"),
    "too_large": (".jpg", "ORIGINAL_TOO_LARGE"),
}


def photo_pool() -> list[bytes]:
    """Small real JPEGs: the run stresses coordination, not the encoder."""
    pool = []
    for path in samples.photographs():
        image = samples.photograph(path.name)
        for width in (256, 384, 512):
            pool.append(bytes(image.thumbnail_image(width).jpegsave_buffer(Q=80)))
    return pool


def shape_bomb() -> bytes:
    """1,000,000 x 100 RGB PNG (about 400 KB): 1.85 GB to decode without a per-axis limit."""
    import pyvips

    return bytes(pyvips.Image.black(1_000_000, 100, bands=3).pngsave_buffer(compression=9))


def hostile_files(pool: list[bytes], config: Config) -> dict[str, bytes]:
    return {
        "truncated": samples.truncated(pool[0], 0.5),
        "not_an_image": b"this is not a photograph\n" * 40,
        "empty": b"",
        "pixel_bomb": samples.pixel_bomb_png(),
        "too_large": b"\xff\xd8\xff" + bytes(config.max_original_bytes),
    }


def _kind(config: Config, roll: float, rng: random.Random) -> str:
    shares = [
        ("hostile", config.hostile_share),
        ("unlucky", config.unlucky_share),
        ("early_original", 0.01),  # the upload races the API's insert of its row
        ("missing_original", 0.005),  # a row whose original never comes
    ]
    for kind, share in shares:
        if roll < share:
            return rng.choice(list(HOSTILE)) if kind == "hostile" else kind
        roll -= share
    return "photo"


def plan(config: Config, rng: random.Random, pool: list[bytes]) -> list[Planned]:
    hostile = hostile_files(pool, config)
    kinds = [_kind(config, rng.random(), rng) for _ in range(config.photos - config.shape_bombs)]
    for _ in range(config.shape_bombs):
        kinds.insert(rng.randrange(len(kinds) // 4, len(kinds) + 1), "shape_bomb")
    bomb = shape_bomb() if config.shape_bombs else b""
    planned = []
    for index, kind in enumerate(kinds):
        if kind in HOSTILE:
            suffix, expected = HOSTILE[kind]
            data: bytes | None = hostile[kind]
        elif kind == "shape_bomb":
            suffix, expected, data = ".png", "DIMENSIONS_EXCEEDED", bomb
        elif kind == "missing_original":
            suffix, expected, data = ".jpg", "ORIGINAL_NOT_FOUND", None
        else:
            suffix, expected, data = ".jpg", "ready", rng.choice(pool)
        # Seeded ids: a replay's histories name the same photos.
        photo_id, album_id = (uuid.UUID(int=rng.getrandbits(128), version=4) for _ in range(2))
        planned.append(
            Planned(index, kind, f"{kind}-{index:05d}{suffix}", data, expected, photo_id, album_id)
        )
    return planned


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# A database fault as the harness meets it: the driver's error (its own SQL), or the functions'
# DATABASE_UNAVAILABLE (the PhotoError their unit of work raises for a database it cannot reach).
DATABASE_FAULTS = (DBAPIError, PhotoError)


def fault(error: Exception) -> str:
    """A fault's name in the tally."""
    return error.code.value if isinstance(error, PhotoError) else type(error).__name__


def retrying(action: Callable[[], T], *, seconds: float = 60) -> T:
    """The harness's own calls outlive the faults it injects (a PostgreSQL restart, a terminated session)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return action()
        except DATABASE_FAULTS:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def register(database: Database, planned: Planned) -> None:
    """The upload API's insert, retried until it is known to have landed."""

    def once() -> None:
        # IntegrityError: an earlier try committed and its answer was lost (a restart, a dropped session).
        with contextlib.suppress(IntegrityError):
            uploads.register(database.engine, STAGE, planned.file_name, planned.album_id, planned.photo_id)

    retrying(once)


@contextmanager
def upstream_endpoint(run_dir: Path) -> Iterator[str]:
    """The S3 + SQS endpoint: LocalStack or AWS_ENDPOINT_URL when set, else moto's server in its own
    process (the soak's traffic would starve a server sharing the harness's interpreter)."""
    os.environ.setdefault("AWS_DEFAULT_REGION", stack.REGION)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    if stack.localstack() or os.environ.get("AWS_ENDPOINT_URL"):
        with stack.aws_endpoint():
            yield os.environ["AWS_ENDPOINT_URL"]
        return
    port = free_port()
    with (run_dir / "moto.log").open("w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: urllib.request.urlopen(f"{url}/moto-api/", timeout=1).status == 200, 30)
        os.environ["AWS_ENDPOINT_URL"] = url
        yield url
    finally:
        os.environ.pop("AWS_ENDPOINT_URL", None)
        stop_process(server)


@contextmanager
def fault_proxy(
    upstream: str, seed: int, run_dir: Path, rates: dict[str, dict[str, float]] | None = None
) -> Iterator[ProxyControl]:
    """The fault proxy in its own process; `rates` replaces its per-request dice ({}: outages only)."""
    proxy = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "devkit.faultproxy",
            "--upstream",
            upstream,
            "--seed",
            str(seed),
            "--log",
            str(run_dir / "faults.log"),
            "--rates",
            "" if rates is None else json.dumps(rates),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proxy.stdout is not None
        yield ProxyControl(proxy.stdout.readline().strip())
    finally:
        stop_process(proxy)


def wait_for(condition: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"not ready within {seconds}s")


def stop_process(process: subprocess.Popen[Any], grace: float = 10) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class Life:
    """One worker process between its start and its death (a Lambda container)."""

    role: str
    slot: int
    incarnation: int
    arm: chaos.Arm | None
    process: subprocess.Popen[Any]
    log: Path
    started: float = field(default_factory=time.monotonic)


class Fleet:
    """The worker and sweep processes: started, watched, restarted when they die."""

    def __init__(
        self, config: Config, env: dict[str, str], queue_arn: str, run_dir: Path, rng: random.Random
    ):
        self.config = config
        self.env = env
        self.queue_arn = queue_arn
        self.run_dir = run_dir
        self.rng = rng
        self.armed = True
        self.stopping = False
        self.lives: list[Life] = []
        self.current: dict[tuple[str, int], Life] = {}
        # Stages still to kill at, evenly over the five, in a seeded order.
        kills = config.kills if config.chaos else 0
        per_stage = max(kills // len(chaos.STAGES), 1 if kills else 0)
        self.plan = [stage for stage in chaos.STAGES for _ in range(per_stage)]
        rng.shuffle(self.plan)
        self.commit_points = itertools.cycle(chaos.COMMIT_POINTS)
        self.lock = threading.Lock()

    def _arm(self) -> chaos.Arm | None:
        if not self.armed or not self.plan:
            return None
        stage = self.plan.pop()
        # Kills spread over the run: about `photos / kills` arrivals at a stage between two of them
        # (a little fewer: a restarted worker takes a while to come back).
        gap = max(int(0.7 * self.config.photos / max(self.config.kills, 1)), 1)
        if stage == "before_delete":
            gap = max(gap // self.config.batch_size, 1)
        detail = ""
        if stage == "render":
            detail = f"{self.rng.uniform(0, 0.03):.4f}"
        elif stage == "commit":
            detail = next(self.commit_points)
        return chaos.Arm(stage, self.rng.randint(1, 2 * gap), detail)

    def start(self, role: str, slot: int) -> None:
        previous = self.current.get((role, slot))
        incarnation = 0 if previous is None else previous.incarnation + 1
        arm = self._arm() if role == "worker" else None
        log = self.run_dir / f"{role}-{slot}-{incarnation:03d}.log"
        if role == "worker":
            command = [
                "worker",
                f"--slot={slot}",
                f"--incarnation={incarnation}",
                f"--arm={arm.encode() if arm else ''}",
                f"--queue-arn={self.queue_arn}",
                f"--batch-size={self.config.batch_size}",
                f"--timeout={self.config.function_timeout}",
                f"--memory-mb={self.config.memory_mb}",
            ]
        else:
            command = ["sweep", f"--slot={slot}", f"--every={self.config.sweep_every}"]
        with log.open("w") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "devkit.chaos", *command],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        life = Life(role, slot, incarnation, arm, process, log)
        self.lives.append(life)
        self.current[(role, slot)] = life

    def start_all(self) -> None:
        for slot in range(self.config.workers):
            self.start("worker", slot)
        for slot in range(self.config.sweeps):
            self.start("sweep", slot)

    def tend(self) -> None:
        """Restart what died; an armed stage whose kill did not happen goes back to the plan."""
        with self.lock:
            for (role, slot), life in list(self.current.items()):
                if life.process.poll() is None or self.stopping:
                    continue
                if life.arm is not None and not soakcheck.killed_at(life.log, life.arm.stage):
                    self.plan.append(life.arm.stage)
                self.start(role, slot)

    def redeploy(self, changes: dict[str, str]) -> None:
        """A new version of the functions, as Lambda replaces containers: each process finishes its
        batch and stops (SIGTERM), and tend() starts its successor with the new environment."""
        with self.lock:
            self.env = self.env | changes
            for life in self.current.values():
                if life.process.poll() is None:
                    life.process.terminate()

    def disarm(self) -> None:
        with self.lock:
            self.armed = False
            for life in self.current.values():
                if life.role == "worker" and life.process.poll() is None:
                    life.process.send_signal(signal.SIGUSR1)

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            for life in self.current.values():
                if life.process.poll() is None:
                    life.process.terminate()
            for life in self.current.values():
                stop_process(life.process, grace=15)


class Database:
    """The run's PostgreSQL: the harness's engine, the faults it injects, its connections' peak."""

    def __init__(self, url: str, data_dir: Path | None) -> None:
        self.url = url
        self.name = sqlalchemy_url(url).database
        self.data_dir = data_dir  # the embedded server's, which can be restarted; None for DATABASE_URL
        self.engine = create_engine(
            sqlalchemy_url(url),
            pool_pre_ping=True,
            pool_size=4,
            connect_args={"application_name": "photo-publish-soak", "connect_timeout": 5},
        )
        self.terminated = 0
        self.restarts = 0
        self.peak = {"all": 0, "functions": 0}
        self.samples = 0

    def terminate(self, rng: random.Random, everyone: bool) -> int:
        """pg_terminate_backend on one of the functions' sessions, or on all of them."""

        def run() -> int:
            with self.engine.begin() as connection:
                pids = list(
                    connection.scalars(
                        text(
                            "SELECT pid FROM pg_stat_activity WHERE datname = :db"
                            " AND application_name = 'photo-publish'"
                        ),
                        {"db": self.name},
                    )
                )
                chosen = pids if everyone else rng.sample(pids, min(1, len(pids)))
                for pid in chosen:
                    connection.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            return len(chosen)

        count = retrying(run)
        self.terminated += count
        return count

    def restart(self) -> float:
        """pg_ctl restart -m immediate: a crash and recovery (the embedded server only)."""
        import pgserver

        assert self.data_dir is not None
        started = time.monotonic()
        pgserver.pg_ctl(  # type: ignore[attr-defined]
            ["-w", "-m", "immediate", "-l", str(self.data_dir / "log"), "restart"],
            pgdata=self.data_dir,
            user=_pgserver_user(),
        )
        self.restarts += 1
        return time.monotonic() - started

    def stop_restarted(self) -> None:
        """pgserver stops the server it started; one restarted under it is stopped here."""
        import pgserver

        if self.restarts and self.data_dir is not None:
            pgserver.pg_ctl(  # type: ignore[attr-defined]
                ["-w", "-m", "fast", "stop"],
                pgdata=self.data_dir,
                user=_pgserver_user(),
            )

    def sample(self) -> None:
        try:
            with self.engine.connect() as connection:
                row = connection.execute(
                    text(
                        "SELECT count(*), count(*) FILTER (WHERE application_name = 'photo-publish')"
                        " FROM pg_stat_activity WHERE datname = :db"
                    ),
                    {"db": self.name},
                ).one()
        except DBAPIError:
            return
        self.samples += 1
        self.peak["all"] = max(self.peak["all"], row[0])
        self.peak["functions"] = max(self.peak["functions"], row[1])


def _pgserver_user() -> str | None:
    """The system user pgserver runs PostgreSQL as (it refuses to run as root)."""
    return "pgserver" if os.geteuid() == 0 else None


@dataclass
class Tally:
    """What the harness did, by kind."""

    duplicates: Counter[str] = field(default_factory=Counter)
    outages: Counter[str] = field(default_factory=Counter)
    malformed: list[str] = field(default_factory=list)
    database: Counter[str] = field(default_factory=Counter)
    deletions: Counter[str] = field(default_factory=Counter)
    operator: Counter[str] = field(default_factory=Counter)
    backfill: Counter[str] = field(default_factory=Counter)


def _event_time(at: float) -> str:
    """S3's eventTime: milliseconds, rounded down (as S3's own are)."""
    whole = time.gmtime(at)
    return time.strftime("%Y-%m-%dT%H:%M:%S", whole) + f".{int(at * 1000) % 1000:03d}Z"


def notification(bucket: str, planned: Planned) -> str:
    """The original's S3 event notification, as S3 writes one (the key form-encoded, "/" kept; moto's
    own encode "/" as well, and the conftest's tests read those): its key, size and eTag (the MD5 S3
    gives a single-part upload), the time it is sent, and, like moto's, no sequencer."""
    from urllib.parse import quote_plus

    data = planned.data or b""

    return json.dumps(
        {
            "Records": [
                {
                    "eventVersion": "2.1",
                    "eventSource": "aws:s3",
                    "awsRegion": stack.REGION,
                    "eventTime": _event_time(time.time()),
                    "eventName": "ObjectCreated:Put",
                    "s3": {
                        "s3SchemaVersion": "1.0",
                        "configurationId": "originals-created",
                        "bucket": {"name": bucket, "arn": f"arn:aws:s3:::{bucket}"},
                        "object": {
                            "key": quote_plus(planned.key, safe="/"),
                            "size": len(data),
                            "eTag": hashlib.md5(data, usedforsecurity=False).hexdigest(),
                        },
                    },
                }
            ]
        }
    )


# The backfill's recipe (a larger thumb, under the version after the functions' default), deployed once a share of the
# photos is published on the first (whatever the machine's pace), then its steps, seconds after the
# deployment: marked once the old containers are gone, stopped, resumed.
RECIPE_VERSION = next(f.default for f in fields(Settings) if f.name == "variant_version") + 1
RECIPE_THUMB = 420
BACKFILL_AFTER_PUBLISHED = 0.15
BACKFILL_STEPS = [(6.0, "rerender --all"), (14.0, "stop"), (24.0, "rerender --all")]

# Bodies no producer of ours sends: acknowledged and counted, never retried or dead-lettered
# (SPEC 6). The nested one is issue 11 item 6's RecursionError.
MALFORMED = {
    "not_json": "this is not JSON {",
    "nested_json": "[" * 100_000 + "]" * 100_000,
    "not_a_uuid": json.dumps({"photoId": "not-a-uuid"}),
    "number_id": json.dumps({"photoId": 42}),
}


class _Recording:
    """The operator's SQS client, noting each dead letter a redrive removes (the checker judges every
    letter that ever paged, not only those left at the end). What the redrive only looked at is made
    visible again when it is done (it would stay hidden for the redrive's own 300 s, past the
    checker's reading)."""

    def __init__(self, sqs: Any, dead_letter_url: str) -> None:
        self._sqs = sqs
        self._url = dead_letter_url
        self._seen: dict[str, dict[str, Any]] = {}
        self.removed: list[dict[str, Any]] = []

    def receive_message(self, **request: Any) -> Any:
        letters = request.get("QueueUrl") == self._url
        if letters:
            request["AttributeNames"] = ["All"]  # its SentTimestamp, for the checker
        response = self._sqs.receive_message(**request)
        if letters:
            self._seen |= {m["ReceiptHandle"]: m for m in response.get("Messages", [])}
        return response

    def delete_message(self, **request: Any) -> Any:
        response = self._sqs.delete_message(**request)
        if request.get("QueueUrl") == self._url:
            self.removed.append(self._seen.pop(request["ReceiptHandle"]) | {"removedAt": time.time()})
        return response

    def release(self) -> None:
        for handle in self._seen:
            with contextlib.suppress(ClientError):
                self._sqs.change_message_visibility(
                    QueueUrl=self._url, ReceiptHandle=handle, VisibilityTimeout=0
                )
        self._seen.clear()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sqs, name)


class Operator:
    """A person at the operator's commands (photo_publish.operator), from a laptop: straight to the
    queue and the database, around the fault proxy and the database gate. An attempt that meets the
    harness's own faults (a terminated session) is counted and tried at the next turn."""

    def __init__(self, engine: Any, sqs: Any, settings: Settings, tally: Tally) -> None:
        self.engine = engine
        self.sqs = sqs
        self.settings = settings
        self.tally = tally
        self.removed: list[dict[str, Any]] = []

    def redrive(self, planned: dict[str, Planned]) -> None:
        client = _Recording(self.sqs, self.settings.dead_letter_queue_url)
        try:
            summary = operator.redrive(self.engine, client, self.settings)
        except (*DATABASE_FAULTS, ClientError) as error:
            self.tally.operator[f"redrive failed: {fault(error)}"] += 1
            return
        finally:
            client.release()
            self.removed += client.removed
        self.tally.operator["redrives"] += 1
        self.tally.operator["photos redriven"] += len(summary.photos)
        self.tally.operator["letters removed"] += summary.messages_removed
        for photo_id in summary.photos:
            if shot := planned.get(str(photo_id)):
                shot.did("operator: redrive took its failure back and sent a job message")

    def retry(self, planned: dict[str, Planned], rng: random.Random) -> None:
        """`retry PHOTO_ID ...` for a few failed photos, as a person picks them from a report."""
        try:
            with self.engine.connect() as connection:
                failed = list(
                    connection.scalars(
                        text("SELECT id FROM photos WHERE processing_state = 'processing_failed'")
                    )
                )
            chosen = rng.sample(sorted(failed), min(3, len(failed)))
            queue = SqsQueue(self.sqs, self.settings.process_queue_url, self.settings.dead_letter_queue_url)
            sent = operator.retry(self.engine, queue, chosen, lease_seconds=self.settings.stale_after_seconds)
        except (*DATABASE_FAULTS, ClientError) as error:
            self.tally.operator[f"retry failed: {fault(error)}"] += 1
            return
        self.tally.operator["retries"] += 1
        self.tally.operator["photos retried"] += len(sent)
        for photo_id in sent:
            if shot := planned.get(str(photo_id)):
                shot.did("operator: retry took its failure back and sent a job message")

    def rerender(self, version: int) -> None:
        """`rerender --all`, run again where the database refused it (marking is idempotent)."""
        lease = self.settings.stale_after_seconds
        marked = retrying(
            lambda: backfill.mark(self.engine, version, backfill.Selection(), lease_seconds=lease).marked
        )
        self.tally.backfill["rerender --all"] += 1
        self.tally.backfill["marked"] += marked

    def stop_rerender(self) -> None:
        self.tally.backfill["stopped (marks cleared)"] += retrying(lambda: backfill.stop(self.engine))


@dataclass(frozen=True)
class Parts:
    """Everything one run set up."""

    database: Database
    proxy: ProxyControl
    s3: Any
    sqs: Any
    queues: stack.Queues
    settings: Settings
    fleet: Fleet
    gate: TcpGate
    operator: Operator


class Run:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.dir = config.output / f"{stamp}-seed{config.seed}"
        self.dir.mkdir(parents=True, exist_ok=True)
        # Not from the seed: a replay against the same LocalStack must not find the last run's objects.
        self.bucket = f"photo-publish-soak-{uuid.uuid4().hex[:8]}"
        self.tally = Tally()
        self.pool = photo_pool()
        self.times: dict[str, float] = {}
        self.stop_chaos = threading.Event()
        self.stop_sampling = threading.Event()

    def say(self, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    def execute(self) -> soakcheck.Report:
        config = self.config
        self.say(
            f"soak: SOAK_SEED={config.seed} photos={config.photos} workers={config.workers} -> {self.dir}"
        )
        started = time.monotonic()
        photos = plan(config, self.rng, self.pool)
        with ExitStack() as exits:
            parts = self.set_up(exits)
            self.times["setup"] = time.monotonic() - started
            settled = self.agitate_and_drain(photos, parts)
            check_started = time.monotonic()
            report = soakcheck.check(self.inputs(photos, parts, settled))
            self.times["check"] = time.monotonic() - check_started
        self.times["total"] = time.monotonic() - started
        report.times = {k: round(v, 1) for k, v in self.times.items()}
        report.seed = config.seed
        soakcheck.publish(report, self.dir)
        return report

    def set_up(self, exits: ExitStack) -> Parts:
        """PostgreSQL, the endpoint and its fault proxy, queues, bucket, and the fleet started."""
        embedded = not os.environ.get("DATABASE_URL")
        data_dir = self.dir / "postgres"
        # The embedded server's database stays in the run's folder for a post-mortem; one made on
        # DATABASE_URL's (shared) server is dropped.
        url = exits.enter_context(
            stack.database(data_dir, name=f"photo_soak_{self.config.seed}", keep=embedded)
        )
        database = Database(url, data_dir if embedded else None)
        exits.callback(database.stop_restarted)
        exits.callback(database.engine.dispose)
        upstream = exits.enter_context(upstream_endpoint(self.dir))
        proxy = exits.enter_context(fault_proxy(upstream, self.config.seed, self.dir))
        stack.migrate(url)
        s3, sqs = stack.clients()
        queues = stack.create_queues(
            sqs,
            f"{self.bucket}-process",
            max_receive_count=REDRIVE_RECEIVES,
            visibility_timeout=self.config.visibility,
        )
        if stack.localstack():
            stack.create_bucket(s3, self.bucket, queue_arn=queues.arn, originals_prefix=f"{STAGE}/originals/")
        else:
            # On moto the harness sends each put's notification itself (Run.put), to copy it exactly.
            s3.create_bucket(Bucket=self.bucket)
        stack.drop_test_events(sqs, queues.url)
        # The functions reach the database through a gate the harness can shut (an outage); the
        # harness itself, the upload API and the operator go around it.
        gate = TcpGate(tcp_address(database_upstream(url)))
        threading.Thread(target=gate.serve_forever, daemon=True).start()
        exits.callback(gate.close)
        settings = self.settings(database_through(url, f"tcp://127.0.0.1:{gate.port}"), queues)
        fleet = Fleet(self.config, self.worker_env(settings, proxy.url), queues.arn, self.dir, self.rng)
        exits.callback(fleet.stop)
        fleet.start_all()
        return Parts(
            database,
            proxy,
            s3,
            sqs,
            queues,
            settings,
            fleet,
            gate,
            Operator(database.engine, sqs, settings, self.tally),
        )

    def agitate_and_drain(self, photos: list[Planned], parts: Parts) -> bool:
        """Uploads under chaos until most photos settled; then quiet, and drain. True if drained."""
        sampler = threading.Thread(target=self.sample, args=(parts.database,), daemon=True)
        sampler.start()
        chaos_started = time.monotonic()
        # Each with its own dice, drawn here in one order: a replay gives each the same.
        agitators = [
            threading.Thread(
                target=act, args=(photos, parts, random.Random(self.rng.getrandbits(64))), daemon=True
            )
            for act in (self.agitate, self.people)
        ]
        if self.config.chaos:
            for agitator in agitators:
                agitator.start()
        else:
            parts.proxy.call("quiet")
        self.upload(photos, parts)
        self.times["uploads"] = time.monotonic() - chaos_started
        # The chaos goes on while the backlog is worked through, not only while uploads come.
        self.wait_processed(len(photos), parts)
        self.stop_chaos.set()
        for agitator in agitators:
            if agitator.is_alive():
                agitator.join()
        self.finish_deletions(photos, parts)
        self.times["chaos"] = time.monotonic() - chaos_started

        self.say("drain: faults off, kills disarmed; waiting for the queue and the sweeps")
        parts.proxy.call("quiet")
        parts.fleet.disarm()
        drain_started = time.monotonic()
        settled = self.drain(parts)
        self.times["drain"] = time.monotonic() - drain_started
        self.times["to_settled"] = time.monotonic() - chaos_started
        parts.fleet.stop()
        self.stop_sampling.set()
        sampler.join()
        return settled

    def inputs(self, photos: list[Planned], parts: Parts, settled: bool) -> soakcheck.Inputs:
        database = parts.database
        return soakcheck.Inputs(
            config=asdict(self.config),
            photos=photos,
            engine=database.engine,
            s3=parts.s3,
            sqs=parts.sqs,
            bucket=self.bucket,
            stage=STAGE,
            queues=parts.queues,
            run_dir=self.dir,
            lives=parts.fleet.lives,
            proxy_stats=parts.proxy.call("stats"),
            tally=self.tally,
            database={
                "terminated": database.terminated,
                "restarts": database.restarts,
                "peak_connections": database.peak,
                "samples": database.samples,
                "restartable": database.data_dir is not None,
            },
            settled=settled,
            max_attempts=parts.settings.max_attempts,
            malformed=MALFORMED,
            removed_letters=parts.operator.removed,
            recipe_version=RECIPE_VERSION if self.config.backfill else None,
            redrive_receives=REDRIVE_RECEIVES,
        )

    def settings(self, url: str, queues: stack.Queues) -> Settings:
        config = self.config
        return Settings(
            database_url=url,
            photo_bucket=self.bucket,
            stage=STAGE,
            process_queue_url=queues.url,
            dead_letter_queue_url=queues.dead_letter_url,
            retry_base_seconds=config.retry_base,
            stale_after_seconds=config.stale_after,
            sweep_after_seconds=config.sweep_after,
            max_original_bytes=config.max_original_bytes,
            # The record's and the commit's share of a short function timeout.
            record_budget_seconds=config.function_timeout * 0.4,
            commit_budget_seconds=config.function_timeout * 0.125,
            # A backfill run's messages spread over the sweep's (shortened) period.
            backfill_spread_seconds=math.ceil(config.sweep_every),
        )

    def worker_env(self, settings: Settings, proxy_url: str) -> dict[str, str]:
        """What the template sets on the functions, with every AWS call going through the proxy."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT_URL")}
        env |= settings.environment()
        return env | {
            "AWS_ENDPOINT_URL": proxy_url,
            "POWERTOOLS_SERVICE_NAME": "photo-publish",
            "POWERTOOLS_METRICS_NAMESPACE": "PhotoPublishSoak",
            "POWERTOOLS_LOG_LEVEL": "INFO",
            "MALLOC_ARENA_MAX": "2",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("functions/process", "shared", ".")),
        }

    def wait_processed(self, count: int, parts: Parts, share: float = 0.95) -> None:
        """Until `share` of the photos settled (bounded by as long again as the uploads took)."""
        deadline = time.monotonic() + max(60.0, count / self.config.upload_rate)
        while time.monotonic() < deadline:
            parts.fleet.tend()
            state = retrying(lambda: soakcheck.progress(parts.database.engine))
            if state["ready"] + state["failed"] + state["deleted"] >= share * count:
                return
            time.sleep(0.2)

    def upload(self, photos: list[Planned], parts: Parts) -> None:
        """What users and the upload API do, at a steady rate; the fleet tended in between."""
        database, proxy, fleet = parts.database, parts.proxy, parts.fleet
        started = time.monotonic()
        late: list[tuple[float, Planned]] = []
        for index, planned in enumerate(photos):
            while time.monotonic() < started + index / self.config.upload_rate:
                fleet.tend()
                self.register_late(late, database)
                time.sleep(0.02)
            if planned.kind == "unlucky" and self.config.chaos:
                proxy.call("curse", keys=[planned.key])
                planned.did("cursed: every GetObject of its original fails until the drain")
            if planned.kind == "early_original":
                self.put(parts, planned)
                late.append((time.monotonic() + self.rng.uniform(0.2, 1.5), planned))
                continue
            register(database, planned)
            planned.did("registered")
            if planned.data is not None:
                self.put(parts, planned)
            if index and index % 200 == 0:
                self.say(f"uploaded {index}/{len(photos)}")
        while late:
            self.register_late(late, database, everything=True)

    def register_late(
        self, late: list[tuple[float, Planned]], database: Database, everything: bool = False
    ) -> None:
        for due, planned in list(late):
            if everything or time.monotonic() >= due:
                late.remove((due, planned))
                register(database, planned)
                planned.did("registered, after its original")

    def put(self, parts: Parts, planned: Planned, what: str = "original uploaded") -> None:
        """An original put, and on moto its notification sent by the harness (kept for a redelivery
        to copy: moto's own cannot be read back, and a copy made up later differs in its time)."""
        assert planned.data is not None
        uploads.put_original(parts.s3, self.bucket, planned.key, planned.data)
        if not stack.localstack():
            planned.notified = notification(self.bucket, planned)
            parts.sqs.send_message(QueueUrl=parts.queues.url, MessageBody=planned.notified)
        planned.uploaded_at = planned.uploaded_at or time.time()
        planned.did(what)

    def agitate(self, photos: list[Planned], parts: Parts, rng: random.Random) -> None:
        """Database faults, S3 and SQS outages, duplicates and malformed messages, at seeded moments."""
        database, proxy, sqs, queues = parts.database, parts.proxy, parts.sqs, parts.queues
        expected = len(photos) / self.config.upload_rate
        now = time.monotonic()
        due = {
            "terminate": now + rng.uniform(2, 6),
            "outage": now + rng.uniform(4, 10),
            "duplicate": now + rng.uniform(0, self.config.duplicate_every),
            "target": now,
            # Early: a malformed message that is retried instead of acknowledged takes five
            # visibility timeouts to reach the dead-letter queue.
            "malformed": now + rng.uniform(0, expected / 4),
            "restart": now + expected * rng.uniform(0.35, 0.65)
            if self.config.restart_postgres and database.data_dir is not None
            else float("inf"),
        }
        malformed = list(MALFORMED)
        rng.shuffle(malformed)
        while not self.stop_chaos.wait(0.05):
            now = time.monotonic()
            uploaded = [p for p in photos if p.uploaded_at is not None]
            if now >= due["terminate"]:
                everyone = rng.random() < 0.3
                database.terminate(rng, everyone)
                self.tally.database["terminated_all" if everyone else "terminated_one"] += 1
                due["terminate"] = now + rng.uniform(2, 6)
            if now >= due["restart"]:
                self.say("database: restarting PostgreSQL (immediate)")
                seconds = database.restart()
                self.tally.database["restarted"] += 1
                self.say(f"database: back after {seconds:.1f}s")
                due["restart"] = float("inf")
            if now >= due["outage"]:
                service, operation = rng.choice(
                    [
                        ("s3", None),
                        ("sqs", None),
                        ("sqs", "SendMessage(dlq)"),
                        ("s3", "PutObject"),
                        ("sqs", "ChangeMessageVisibility"),
                    ]
                )
                kind = rng.choice(["error_500", "error_503", "drop_request", "drop_response"])
                seconds = rng.uniform(1.5, 4.0)
                proxy.call("outage", service=service, kind=kind, seconds=seconds, operation=operation)
                self.tally.outages[f"{service}:{operation or '*'}:{kind}"] += 1
                due["outage"] = now + rng.uniform(6, 14)
            if now >= due["duplicate"] and uploaded:
                self.duplicate(rng.choice(uploaded), rng, parts)
                due["duplicate"] = now + rng.uniform(0.5, 1.5) * self.config.duplicate_every
            if now >= due["malformed"] and malformed:
                name = malformed.pop()
                sqs.send_message(QueueUrl=queues.url, MessageBody=MALFORMED[name])
                self.tally.malformed.append(name)
                due["malformed"] = now + rng.uniform(0, expected / 8)
            if now >= due["target"]:
                self.target_last_attempts(photos, parts, rng)
                due["target"] = now + 0.5

    def people(self, photos: list[Planned], parts: Parts, rng: random.Random) -> None:
        """What people do meanwhile, at seeded moments: users delete photos and upload fixed files
        during database outages, the operator runs redrive and retry, and deploys a new recipe and
        backfills it (stopped and resumed)."""
        expected = len(photos) / self.config.upload_rate
        now = time.monotonic()
        outages = sorted(now + expected * rng.uniform(0.2, 0.8) for _ in range(self.config.database_outages))
        due = {
            "delete": now + rng.uniform(0, self.config.delete_every),
            "database_outage": outages.pop(0) if outages else float("inf"),
            "operator": now + rng.uniform(0.5, 1.5) * self.config.operator_every,
            "published": now,
        }
        deploy_after = BACKFILL_AFTER_PUBLISHED * len(photos) if self.config.backfill else float("inf")
        steps: list[tuple[float, str]] = []
        by_id = {str(p.photo_id): p for p in photos}
        operator_turns = 0
        while not self.stop_chaos.wait(0.05):
            now = time.monotonic()
            if now >= due["delete"]:
                self.delete(photos, parts, rng)
                due["delete"] = now + rng.uniform(0.5, 1.5) * self.config.delete_every
            if now >= due["database_outage"]:
                self.database_outage(photos, parts, rng)
                due["database_outage"] = outages.pop(0) if outages else float("inf")
            if now >= due["operator"]:
                # Redrive until one has gone through (an outage may fail it), then take turns, so
                # that even a short run has both.
                if operator_turns % 2 == 0 or not self.tally.operator.get("redrives"):
                    parts.operator.redrive(by_id)
                else:
                    parts.operator.retry(by_id, rng)
                operator_turns += 1
                due["operator"] = now + rng.uniform(0.5, 1.5) * self.config.operator_every
            if now >= due["published"]:
                if retrying(lambda: soakcheck.progress(parts.database.engine))["ready"] >= deploy_after:
                    self.backfill_step("deploy", parts)
                    steps, deploy_after = (
                        [(now + delay, step) for delay, step in BACKFILL_STEPS],
                        float("inf"),
                    )
                due["published"] = now + 1 if deploy_after < float("inf") else float("inf")
            while steps and now >= steps[0][0]:
                self.backfill_step(steps.pop(0)[1], parts)

    def database_outage(self, photos: list[Planned], parts: Parts, rng: random.Random) -> None:
        """The functions lose the database for longer than a notification's receives last; fixed files
        are uploaded meanwhile for photos that failed for good, whose notifications meet the outage
        through every receive: only what the hand-on to a fresh message carries can reopen them."""
        seconds = self.config.database_outage_seconds
        parts.gate.shut(seconds)
        self.tally.database["outages"] += 1
        self.say(f"database: the functions' connections cut and refused for {seconds:.0f}s")
        codes = [code.value for code in ErrorCode if code in PERMANENT]
        candidates = {
            str(p.photo_id): p for p in photos if p.expected not in ("ready", "deleted") and p.deleted is None
        }
        with parts.database.engine.connect() as connection:
            failed = sorted(
                str(photo_id)
                for photo_id in connection.scalars(
                    text(
                        "SELECT id FROM photos WHERE processing_state = 'processing_failed'"
                        " AND error_code = ANY(:codes)"
                    ),
                    {"codes": codes},
                )
                if str(photo_id) in candidates
            )
        for photo_id in rng.sample(failed, min(self.config.fixed_uploads_per_outage, len(failed))):
            planned = candidates[photo_id]
            planned.data, planned.expected = rng.choice(self.pool), "ready"
            self.put(
                parts,
                planned,
                "a new picture: a fixed file for its failure, uploaded during a database outage",
            )
            self.tally.duplicates["fixed file during a database outage"] += 1

    def backfill_step(self, step: str, parts: Parts) -> None:
        """A new recipe deployed, then `rerender --all`, `rerender --stop` and `rerender --all` again."""
        self.say(f"backfill: {step}")
        if step == "deploy":
            parts.fleet.redeploy({"VARIANT_VERSION": str(RECIPE_VERSION), "THUMB_SIZE": str(RECIPE_THUMB)})
            self.tally.backfill["deployed"] += 1
        elif step == "stop":
            parts.operator.stop_rerender()
        else:
            parts.operator.rerender(RECIPE_VERSION)

    def delete(self, photos: list[Planned], parts: Parts, rng: random.Random) -> None:
        """A user deletes a photo, in whatever state it is (a render may hold it, a retry may be
        due, a letter owed): from then on nothing of it may be left or published. A deletion the
        database refused (it is being failed) is tried again at the next turn."""
        waiting = [p for p in photos if p.expected == "deleted" and not p.deleted]
        if not waiting:
            registered = [
                p
                for p in photos
                if p.expected != "deleted" and any(a.startswith("registered") for _, a in p.actions)
            ]
            if not registered:
                return
            # Half of them among the newest: most likely held by a render, or between its puts.
            chosen = rng.choice(registered[-5:] if rng.random() < 0.5 else registered)
            chosen.expected = "deleted"
            self.tally.deletions[chosen.kind] += 1
            waiting = [chosen]
        planned = waiting[0]
        s3, _ = stack.clients()
        try:
            found = photo_uploads.delete(
                parts.database.engine,
                S3Store(s3, self.bucket),
                parts.settings,
                planned.photo_id,
                caller=photo_uploads.BACKEND,
            )
        except (*DATABASE_FAULTS, OSError) as error:
            planned.did(f"deletion failed, tried again: {fault(error)}")
            return
        # (Not found: an earlier try committed, and its answer was lost with the connection.)
        planned.deleted = time.time()
        planned.did("deleted" if found else "deleted (already, by an earlier try)")

    def finish_deletions(self, photos: list[Planned], parts: Parts) -> None:
        """A deletion the chaos kept refusing is done before the drain (bounded: the faults stop)."""
        rng = random.Random(0)
        deadline = time.monotonic() + 60
        while any(p.expected == "deleted" and not p.deleted for p in photos) and time.monotonic() < deadline:
            self.delete(photos, parts, rng)
            time.sleep(0.5)

    def target_last_attempts(self, photos: list[Planned], parts: Parts, rng: random.Random) -> None:
        """Half the unlucky photos: the dead-letter queue refuses sends through their last attempt.

        Chance alone rarely lines an outage up with a final failure; this one aims at it, so that a
        final failure whose dead letter cannot be sent is seen every run (SPEC 5, issue 11 item 2).
        """
        waiting = {p.photo_id: p for p in photos if p.kind == "unlucky" and not p.targeted}
        if not waiting:
            return
        last = parts.settings.max_attempts - 1
        with parts.database.engine.connect() as connection:
            due = connection.scalars(
                text(
                    "SELECT photo_id FROM photo_jobs WHERE photo_id = ANY(:ids)"
                    " AND status = 'pending' AND attempt = :last"
                ),
                {"ids": list(waiting), "last": last},
            ).all()
        for photo_id in due:
            planned = waiting[photo_id]
            planned.targeted = True
            if rng.random() < 0.5:
                seconds = parts.settings.retry.backoff(last) + 8
                parts.proxy.call(
                    "outage", service="sqs", kind="error_500", seconds=seconds, operation="SendMessage(dlq)"
                )
                self.tally.outages["sqs:SendMessage(dlq):error_500 (aimed at a last attempt)"] += 1
                planned.did(f"aimed: the dead-letter queue refuses sends for {seconds}s (its last attempt)")

    def duplicate(self, planned: Planned, rng: random.Random, parts: Parts) -> None:
        sqs, queues = parts.sqs, parts.queues
        roll = rng.random()
        if 0.45 <= roll < 0.8 and planned.notified is not None:
            sqs.send_message(QueueUrl=queues.url, MessageBody=planned.notified)
            kind = "s3_notification"
        elif roll < 0.8:
            # (LocalStack's own notifications, which a copy would have to repeat byte for byte, are
            # not kept: there its duplicates are job messages.)
            sqs.send_message(QueueUrl=queues.url, MessageBody=json.dumps({"photoId": str(planned.photo_id)}))
            kind = "job_message"
        else:
            kind = "reupload, the same bytes"
            if planned.expected == "ready":
                # Another picture under the same key (the user replaced it): a genuinely new upload,
                # which may reopen a failed job.
                planned.data = rng.choice([p for p in self.pool if p != planned.data])
                kind = "reupload, a new picture"
            self.put(parts, planned, f"duplicate: {kind}")
            self.tally.duplicates[kind] += 1
            return
        self.tally.duplicates[kind] += 1
        planned.did(f"duplicate: {kind}")

    def drain(self, parts: Parts) -> bool:
        """Until every photo settled, no job is active or pending and the queue is empty (bounded)."""
        database, sqs, queues, fleet = parts.database, parts.sqs, parts.queues, parts.fleet
        started = time.monotonic()
        deadline, cap = started + self.config.drain_seconds, started + 4 * self.config.drain_seconds
        version = RECIPE_VERSION if self.config.backfill else None
        last, next_backfill, least = "", time.monotonic(), float("inf")
        while time.monotonic() < min(deadline, cap):
            fleet.tend()
            state = retrying(lambda: soakcheck.progress(database.engine, version))
            if state.get("below_recipe") and time.monotonic() >= next_backfill:
                # The operator runs the backfill again until nothing is left below the recipe (running
                # it again renders nothing twice): photos the old containers published after a mark,
                # re-renders that failed for good.
                parts.operator.rerender(RECIPE_VERSION)
                next_backfill = time.monotonic() + 10
            attributes = sqs.get_queue_attributes(
                QueueUrl=queues.url,
                AttributeNames=[
                    "ApproximateNumberOfMessages",
                    "ApproximateNumberOfMessagesNotVisible",
                    "ApproximateNumberOfMessagesDelayed",
                ],
            )["Attributes"]
            in_queue = sum(int(v) for v in attributes.values())
            left = in_queue + sum(
                int(state.get(k) or 0) for k in ("unsettled", "open_jobs", "unpurged", "below_recipe")
            )
            if left < least:
                least, deadline = left, time.monotonic() + self.config.drain_seconds
            line = f"drain: {state} queue={in_queue}"
            if line != last:
                self.say(line)
                last = line
            done = (
                state["unsettled"] == 0
                and state["open_jobs"] == 0
                and state["unpurged"] == 0
                and not state.get("below_recipe")
            )
            if done and in_queue == 0:
                return True
            time.sleep(1)
        return False

    def sample(self, database: Database) -> None:
        while not self.stop_sampling.wait(0.25):
            database.sample()


def main() -> None:
    report = Run(Config.from_env()).execute()
    sys.exit(1 if report.violations else 0)


if __name__ == "__main__":
    main()
