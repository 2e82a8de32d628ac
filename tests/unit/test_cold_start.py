"""What each function loads before its first network call: its cold start pays for nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
READY = {
    "process": "bootstrap.delivery(app.metrics); bootstrap.batch_processor()",
    "sweep": "bootstrap.sweeper()",
    "relay": "bootstrap.relay()",
}
# Settings as the template gives them; nothing here connects (clients and engine connect on use).
ENVIRONMENT = {
    "DATABASE_URL": "postgresql+psycopg://photo_publish@127.0.0.1:1/photos",
    "PHOTO_BUCKET": "photo-publish-test",
    "STAGE": "test",
    "EVENT_BUS_NAME": "photo-publish-test",
    "AWS_DEFAULT_REGION": "us-east-1",
}


# The ORM (about 40 ms on top of SQLAlchemy Core, python3.12) and Powertools' batch and data class packages
# (asyncio and 40 event types): what issue 17 took out of every cold start.
NEVER_AT_COLD_START = {
    "sqlalchemy.orm",
    "photo_publish.adapters.models",
    "aws_lambda_powertools.utilities.batch",
    "aws_lambda_powertools.utilities.data_classes",
}


def loaded_modules(function: str) -> set[str]:
    code = f"import sys, app; from photo_publish import bootstrap; {READY[function]}; print(*sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=os.environ | ENVIRONMENT | {"PYTHONPATH": f"{ROOT / 'functions' / function}:{ROOT / 'shared'}"},
        capture_output=True,
        text=True,
        check=True,
    )
    return set(result.stdout.split())


def packages(modules: set[str]) -> set[str]:
    return {name.partition(".")[0] for name in modules}


@pytest.mark.parametrize(
    ("function", "needed", "not_needed"),
    [
        # pydantic (about 150 ms here) and the X-Ray SDK (about 450 ms) are gone from both.
        # numpy comes with the first placeholder (thumbhash), not with the cold start.
        (
            "process",
            {"pyvips", "sqlalchemy", "psycopg", "boto3"},
            {"pydantic", "aws_xray_sdk", "PIL", "numpy"},
        ),
        # The sweep never renders: no libvips.
        (
            "sweep",
            {"sqlalchemy", "psycopg", "boto3"},
            {"pydantic", "aws_xray_sdk", "PIL", "pyvips"},
        ),
        # Nor does the relay.
        (
            "relay",
            {"sqlalchemy", "psycopg", "boto3"},
            {"pydantic", "aws_xray_sdk", "PIL", "pyvips"},
        ),
    ],
)
def test_a_function_made_ready_loads_what_it_needs_and_nothing_else(
    function: str, needed: set[str], not_needed: set[str]
) -> None:
    # GIVEN a fresh interpreter, as at a Lambda cold start
    # WHEN the function's handler is imported and its first invocation's objects are made
    loaded = loaded_modules(function)

    # THEN its own work is loaded, and none of what it does not use
    assert needed <= packages(loaded)
    assert not not_needed & packages(loaded)


@pytest.mark.parametrize("function", ["process", "sweep", "relay"])
def test_a_function_made_ready_loads_no_orm_and_no_powertools_event_classes(function: str) -> None:
    # GIVEN a fresh interpreter, as at a Lambda cold start
    # WHEN the function's handler is imported and its first invocation's objects are made
    loaded = loaded_modules(function)

    # THEN its statements are Core, and it reads its events without Powertools' classes
    assert not NEVER_AT_COLD_START & loaded
