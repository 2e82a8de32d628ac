"""Issues #7 (part 4) and #17 (item 3): the whole warm delivery of a batch, on loopback and with
AWS's latencies, against the original worker's core alone.

A batch is five photographs, as many records as the template's BatchSize (5): the corpus' 8 to 24 MP
JPEGs (benchmarks/corpus.py, `large`), and five 1 to 2 MP JPEGs made from the same photograph with
the same traits (`small`). For each, per round, after one warm-up batch of every peer:
- delivery: the process handler (functions/process/app.py), warm, in this process, on a real SQS
  event: each photo registered (rows as the upload API writes them) and uploaded to S3, S3's
  notifications received from SQS and turned into the event Lambda would build. Timed: the
  handler's call, which streams each original from S3, renders, writes both variants to S3, claims
  and commits against PostgreSQL, and hands the event to EventBridge. Every record must publish, or
  the benchmark stops. Run on two networks:
    loopback: moto's server and PostgreSQL as they are, every call nearly free;
    latency:  through devkit.faultproxy's latency proxies (`--latency aws`): S3 GetObject's first
              byte 30 ms and 100 MB/s, PutObject 50 ms, SQS and EventBridge 10 ms, 1 ms a database
              round trip;
  and three behaviours, the changes of issue 17 one at a time:
    before:   two records at a time, each putting its variants one after the other;
    puts:     the same, the two puts at once (PhotoService._put_variants);
    after:    the two puts at once, and RECORD_CONCURRENCY records in flight (BENCH_RECORDS, 4) of
              which RENDER_CONCURRENCY (2) render: the others read, claim, put and commit meanwhile
              (the functions' defaults).
  Each peer is the same handler with its own warm clients and pool (bootstrap's objects built once
  per peer, swapped in for its turn).
- render: the same photos' bytes rendered in this process by photo_publish.image.pipeline.render, two
  at a time (a thread pool of 2), with the handler's options: the delivery's rendering alone.
- sharp: the original worker's core, sharp on Node.js rendering the same photos with two
  pipelines each, two jobs at a time (BullMQ's concurrency 2), one warm process per round
  (benchmarks/sharp_queue.mjs; it times its second batch, the photos already in memory).

Reported per corpus: medians of batch seconds; delivery / sharp (target: at most 1.0, with the
latencies); the share of the delivery outside rendering (1 - render / delivery); the product's own
CPU outside rendering (this process' CPU seconds in the handler's call minus in the render alone)
apart from the stand-ins' CPU seconds in the same call (moto's server, PostgreSQL's postmaster and
backends, the proxies: from /proc/<pid>/stat), which AWS would spend on its own machines but here
take the two cores the renders run on; and from each record's log line its median steps (claim,
render with the S3 read it streams, the wait for a render slot, store, commit).

PostgreSQL is the embedded one (or DATABASE_URL's, whose CPU is then read only if it runs here).
Results go to .local/bench-results/delivery.json. BENCH_ROUNDS sets the rounds (default 5).
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from benchmarks.corpus import photos, small_photos
from devkit import handlers, stack, uploads
from devkit.demo import BUCKET, STAGE, Stack, start_stack
from devkit.faultproxy import database_through, database_upstream, latency_proxy
from devkit.poller import LambdaContext, sqs_event
from photo_publish.image.pipeline import RenderOptions, render
from photo_publish.settings import Settings

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
# The functions' default unless told otherwise.
RECORDS = int(
    os.environ.get("BENCH_RECORDS")
    or Settings(database_url="postgresql://bench", photo_bucket="bench", stage="bench").record_concurrency
)
CONCURRENCY = 2
RESULTS = stack.ROOT / ".local" / "bench-results"
SHARP = stack.ROOT / ".local" / "bench-node" / "node_modules" / "sharp"
SHARP_SCRIPT = Path(__file__).with_name("sharp_queue.mjs")
TICKS = os.sysconf("SC_CLK_TCK")
NETWORKS = ("loopback", "latency")
# name: (RECORD_CONCURRENCY, RENDER_CONCURRENCY, puts at once)
BEHAVIOURS = {"before": (2, 2, False), "puts": (2, 2, True), "after": (RECORDS, 2, True)}
STEPS = ("claim", "render", "wait", "store", "commit")


@contextmanager
def moto_process() -> Iterator[int]:
    """moto's server in its own process on a free loopback port; yields its pid."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("moto's server did not start") from None
                time.sleep(0.1)
        os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{port}"
        yield server.pid
    finally:
        os.environ.pop("AWS_ENDPOINT_URL", None)
        server.terminate()
        server.wait()


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int, *, children: bool = False) -> float:
    """A process' CPU seconds (utime + stime); with `children`, its live children's too and those
    of its children that ended (cutime + cstime): PostgreSQL's backends."""
    fields = _stat(pid)
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    child = _stat(int(entry.name))
                except OSError:
                    continue
                if int(child[1]) == pid:
                    ticks += int(child[11]) + int(child[12])
    return ticks / TICKS


def postmaster_pid(engine: Engine) -> int | None:
    """The PostgreSQL server's pid when it runs on this machine (the parent of our backend)."""
    with engine.connect() as connection:
        backend = connection.scalar(text("SELECT pg_backend_pid()"))
    try:
        return int(_stat(int(backend))[1])
    except OSError:
        return None


@dataclass
class StandIns:
    """The processes that play AWS here, and their CPU seconds."""

    moto: int
    postgres: int | None
    proxies: list[int] = field(default_factory=list)

    def cpu(self) -> dict[str, float]:
        return {
            "moto": cpu_seconds(self.moto),
            "postgres": cpu_seconds(self.postgres, children=True) if self.postgres else 0.0,
            "proxies": sum(cpu_seconds(pid) for pid in self.proxies),
        }


class Steps(logging.Handler):
    """Collects the steps_ms of each published record's "photo processed" line."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[dict[str, int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "photo processed" and getattr(record, "steps_ms", None):
            self.records.append(record.steps_ms)  # type: ignore[attr-defined]


def factories() -> list[Any]:
    """bootstrap's once-per-container factories (imported once the stack's environment is set:
    Powertools reads it on import)."""
    from photo_publish import bootstrap

    return [value for value in vars(bootstrap).values() if isinstance(value, bootstrap._Once)]


@dataclass
class Peer:
    """One network and behaviour: bootstrap's objects as built for it, swapped in for its turn."""

    network: str
    behaviour: str
    built: dict[Any, dict[Any, Any]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.network}/{self.behaviour}"

    def use(self) -> None:
        for factory in factories():
            factory._built.clear()
            factory._built.update(self.built.get(factory, {}))


def build_peer(network: str, behaviour: str, environment: dict[str, str]) -> Peer:
    from photo_publish import bootstrap
    from photo_publish.observability import metrics

    records, renders, puts_at_once = BEHAVIOURS[behaviour]
    os.environ.update(environment | {"RECORD_CONCURRENCY": str(records), "RENDER_CONCURRENCY": str(renders)})
    bootstrap.reset()
    if not puts_at_once:
        # The behaviour before issue 17: each variant put after the other, the first failure ending it.
        service = bootstrap.delivery(metrics)._service

        def one_after_the_other(puts: Sequence[tuple[str, bytes, str]]) -> None:
            for put in puts:
                service._store.put_variant(*put)

        service._put_variants = one_after_the_other  # type: ignore[method-assign]
    peer = Peer(network, behaviour)
    bootstrap.delivery(metrics), bootstrap.batch_processor()
    peer.built = {factory: dict(factory._built) for factory in factories()}
    return peer


def receive(local: Stack, count: int) -> list[dict[str, Any]]:
    """The S3 notifications of `count` uploads, as Lambda's poller would receive them."""
    messages: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    while len(messages) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(messages)} of {count} notifications arrived")
        messages += local.sqs.receive_message(
            QueueUrl=local.queues.url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        ).get("Messages", [])
    return messages


@dataclass
class Timed:
    seconds: float
    cpu: float
    stand_ins: dict[str, float]


def deliver(local: Stack, process: Any, corpus: list[Path], stand_ins: StandIns) -> Timed:
    album_id = uuid.uuid4()
    for path in corpus:
        uploads.upload(
            local.engine,
            local.s3,
            BUCKET,
            STAGE,
            file_name=path.name,
            data=path.read_bytes(),
            album_id=album_id,
        )
    messages = receive(local, len(corpus))
    event = sqs_event(messages, local.queues.arn)
    before = stand_ins.cpu()
    cpu = time.process_time()
    started = time.perf_counter()
    with redirect_stdout(io.StringIO()):  # the metrics' EMF lines
        response = process.lambda_handler(event, LambdaContext(120))
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu
    after = stand_ins.cpu()
    if response != {"batchItemFailures": []}:
        raise RuntimeError(f"the batch did not publish: {response}")
    for message in messages:  # what the event source mapping does with a batch that succeeded
        local.sqs.delete_message(QueueUrl=local.queues.url, ReceiptHandle=message["ReceiptHandle"])
    return Timed(seconds, cpu, {name: after[name] - before[name] for name in after})


def render_alone(datas: list[bytes], options: RenderOptions) -> Timed:
    cpu = time.process_time()
    started = time.perf_counter()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(lambda data: render(io.BytesIO(data), options), datas))
    return Timed(time.perf_counter() - started, time.process_time() - cpu, {})


def sharp(corpus: list[Path]) -> float:
    out = subprocess.run(
        ["node", str(SHARP_SCRIPT), str(CONCURRENCY), *map(str, corpus)],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SHARP_PATH": str(SHARP)},
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])


def sharp_skipped() -> str | None:
    if shutil.which("node") is None:
        return "node is not on PATH"
    if not SHARP.exists():
        return (
            f"sharp is not installed (npm install --prefix {SHARP.parents[1].relative_to(stack.ROOT)} sharp)"
        )
    return None


@dataclass
class Runs:
    delivery: dict[str, list[Timed]] = field(default_factory=dict)
    steps: dict[str, list[dict[str, int]]] = field(default_factory=dict)
    render: list[Timed] = field(default_factory=list)
    sharp: list[float] = field(default_factory=list)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def change(where: str, label: str, old: float, new: float) -> str:
    gain = 1 - new / old
    return f"  {where}: {label}: {old:.3f} s -> {new:.3f} s ({-gain:+.0%})  {'FASTER' if gain > 0.02 else 'NO GAIN'}"


@dataclass
class Bench:
    """The running stack, the handler under test and what watches it."""

    local: Stack
    process: Any
    stand_ins: StandIns
    steps: Steps
    options: RenderOptions
    peers: list[Peer] = field(default_factory=list)

    def warm(self, corpora: dict[str, list[Path]]) -> None:
        """Each peer's clients and connections, and libvips."""
        for peer in self.peers:
            peer.use()
            for corpus in corpora.values():
                deliver(self.local, self.process, corpus, self.stand_ins)
        for corpus in corpora.values():
            render_alone([path.read_bytes() for path in corpus], self.options)

    def round(self, corpus: list[Path], run: Runs, with_sharp: bool) -> None:
        """Every peer's delivery of the batch, then the render alone and sharp's."""
        for peer in self.peers:
            peer.use()
            self.steps.records.clear()
            run.delivery.setdefault(peer.name, []).append(
                deliver(self.local, self.process, corpus, self.stand_ins)
            )
            run.steps.setdefault(peer.name, []).extend(self.steps.records)
        run.render.append(render_alone([path.read_bytes() for path in corpus], self.options))
        if with_sharp:
            run.sharp.append(sharp(corpus))

    def close(self) -> None:
        from photo_publish import bootstrap

        for peer in self.peers:
            peer.use()
            bootstrap.engine().dispose()
        bootstrap.reset()
        self.local.engine.dispose()


@contextmanager
def bench() -> Iterator[Bench]:
    """PostgreSQL, moto's server, the latency proxies in front of both, the stack and its peers."""
    with ExitStack() as exits:
        url = exits.enter_context(
            stack.database(stack.ROOT / ".local" / "postgres", name="photo_publish_bench_delivery")
        )
        moto_pid = exits.enter_context(moto_process())
        exits.enter_context(stack.aws_endpoint())
        local = start_stack(url)
        stack.drop_test_events(local.sqs, local.queues.url)
        http_proxy = exits.enter_context(latency_proxy(os.environ["AWS_ENDPOINT_URL"]))
        database_proxy = exits.enter_context(latency_proxy(database_upstream(url)))
        stand_ins = StandIns(moto_pid, postmaster_pid(local.engine), [http_proxy.pid, database_proxy.pid])
        environments = {
            "loopback": {"AWS_ENDPOINT_URL": os.environ["AWS_ENDPOINT_URL"], "DATABASE_URL": url},
            "latency": {
                "AWS_ENDPOINT_URL": http_proxy.url,
                "DATABASE_URL": database_through(url, database_proxy.url),
            },
        }
        # After start_stack: the functions' Logger and Metrics read its environment when imported.
        process = handlers.load("process")
        from photo_publish.publish.service import render_options

        steps = Steps()
        function_logger = logging.getLogger(os.environ["POWERTOOLS_SERVICE_NAME"])
        for handler in function_logger.handlers:
            if isinstance(handler, logging.StreamHandler):
                handler.setStream(io.StringIO())
        function_logger.addHandler(steps)
        running = Bench(local, process, stand_ins, steps, render_options(local.settings))
        running.peers = [
            build_peer(network, behaviour, environments[network])
            for network in NETWORKS
            for behaviour in BEHAVIOURS
        ]
        try:
            yield running
        finally:
            running.close()


def main() -> None:
    corpora = {"large": photos(), "small": small_photos()}
    skipped = sharp_skipped()
    if skipped:
        print(f"SKIPPED peer sharp: {skipped}")
    runs = {name: Runs() for name in corpora}
    with bench() as running:
        running.warm(corpora)
        for round_number in range(ROUNDS):
            for name, corpus in corpora.items():
                running.round(corpus, runs[name], with_sharp=not skipped)
            print(f"  round {round_number + 1} of {ROUNDS} done", file=sys.stderr, flush=True)
    summary = report(corpora, runs, skipped)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "delivery.json").write_text(json.dumps(summary, indent=1))
    print(f"written {(RESULTS / 'delivery.json').relative_to(stack.ROOT)}")


def report(corpora: dict[str, list[Path]], runs: dict[str, Runs], skipped: str | None) -> dict[str, Any]:
    print(
        f"whole warm delivery of a batch of 5 photos, {CONCURRENCY} renders at a time, median of {ROUNDS} "
        f"interleaved rounds, {os.cpu_count()} CPUs; 'after' = {RECORDS} records in flight"
    )
    print(
        "own CPU: this process' CPU s in the handler's call minus in the render alone; moto, PG, proxy:"
        " the stand-ins' CPU s in the same call (per batch)"
    )
    verdicts: list[str] = []
    results: dict[str, Any] = {}
    for name, run in runs.items():
        render_s, render_cpu = median([t.seconds for t in run.render]), median([t.cpu for t in run.render])
        sharp_s = median(run.sharp)
        print(
            f"{name} corpus ({', '.join(p.name for p in corpora[name])}): render alone {render_s:.3f} s "
            f"({render_cpu:.2f} CPU s), sharp's render alone {sharp_s:.3f} s"
        )
        print(
            f"  {'peer':18} {'batch s':>8} {'x sharp':>8} {'outside':>8} {'own CPU':>8}"
            f" {'moto':>6} {'PG':>6} {'proxy':>6}   per record ms (median): " + " ".join(STEPS)
        )
        figures: dict[str, Any] = {}
        for peer, timed in run.delivery.items():
            seconds = median([t.seconds for t in timed])
            own = median([t.cpu for t in timed]) - render_cpu
            stand = {k: median([t.stand_ins[k] for t in timed]) for k in timed[0].stand_ins}
            by_step = {step: median([r.get(step, 0) for r in run.steps.get(peer, [])]) for step in STEPS}
            figures[peer] = {
                "seconds": seconds,
                "x_sharp": seconds / sharp_s,
                "outside": 1 - render_s / seconds,
                "own_cpu_outside_render": own,
                "stand_ins_cpu": stand,
                "steps_ms": by_step,
            }
            print(
                f"  {peer:18} {seconds:8.3f} {seconds / sharp_s:8.2f} {1 - render_s / seconds:8.0%}"
                f" {own:8.3f} {stand['moto']:6.2f} {stand['postgres']:6.2f} {stand['proxies']:6.2f}   "
                + " ".join(f"{by_step[s]:.0f}" for s in STEPS)
            )
        results[name] = {
            "photos": [p.name for p in corpora[name]],
            "render": render_s,
            "render_cpu": render_cpu,
            "sharp": sharp_s,
            "peers": figures,
            "runs": {
                "delivery": {p: [t.__dict__ for t in ts] for p, ts in run.delivery.items()},
                "render": [t.__dict__ for t in run.render],
                "sharp": run.sharp,
            },
        }
        for network in NETWORKS:
            before, puts, after = (figures[f"{network}/{b}"]["seconds"] for b in BEHAVIOURS)
            verdicts += [
                change(f"{name}, {network}", "the two puts at once", before, puts),
                change(f"{name}, {network}", f"{RECORDS} records in flight, 2 renders", puts, after),
            ]
    if skipped:
        verdicts.insert(0, f"  delivery <= x1.00 sharp's render alone: NOT MEASURED ({skipped})")
    else:
        for name in runs:
            ratio = results[name]["peers"]["latency/after"]["x_sharp"]
            verdicts.insert(
                0,
                f"  {name}: delivery with AWS's latencies <= x1.00 sharp's render alone: x{ratio:.2f}"
                f"  {'MET' if ratio <= 1 else 'MISSED'}",
            )
    outside = results["large"]["peers"]["loopback/after"]["outside"]
    verdicts.append(
        f"  large, loopback: time outside rendering < 15%: {outside:.0%}  {'MET' if outside < 0.15 else 'MISSED'}"
    )
    print("targets (verdicts, not assertions)")
    print("\n".join(verdicts))
    large = results["large"]
    return {
        # report.py's cost per photo: the delivery as AWS would run it.
        "photos": large["photos"],
        "rounds": ROUNDS,
        "medians": {"delivery": large["peers"]["latency/after"]["seconds"], "sharp": large["sharp"]},
        "corpora": results,
        "verdicts": verdicts,
        "skipped": skipped,
    }


if __name__ == "__main__":
    main()
