"""A stand-in for AWS's python3.12 Lambda base image, built offline when no real one is present.

`sam local invoke` builds its image FROM `public.ecr.aws/lambda/python:3.12-x86_64`; no image
registry is reachable here, so this module builds an image of that name from Debian's packages
(`debootstrap --variant=minbase bookworm`: Debian 12, the host's glibc), the runtime's Python 3.12
under /var/lang, awslambdaric and boto3 from PyPI under /var/runtime, and a bootstrap and
entrypoint that behave like AWS's (awslocal/runtime/). A real image of that name (pulled by a
user who can reach the registry) is left alone. The stand-in carries the digest of everything it
is made of as a label: the same inputs reuse it, changed ones rebuild it.

    python -m awslocal.image [--python /path/to/python3.12] [--rie /path/to/aws-lambda-rie]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNTIME_FILES = HERE / "runtime"
IMAGE = "public.ecr.aws/lambda/python:3.12-x86_64"
LABEL = "org.photo-publish.stand-in"
SUITE = "bookworm"
MIRROR = os.environ.get("DEBOOTSTRAP_MIRROR", "http://deb.debian.org/debian")
# The shared libraries the runtime's Python links against beyond minbase (ssl, ctypes, sqlite3,
# pyexpat, readline), and the CA bundle.
DEBIAN_PACKAGES = ("ca-certificates", "libssl3", "libffi8", "libsqlite3-0", "libexpat1", "libreadline8")
# What /var/runtime holds in AWS's image. Pinned: a new version is a new image.
RUNTIME_PACKAGES = ("awslambdaric==4.2.2", "boto3==1.44.8")
# The standard library's parts a Lambda runtime has no use for (AWS's image drops them too).
STDLIB_LEFT_OUT = ("test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages")
# AWS's image environment; LANG is C.UTF-8 because minbase has no en_US locale.
ENVIRONMENT = {
    "LANG": "C.UTF-8",
    "TZ": ":/etc/localtime",
    "PATH": "/var/lang/bin:/usr/local/bin:/usr/bin/:/bin:/opt/bin",
    "LD_LIBRARY_PATH": "/var/lang/lib:/lib64:/usr/lib64:/var/runtime:/var/runtime/lib:/var/task:/var/task/lib:/opt/lib",
    "LAMBDA_TASK_ROOT": "/var/task",
    "LAMBDA_RUNTIME_DIR": "/var/runtime",
}


def say(message: str) -> None:
    print(f"aws-local image: {message}", file=sys.stderr, flush=True)


def run(*args: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], check=True, text=True, **kwargs)  # type: ignore[call-overload, no-any-return]


def python_identity(python: Path) -> str:
    """What decides the runtime's Python: its version and build, and its prefix's libpython."""
    return run(
        python,
        "-c",
        "import sys, sysconfig; print(sys.version, sysconfig.get_config_var('LDLIBRARY'), sys.prefix)",
        capture_output=True,
    ).stdout.strip()


def digest(python: Path, rie: Path) -> str:
    """The content address of the stand-in: recipe, runtime files, Python, pins, emulator."""
    h = hashlib.sha256()
    for path in [Path(__file__), *sorted(RUNTIME_FILES.iterdir())]:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    h.update(python_identity(python).encode())
    h.update(json.dumps([SUITE, DEBIAN_PACKAGES, RUNTIME_PACKAGES, ENVIRONMENT]).encode())
    h.update(hashlib.sha256(rie.read_bytes()).digest())
    return h.hexdigest()[:24]


def present_label(image: str) -> str | None:
    """None: no such image; "": an image without the stand-in's label (a real one)."""
    found = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", image],
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0:
        return None
    labels = json.loads(found.stdout or "null") or {}
    return str(labels.get(LABEL, ""))


def build_root(root: Path, python: Path, rie: Path) -> None:
    include = ",".join(DEBIAN_PACKAGES)
    say(f"debootstrap --variant=minbase {SUITE} (about a minute with a near mirror)")
    run(
        "debootstrap",
        "--variant=minbase",
        f"--include={include}",
        SUITE,
        root,
        MIRROR,
        stdout=subprocess.DEVNULL,
    )
    # Nothing of apt's or the docs is needed to run a function.
    for junk in (
        "usr/share/doc",
        "usr/share/man",
        "usr/share/locale",
        "usr/share/info",
        "var/cache/apt",
        "var/lib/apt/lists",
    ):
        shutil.rmtree(root / junk, ignore_errors=True)

    say(f"the runtime's Python under /var/lang, from {python}")
    prefix = Path(run(python, "-c", "import sys; print(sys.prefix)", capture_output=True).stdout.strip())
    lang = root / "var/lang"
    (lang / "bin").mkdir(parents=True)
    shutil.copy2(prefix / "bin/python3.12", lang / "bin/python3.12")
    for name in ("python3", "python"):
        (lang / "bin" / name).symlink_to("python3.12")
    (lang / "lib").mkdir()
    for library in prefix.joinpath("lib").glob("libpython3*.so*"):
        shutil.copy2(library, lang / "lib" / library.name, follow_symlinks=False)
    shutil.copytree(
        prefix / "lib/python3.12",
        lang / "lib/python3.12",
        symlinks=True,
        ignore=lambda folder, names: [
            n for n in names if Path(folder) == prefix / "lib/python3.12" and n in STDLIB_LEFT_OUT
        ],
    )
    (lang / "lib/python3.12/site-packages").mkdir()
    (root / "etc/ld.so.conf.d/var-lang.conf").write_text("/var/lang/lib\n")
    run("chroot", root, "/sbin/ldconfig")

    say(f"{' '.join(RUNTIME_PACKAGES)} under /var/runtime (PyPI)")
    runtime = root / "var/runtime"
    run(
        sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
        "--root-user-action=ignore", "--target", runtime, "--only-binary=:all:", "--implementation", "cp",
        "--python-version", "3.12", "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
        *RUNTIME_PACKAGES,
    )  # fmt: skip
    shutil.rmtree(runtime / "bin", ignore_errors=True)
    for name in ("bootstrap", "bootstrap.py"):
        shutil.copy2(RUNTIME_FILES / name, runtime / name)
    shutil.copy2(RUNTIME_FILES / "lambda-entrypoint.sh", root / "lambda-entrypoint.sh")
    (root / "usr/local/bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(rie, root / "usr/local/bin/aws-lambda-rie")
    (root / "usr/local/bin/aws-lambda-rie").chmod(0o755)
    for folder in ("var/task", "opt"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    # The runtime's bytecode, made once here rather than at every cold start (read-only in Lambda).
    run("chroot", root, "/var/lang/bin/python3.12", "-m", "compileall", "-q", "-j", "0",
        "--invalidation-mode", "unchecked-hash", "/var/lang/lib/python3.12", "/var/runtime")  # fmt: skip


def build(python: Path, rie: Path, tag: str, label: str) -> None:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="aws-local-image-") as scratch:
        root = Path(scratch) / "root"
        build_root(root, python, rie)
        changes = [f"ENV {name}={value}" for name, value in ENVIRONMENT.items()]
        changes += ["WORKDIR /var/task", 'ENTRYPOINT ["/lambda-entrypoint.sh"]', f"LABEL {LABEL}={label}"]
        say(f"docker import as {tag}")
        tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        try:
            run(
                "docker",
                "import",
                *[a for c in changes for a in ("--change", c)],
                "-",
                tag,
                stdin=tar.stdout,
                stdout=subprocess.DEVNULL,
            )
        finally:
            tar.stdout.close()
            if tar.wait() != 0:
                raise RuntimeError("tar of the root file system failed")
    say(f"built {tag} in {time.monotonic() - started:.0f} s")


def ensure(python: Path, rie: Path, tag: str = IMAGE) -> str:
    """The image to run functions on: a real one if present, else the stand-in (built if stale)."""
    wanted = digest(python, rie)
    label = present_label(tag)
    if label == "":
        say(f"{tag} is a real image: used as it is")
        return "real"
    if label == wanted:
        say(f"{tag}: the stand-in is up to date ({wanted})")
        return "cached"
    if os.geteuid() != 0:
        raise SystemExit("building the stand-in needs root (debootstrap, chroot)")
    build(python, rie, tag, wanted)
    return "built"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", type=Path, default=Path(shutil.which("python3.12") or "python3.12"))
    parser.add_argument(
        "--rie", type=Path, required=True, help="the runtime interface emulator (SAM ships it)"
    )
    parser.add_argument("--tag", default=IMAGE)
    args = parser.parse_args()
    print(ensure(args.python, args.rie, args.tag))


if __name__ == "__main__":
    main()
