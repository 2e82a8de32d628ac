"""`make demo` end to end, as a newcomer runs it: its own process, its own stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from devkit import stack


def test_the_demo_publishes_every_good_photo_and_reports_it(tmp_path: Path) -> None:
    # GIVEN a clean environment (no endpoint, no database named: the demo embeds both)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DATABASE_URL", "POWERTOOLS_"))}
    env |= {"DEMO_OUTPUT": str(tmp_path), "PYTHONPATH": "functions/process:shared:."}

    # WHEN the demo runs
    done = subprocess.run(
        [sys.executable, "-m", "devkit.demo"],
        check=False,
        cwd=stack.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )

    # THEN it finished and says where its report is
    assert done.returncode == 0, done.stderr[-3000:]
    assert "report:" in done.stdout
    # AND every good photo was published once, the broken one failed with its code, and every
    # second delivery answered `already`
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["photos"] == 14
    assert summary["published"] == 13
    assert summary["failed"] == {"DECODE_FAILED": 1}
    assert summary["outboxEvents"] == 14  # 13 photo.published, 1 photo.failed
    assert summary["already"] == 13
    # AND a subscriber of the bus received every outbox event once, each type, without waiting for
    # the relay: the process function handed each off right after its commit
    bus = summary["busEvents"]
    assert bus["byType"] == {"photo.published": 13, "photo.failed": 1}
    assert bus["everyOutboxRowOnce"] is True
    assert bus["handedOff"] == 14 and bus["relayed"] == 0
    received = json.loads((tmp_path / "events.json").read_text())
    assert {e["source"] for e in received} == {"photo-publish"}
    assert summary["photosPerSecond"] > 0
    # AND the report shows each photo with its two variants, fetched from S3
    page = (tmp_path / "report.html").read_text()
    assert page.count('<section class="photo') == 14
    assert "Events a subscriber of the bus received (14)" in page
    assert len(list((tmp_path / "variants").glob("*.webp"))) == 26
    # AND each published photo's placeholder beside it (its ThumbHash decoded, its average colour)
    assert len(list((tmp_path / "variants").glob("*-placeholder.png"))) == 13
    assert page.count('<span class="swatch" style="background:#') == 13
