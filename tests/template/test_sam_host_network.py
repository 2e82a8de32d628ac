"""awslocal.sam: SAM's function containers moved onto the host's network, and its guard.

The adaptation replaces SAM internals; the guard must stop it, loudly, before SAM runs, when
those internals are not the ones it was written against. Run with SAM's own environment
(.venv-tools); `make test-aws-local` runs the adaptation for real.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from awslocal.sam import RIE, SamChanged, host_network_create_arguments
from tests.template.test_template import ROOT, tool


def sam_python(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"  # a file, so that inspect finds the source of what it defines
    script.write_text(textwrap.dedent(code))
    return subprocess.run(
        [str(tool("python")), str(script)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def sam_arguments() -> dict[str, object]:
    """What SAM 1.170's Container.create passes to docker for a function container."""
    return {
        "command": [],
        "working_dir": "/var/task",
        "volumes": {"/build/ProcessFunction": {"bind": "/var/task", "mode": "ro,delegated"}},
        "ports": {"8080": ("127.0.0.1", 5123)},
        "entrypoint": [RIE, "--log-level", "error"],
        "labels": {"sam.cli.container.type": "lambda"},
    }


def test_a_function_container_joins_the_host_network_with_the_emulator_on_loopback() -> None:
    arguments = host_network_create_arguments(sam_arguments())
    assert arguments["network_mode"] == "host"
    assert "ports" not in arguments  # nothing published, so nothing bound by Docker's proxy
    entrypoint = arguments["entrypoint"]
    assert isinstance(entrypoint, list)
    assert entrypoint[:3] == [RIE, "--runtime-interface-emulator-address", "127.0.0.1:5123"]
    assert entrypoint[3] == "--runtime-api-address"
    host, port = entrypoint[4].split(":")
    assert host == "127.0.0.1" and int(port) > 0 and int(port) != 9001
    assert entrypoint[5:] == ["--log-level", "error"]


def test_an_unexpected_container_is_refused() -> None:
    debugging = sam_arguments() | {"ports": {"8080": ("127.0.0.1", 5123), "5890": ("127.0.0.1", 5890)}}
    with pytest.raises(SystemExit, match="cannot be published"):
        host_network_create_arguments(debugging)
    with pytest.raises(SamChanged):
        host_network_create_arguments(sam_arguments() | {"entrypoint": ["/lambda-entrypoint.sh"]})
    with pytest.raises(SystemExit, match=r"must listen on 127\.0\.0\.1"):
        host_network_create_arguments(sam_arguments() | {"ports": {"8080": ("0.0.0.0", 5123)}})


def test_the_guard_passes_on_the_pinned_sam(tmp_path: Path) -> None:
    done = sam_python("from awslocal.sam import check_sam; check_sam(); print('ok')", tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_guard_fails_loudly_when_sams_internals_change(tmp_path: Path) -> None:
    # GIVEN SAM whose container creation is not the function the adaptation was written against
    done = sam_python(
        """
        from samcli.local.docker.container import Container
        original = Container.create
        def create(self, context):  # a SAM release that creates containers differently
            return original(self, context)
        Container.create = create
        from awslocal.sam import check_sam
        check_sam()
        """,
        tmp_path,
    )
    # THEN the adaptation refuses to run, naming what changed
    assert done.returncode != 0
    assert "SAM's internals changed" in done.stderr
    assert "samcli.local.docker.container:Container.create changed" in done.stderr


def test_the_guard_fails_on_another_sam_version(tmp_path: Path) -> None:
    done = sam_python(
        """
        import samcli
        samcli.__version__ = "1.171.0"
        from awslocal.sam import check_sam
        check_sam()
        """,
        tmp_path,
    )
    assert done.returncode != 0
    assert "SAM CLI is 1.171.0" in done.stderr
