"""A soak worker: the real process handler fed by devkit's poller, as Lambda would run it, that dies
on purpose.

Each worker process is one warm Lambda container: it runs `functions/process/app.py`'s handler on
Lambda-shaped SQS batches (devkit.poller), deletes what succeeded and leaves the rest to the queue.
The soak arms it with one seeded kill: at the n-th time it reaches a stage, it SIGKILLs itself.
The product's code is untouched; the stages are seen by wrapping its real adapters:

- `before_claim`: the repository's claim, before its UPDATE runs;
- `render`: while libvips renders (a timer fires a few milliseconds in, or as the render returns);
- `between_puts`: after the first variant's put, before the second;
- `commit`: inside the publish transaction: after its photo UPDATE, just before COMMIT, or while the
  COMMIT is in flight (so its outcome is unknown to the worker);
- `before_delete`: after the handler answered, before the poller deletes the batch's messages.

As Lambda does, the worker is also killed when an invocation outlives its timeout
(`lambda_timeout`) or its resident memory passes the function's memory size (`out_of_memory`).
Every kill, every variant put (to explain variants left by a killed attempt) and every batch with
how the handler answered it (to tell a message the redrive took from runs that never ended) is one JSON line
on standard output, in the same log as the function's own lines.

`python -m devkit.chaos worker --arm STAGE:N:DETAIL` and `python -m devkit.chaos sweep --every S`
run with the functions' environment set by the harness (devkit.soak).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config
from sqlalchemy import Engine, event

from devkit import handlers
from devkit.poller import Handler, LambdaContext, Poller

STAGES = ("before_claim", "render", "between_puts", "commit", "before_delete")
COMMIT_POINTS = ("after_update", "before_commit", "during_commit")
PUBLISH_UPDATE = "UPDATE photos SET processing_state"
VARIANT_PHOTO = re.compile(r"/variants/([0-9a-f-]{36})/")
PAGE = os.sysconf("SC_PAGE_SIZE")
_OUT = threading.Lock()


def emit(**fields: Any) -> None:
    """One JSON line on standard output (unbuffered: a SIGKILL loses nothing already written)."""
    line = json.dumps(
        {"chaos": fields.pop("chaos"), "t": round(time.time(), 3), "pid": os.getpid(), **fields}
    )
    with _OUT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


@dataclass(frozen=True)
class Arm:
    """Kill at the `countdown`-th arrival at `stage`; `detail` says where exactly (render: seconds
    into the render; commit: one of COMMIT_POINTS)."""

    stage: str
    countdown: int
    detail: str = ""

    def encode(self) -> str:
        return f"{self.stage}:{self.countdown}:{self.detail}"

    @classmethod
    def decode(cls, text: str) -> Arm:
        stage, countdown, detail = text.split(":", 2)
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}")
        return cls(stage, int(countdown), detail)


class Chaos:
    def __init__(self, arm: Arm | None, *, timeout_seconds: float, memory_mb: int) -> None:
        self.arm = arm
        self.timeout_seconds = timeout_seconds
        self.memory_bytes = memory_mb * 1024 * 1024
        self.arrivals: Counter[str] = Counter()
        self.invocation_started: float | None = None
        # The photo each record thread works on: named when Lambda's limits kill the container.
        self.in_flight: dict[int, str] = {}
        self.local = threading.local()
        self._lock = threading.Lock()

    def arrive(self, stage: str) -> bool:
        """Count an arrival at `stage`; True if this is the one to die at."""
        with self._lock:
            self.arrivals[stage] += 1
            arm = self.arm
            return arm is not None and arm.stage == stage and self.arrivals[stage] == arm.countdown

    def kill(self, stage: str, photo_id: str | None = None, **detail: Any) -> None:
        emit(chaos="kill", stage=stage, photo_id=photo_id, **detail)
        os.kill(os.getpid(), signal.SIGKILL)

    def photo_id(self) -> str | None:
        return getattr(self.local, "photo_id", None)

    def working_on(self, photo_id: str) -> None:
        self.local.photo_id, self.local.puts = photo_id, 0
        self.in_flight[threading.get_ident()] = photo_id

    def watch(self) -> None:
        """Lambda's two hard limits: the invocation's timeout and the function's memory."""
        with open("/proc/self/statm") as statm:  # noqa: PTH123 - read again and again, kept open
            while True:
                time.sleep(0.02)
                started = self.invocation_started
                if started is not None and time.monotonic() - started > self.timeout_seconds:
                    self.kill(
                        "lambda_timeout",
                        seconds=round(time.monotonic() - started, 2),
                        photos=sorted(set(self.in_flight.values())),
                    )
                statm.seek(0)
                resident = int(statm.read().split()[1]) * PAGE
                if resident > self.memory_bytes:
                    self.kill(
                        "out_of_memory",
                        resident_mb=resident // 2**20,
                        photos=sorted(set(self.in_flight.values())),
                    )


def install(chaos: Chaos) -> None:
    """Wrap the real adapters (class attributes: bootstrap builds them as it always does)."""
    from photo_publish.adapters import storage
    from photo_publish.publish import repository, service

    repository.claim = _before_claim(chaos, repository.claim)  # type: ignore[assignment]
    service.render = _while_rendering(chaos, service.render)  # type: ignore[attr-defined]
    storage.S3Store.put_variant = _between_puts(chaos, storage.S3Store.put_variant)  # type: ignore[method-assign]
    _inside_commit(chaos)
    _engines()


def _before_claim(chaos: Chaos, claim: Callable[..., Any]) -> Callable[..., Any]:
    def chaotic_claim(connection: Any, photo_id: Any, **kwargs: Any) -> Any:
        chaos.working_on(str(photo_id))
        if chaos.arrive("before_claim"):
            chaos.kill("before_claim", str(photo_id))
        return claim(connection, photo_id, **kwargs)

    return chaotic_claim


def _while_rendering(chaos: Chaos, render: Callable[..., Any]) -> Callable[..., Any]:
    def chaotic_render(stream: Any, options: Any, **kwargs: Any) -> Any:
        photo_id = chaos.photo_id()
        if not chaos.arrive("render"):
            return render(stream, options, **kwargs)
        assert chaos.arm is not None
        threading.Timer(float(chaos.arm.detail or 0), chaos.kill, ("render", photo_id)).start()
        try:
            return render(stream, options, **kwargs)
        finally:
            chaos.kill("render", photo_id, finished=True)

    return chaotic_render


def _between_puts(chaos: Chaos, put: Callable[..., None]) -> Callable[..., None]:
    def chaotic_put(self: Any, key: str, data: bytes, content_type: str) -> None:
        put(self, key, data, content_type)
        found = VARIANT_PHOTO.search(key)
        photo_id = found.group(1) if found else None
        emit(chaos="put", photo_id=photo_id, key=key)
        chaos.local.puts = getattr(chaos.local, "puts", 0) + 1
        if chaos.local.puts == 1 and chaos.arrive("between_puts"):
            chaos.kill("between_puts", photo_id)

    return chaotic_put


def _inside_commit(chaos: Chaos) -> None:
    """The publish transaction, seen through SQLAlchemy's engine events."""

    def after_cursor_execute(connection: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith(PUBLISH_UPDATE) and "visibility" in statement and chaos.arrive("commit"):
            assert chaos.arm is not None
            if chaos.arm.detail == "after_update":
                chaos.kill("commit", chaos.photo_id(), point="after_update")
            connection.info["chaos_commit"] = (chaos.arm.detail, chaos.photo_id())

    def before_commit(connection: Any) -> None:
        point, photo_id = connection.info.pop("chaos_commit", (None, None))
        if point == "before_commit":
            chaos.kill("commit", photo_id, point=point)
        elif point == "during_commit":
            # Races the COMMIT on the wire: it may land or not, and the worker never learns which.
            threading.Timer(0.001, chaos.kill, ("commit", photo_id), {"point": point}).start()

    event.listen(Engine, "after_cursor_execute", after_cursor_execute)
    event.listen(Engine, "commit", before_commit)


def _engines() -> None:
    """A line per engine the container builds: one is the design (issue 11 item 3 found two)."""
    seen: set[int] = set()
    lock = threading.Lock()

    def engine_connect(connection: Any) -> None:
        # By pool: an engine's execution_options() copies share it, separate engines do not.
        pool = id(connection.engine.pool)
        with lock:
            if pool in seen:
                return
            seen.add(pool)
        emit(chaos="engine", engines=len(seen), thread=threading.current_thread().name)

    event.listen(Engine, "engine_connect", engine_connect)


def lambda_like(handler: Handler, chaos: Chaos) -> Handler:
    """The invocation as Lambda times it; the `before_delete` kill after it answered."""

    def invoke(event: dict[str, Any], context: Any) -> dict[str, Any]:
        records = event.get("Records", [])
        # Each receive of each message, and how its run ended (answered, or not at all: killed), so
        # that the checker can tell a message the redrive took from runs that never finished.
        emit(
            chaos="batch",
            messages=[[r["messageId"], int(r["attributes"]["ApproximateReceiveCount"])] for r in records],
        )
        chaos.invocation_started = time.monotonic()
        try:
            result = handler(event, context)
        except Exception:
            emit(chaos="answered", failed=[r["messageId"] for r in records])
            raise
        finally:
            chaos.invocation_started = None
            chaos.in_flight.clear()
        emit(
            chaos="answered", failed=[item["itemIdentifier"] for item in result.get("batchItemFailures", [])]
        )
        if chaos.arrive("before_delete"):
            chaos.kill("before_delete", records=len(event.get("Records", [])))
        return result

    return invoke


class Stop:
    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._stop)

    def _stop(self, *_: Any) -> None:
        self.requested = True


def poller_client() -> Any:
    """The event source mapping's own SQS client (through the fault proxy, like the functions')."""
    return boto3.client(
        "sqs",
        config=Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=3, read_timeout=20),
    )


def worker(args: argparse.Namespace) -> None:
    # A bomb that gets past the code's limits must not take the machine: Lambda's own limit is
    # enforced by the watchdog (out_of_memory), this cap only guards the host.
    cap = args.address_space_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    chaos = Chaos(
        Arm.decode(args.arm) if args.arm else None,
        timeout_seconds=args.timeout,
        memory_mb=args.memory_mb,
    )
    install(chaos)
    signal.signal(signal.SIGUSR1, lambda *_: setattr(chaos, "arm", None))  # the drain: no more kills
    stop = Stop()
    threading.Thread(target=chaos.watch, daemon=True).start()
    process = handlers.load("process")
    emit(chaos="start", arm=args.arm, slot=args.slot, incarnation=args.incarnation)
    poller = Poller(
        poller_client(),
        os.environ["PROCESS_QUEUE_URL"],
        args.queue_arn,
        lambda_like(process.lambda_handler, chaos),
        batch_size=args.batch_size,
        wait_seconds=1,
        timeout_seconds=args.timeout,
    )
    while not stop.requested:
        try:
            poller.poll_once()
        except Exception as error:  # the event source mapping keeps polling whatever one call did
            emit(chaos="poller_error", error=repr(error)[:500])
            time.sleep(0.2)
    emit(chaos="stop", arrivals=dict(chaos.arrivals))


def sweeper(args: argparse.Namespace) -> None:
    """The sweep function on its schedule (EventBridge's rate(), shortened), in its own container."""
    sweep = handlers.load("sweep")
    stop = Stop()
    jitter = random.Random(args.slot)
    emit(chaos="start", sweep=args.slot)
    while not stop.requested:
        try:
            sweep.lambda_handler(
                {"source": "aws.events", "detail-type": "Scheduled Event"},
                LambdaContext(args.timeout, function_name="photo-publish-sweep"),
            )
        except Exception as error:  # a failed run is an error metric; the schedule runs it again
            emit(chaos="sweep_error", error=repr(error)[:500])
        time.sleep(args.every * jitter.uniform(0.8, 1.2))
    emit(chaos="stop")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="role", required=True)
    work = sub.add_parser("worker")
    work.add_argument("--slot", type=int, required=True)
    work.add_argument("--incarnation", type=int, required=True)
    work.add_argument("--arm", default="")
    work.add_argument("--queue-arn", required=True)
    work.add_argument("--batch-size", type=int, default=5)
    work.add_argument("--timeout", type=float, required=True)
    work.add_argument("--memory-mb", type=int, default=1769)
    work.add_argument("--address-space-mb", type=int, default=4096)
    sweep = sub.add_parser("sweep")
    sweep.add_argument("--slot", type=int, required=True)
    sweep.add_argument("--every", type=float, required=True)
    sweep.add_argument("--timeout", type=float, default=30)
    args = parser.parse_args()
    worker(args) if args.role == "worker" else sweeper(args)


if __name__ == "__main__":
    main()
