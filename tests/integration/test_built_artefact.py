"""What `sam build` makes runs: the built functions, with their layers, under the Lambda's Python.

`sam build` (offline, no container; SAM's cache makes a repeat quick) builds the functions and the
layers into .aws-sam/build. A python3.12 subprocess then imports a built handler the way the Lambda
runtime lays it out: the function's folder first, then the layers' `python` folders (/opt/python),
then the runtime's own boto3 (/var/runtime), and nothing else (-I -S: no site-packages, no
PYTHONPATH, not this repository's `shared/`). The process function publishes a real photo against
the local stack (moto's server, embedded PostgreSQL); the sweep and the relay run on their
schedule's event.
"""

from __future__ import annotations

import json
import platform
import subprocess
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, insert, select

from devkit import poller, samples, stack, uploads
from photo_publish.adapters.models import OutboxEvent, Photo, PhotoVariant
from tests.conftest import BUCKET, STAGE, Infra
from tests.template.test_template import ROOT, python312, tool, tool_env

BUILD = ROOT / ".aws-sam" / "build"
# The vips layer the functions get on this machine's architecture (the template's parameter).
VIPS_LAYER = {"x86_64": "VipsLayerX8664", "aarch64": "VipsLayerArm64", "arm64": "VipsLayerArm64"}[
    platform.machine()
]
# What the Lambda python3.12 runtime has besides the standard library (/var/runtime).
RUNTIME_PACKAGES = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "six.py", "urllib3")

DRIVER = textwrap.dedent(
    """
    import json, resource, sys, time
    paths, mode = json.loads(sys.argv[1]), sys.argv[2]
    sys.path[:0] = paths
    if mode == "bytecode":
        # Each layer module's bytecode: this Python's format, and used without looking at the
        # source (unchecked hash), so no file time after zip and unzip can make it stale.
        import importlib.util, pathlib
        found = {"modules": 0, "missing": [], "other": []}
        for layer in paths[1:-1]:
            for source in pathlib.Path(layer).rglob("*.py"):
                found["modules"] += 1
                cached = pathlib.Path(importlib.util.cache_from_source(str(source)))
                if not cached.exists():
                    found["missing"].append(str(source))
                    continue
                header = cached.read_bytes()[:8]
                if header[:4] != importlib.util.MAGIC_NUMBER or int.from_bytes(header[4:], "little") != 1:
                    found["other"].append(str(cached))
        print(json.dumps(found))
        sys.exit()
    started = time.perf_counter()
    import app
    imported = time.perf_counter() - started

    class Context:
        function_name = "photo-publish-built"
        function_version = "$LATEST"
        memory_limit_in_mb = 1769
        invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:photo-publish-built"
        aws_request_id = "built-artefact-test"
        log_group_name = "/aws/lambda/photo-publish-built"
        log_stream_name = "local"
        deadline = time.monotonic() + 120

        def get_remaining_time_in_millis(self):
            return int((self.deadline - time.monotonic()) * 1000)

    result = app.lambda_handler(json.load(sys.stdin), Context()) if mode == "invoke" else None
    import pyvips, pi_heif, sqlalchemy, psycopg, photo_publish
    print(json.dumps({
        "python": list(sys.version_info[:2]),
        "import_seconds": imported,
        "result": result,
        "pyvips": pyvips.__version__,
        "libvips": pyvips.version(0) * 100 + pyvips.version(1),
        "from": {m.__name__: m.__file__ for m in (app, pyvips, pi_heif, sqlalchemy, psycopg, photo_publish)},
        "psycopg_impl": psycopg.pq.__impl__,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))
    """
)


@pytest.fixture(scope="module")
def build() -> dict[str, float]:
    """`sam build`, as `make build` runs it: python3.12 on PATH for SAM's python builder and the
    layers' bytecode. Cached by SAM: only what changed is built again."""
    python = python312()
    env = tool_env(PATH=f"{python.parent}:{tool_env()['PATH']}")
    started = time.monotonic()
    result = subprocess.run(
        [str(tool("sam")), "build", "--cached", "--parallel"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return {"seconds": time.monotonic() - started}


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """/var/runtime's packages (boto3 and its dependencies, pure Python), from this environment."""
    folder = tmp_path_factory.mktemp("var-runtime")
    site = Path(__import__("boto3").__file__).parent.parent
    for name in RUNTIME_PACKAGES:
        (folder / name).symlink_to(site / name)
    return folder


def lambda_path(function: str, runtime: Path) -> list[str]:
    """sys.path as the runtime has it: /var/task, /opt/python (both layers), /var/runtime."""
    return [
        str(BUILD / function),
        str(BUILD / "SharedLayer" / "python"),
        str(BUILD / VIPS_LAYER / "python"),
        str(runtime),
    ]


def run_built(
    function: str,
    runtime: Path,
    *,
    event: Any = None,
    env: dict[str, str] | None = None,
    compiled: bool = True,
    mode: str | None = None,
) -> dict[str, Any]:
    """Import (and with an event, invoke) a built handler under python3.12, in a fresh process."""
    flags = ["-I", "-S", "-B"]  # -B: the build stays as SAM made it (Lambda's folders are read-only)
    if not compiled:
        # Bytecode looked for only in an empty folder, and never written: every module compiled.
        flags += ["-X", f"pycache_prefix={runtime.parent / 'no-bytecode'}"]
    result = subprocess.run(
        [str(python312()), *flags, "-c", DRIVER, json.dumps(lambda_path(function, runtime)),
         mode or ("invoke" if event is not None else "import")],
        input=json.dumps(event),
        env=env or {"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-6000:]
    output: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return output


def function_env(infra: Infra) -> dict[str, str]:
    """The environment the template gives the functions, pointing at this test's stack."""
    import os

    env = infra.settings.environment()
    env |= {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    env |= {
        "PATH": "/usr/bin:/bin",
        "POWERTOOLS_SERVICE_NAME": "photo-publish",
        "POWERTOOLS_METRICS_NAMESPACE": "PhotoPublishTest",
        "POWERTOOLS_LOG_LEVEL": "WARNING",
        "MALLOC_ARENA_MAX": "2",
    }
    return env


def test_the_built_layers_hold_python312_bytecode_and_the_pinned_packages(
    build: dict[str, float], runtime: Path
) -> None:
    # GIVEN the built layers: every module compiled by python3.12, used as it is
    bytecode = run_built("ProcessFunction", runtime, mode="bytecode")
    assert bytecode["modules"] > 500  # some 850: a floor an empty or half-built layer misses
    assert bytecode["missing"] == [] and bytecode["other"] == []

    # WHEN each built handler is imported by python3.12 with the layers
    for function in ("ProcessFunction", "SweepFunction", "RelayFunction"):
        loaded = run_built(function, runtime)

        # THEN every module comes from the build, at the pinned versions
        assert loaded["python"] == [3, 12]
        for module, path in loaded["from"].items():
            assert path.startswith(str(BUILD)), f"{module} imported from {path}"
        assert loaded["from"]["photo_publish"].startswith(str(BUILD / "SharedLayer"))
        assert loaded["pyvips"] == "3.2.0"  # not an older pyvips that had a wheel
        assert loaded["libvips"] >= 818
        assert loaded["psycopg_impl"] == "binary"


def test_each_vips_layer_holds_native_code_of_its_architecture_only(build: dict[str, float]) -> None:
    # Only this machine's layer can be imported here; the other one is checked by its ELF headers.
    machines = {"VipsLayerX8664": 0x3E, "VipsLayerArm64": 0xB7}  # EM_X86_64, EM_AARCH64
    for layer, machine in machines.items():
        found = set()
        for library in (BUILD / layer / "python").rglob("*.so*"):
            header = library.read_bytes()[:20]
            if header[:4] == b"\x7fELF":
                found.add(int.from_bytes(header[18:20], "little"))
        assert found == {machine}, (layer, found)


def test_the_built_process_function_publishes_a_jpeg_and_an_iphone_heic(
    build: dict[str, float], runtime: Path, infra: Infra, db: Engine
) -> None:
    # GIVEN a JPEG and an iPhone-style HEIC (HEVC, irot + EXIF 6, Display P3) uploaded as the API
    # does, and their S3 notifications received from the queue
    heic = samples.heic(samples.photograph("Wood.jpg"), 6, profile="p3")
    shots = [
        uploads.upload(db, infra.s3, BUCKET, STAGE, file_name=name, data=data)
        for name, data in (
            ("Lady Bird.jpg", (samples.IMAGES / "LadyBird.jpg").read_bytes()),
            ("IMG_0001.HEIC", heic),
        )
    ]
    messages: list[Any] = []
    while len(messages) < len(shots):
        messages += infra.sqs.receive_message(
            QueueUrl=infra.queues.url, MaxNumberOfMessages=10, WaitTimeSeconds=2, AttributeNames=["All"]
        ).get("Messages", [])
    event = poller.sqs_event(messages, infra.queues.arn)

    # WHEN the built process function handles them under python3.12 (pi-heif from the vips layer)
    invoked = run_built("ProcessFunction", runtime, event=event, env=function_env(infra))

    # THEN no record failed and both photos are published once, at their displayed size
    assert invoked["result"] == {"batchItemFailures": []}
    with db.connect() as connection:
        photos = {
            row.id: row
            for row in connection.execute(
                select(
                    Photo.id,
                    Photo.processing_state,
                    Photo.visibility,
                    Photo.entity_version,
                    Photo.width,
                    Photo.height,
                )
            )
        }
        variants = connection.execute(select(PhotoVariant.storage_key, PhotoVariant.content_type)).all()
        events = connection.scalar(select(func.count()).select_from(OutboxEvent))
    for shot in shots:
        assert tuple(photos[shot.photo_id])[1:4] == ("ready", "published", 2)
    assert (photos[shots[1].photo_id].width, photos[shots[1].photo_id].height) == (2560, 1920)
    assert events == 2
    # thumb, browse and the default ladder (640, 1280, and 2048: the browse's object) for each
    assert len(variants) == 2 * (2 + len(infra.settings.variant_widths))
    for key, content_type in variants:
        head = infra.s3.head_object(Bucket=BUCKET, Key=key)
        assert head["ContentType"] == content_type == "image/webp"


def test_the_built_sweep_function_runs_on_its_schedule_event(
    build: dict[str, float], runtime: Path, infra: Infra
) -> None:
    scheduled = {
        "version": "0",
        "id": "53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa",
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "123456789012",
        "time": "2026-11-30T00:00:00Z",
        "region": "us-east-1",
        "resources": ["arn:aws:events:us-east-1:123456789012:rule/photo-publish-dev-sweep"],
        "detail": {},
    }
    invoked = run_built("SweepFunction", runtime, event=scheduled, env=function_env(infra))
    assert invoked["result"]["resentPending"] == 0
    assert invoked["result"]["outOfTime"] is False


def test_the_built_relay_function_puts_the_waiting_events_on_the_bus(
    build: dict[str, float], runtime: Path, infra: Infra, db: Engine
) -> None:
    # GIVEN a bus with a subscriber, and a published photo's event waiting in the outbox
    subscriber = stack.subscribe(
        stack.events_client(), infra.sqs, f"photo-publish-built-{uuid.uuid4().hex[:8]}"
    )
    infra.configure(event_bus_name=subscriber.bus_name)
    photo_id = uuid.uuid4()
    with db.begin() as connection:
        connection.execute(
            insert(OutboxEvent).values(
                aggregate_type="photo", aggregate_id=photo_id, event_type="photo.published",
                payload={"photoId": str(photo_id), "entityVersion": 2},
            )
        )  # fmt: skip

    # WHEN the built relay runs on its schedule's event
    scheduled = {"detail-type": "Scheduled Event", "source": "aws.events", "detail": {}}
    invoked = run_built("RelayFunction", runtime, event=scheduled, env=function_env(infra))

    # THEN the event reached the subscriber
    assert invoked["result"]["published"] == 1
    (envelope,) = stack.received(infra.sqs, subscriber.queue_url)
    assert envelope["detail"]["data"] == {"photoId": str(photo_id), "entityVersion": 2}


def test_a_cold_import_with_the_bytecode_beats_one_without(build: dict[str, float], runtime: Path) -> None:
    # A cold start imports everything, and /opt is read-only: bytecode missing from a layer would be
    # compiled again at every cold start.
    compiled = run_built("ProcessFunction", runtime)["import_seconds"]
    source = run_built("ProcessFunction", runtime, compiled=False)["import_seconds"]
    print(
        f"\nsam build {build['seconds']:.1f} s; process cold import {compiled:.2f} s, {source:.2f} s uncompiled"
    )
    assert compiled < source
