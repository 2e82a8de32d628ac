"""SAM CLI with two adaptations: host networking on loopback, and its image reused while unchanged.

    PYTHONPATH=. .venv-tools/bin/python -m awslocal.sam local invoke ProcessFunction -e EVENT \\
        --docker-network host --skip-pull-image ...

1. **Host networking** (with `--docker-network host`). SAM 1.170 creates every function container
   on Docker's default bridge and reaches the runtime interface emulator through a port it
   publishes; `--docker-network host` only skips joining a second network. Here (SPEC 15) there
   is no bridge and nothing listens on all interfaces: the container is created in the host's
   network, without published ports, and the emulator is told to listen on the loopback port SAM
   picked for it (`--runtime-interface-emulator-address`) and to serve the Runtime API on another
   free loopback port (`--runtime-api-address`; its default, 127.0.0.1:9001, would collide
   between two containers sharing the host's network).
2. **Image reuse.** With layers defined in the template, SAM builds its image (base + emulator +
   layers) again at every `sam local invoke`: 2.6 s of a 4.3 s invoke here with Docker's build
   cache warm, 10.6 s with it cold (docs/dev/local-aws.md, "Invoke time"). The built image is
   kept under a tag that is the digest of its inputs (the base image's id, the layers' files:
   names, sizes, modification times; the emulator; the architecture) and reused while they are
   unchanged; `sam build` rewriting a layer changes the digest.

Both replace SAM internals, so `check_sam()` fails loudly, before SAM runs, when the SAM version
or the source of a function the adaptation relies on is not the one it was written against.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import socket
import sys
from pathlib import Path
from typing import Any

SAM_VERSION = "1.170.0"
# sha256 of the source of each SAM function whose behaviour the adaptation assumes (see check_sam).
EXPECTED_SOURCES = {
    "samcli.local.docker.container:Container.create": "836dae279ffb1eda6d4f88348b20a642",
    "samcli.local.docker.lambda_container:LambdaContainer._get_default_entry_point": "5b25e4f1cf954944e4b1a6182d4406e8",
    "samcli.local.docker.lambda_image:LambdaImage.build": "8194ab2935a0a2f2026d7bc4891308d7",
    "samcli.local.docker.lambda_image:LambdaImage._build_image": "3c23e424e0b130388c789d68dc24ce65",
}
RIE = "/var/rapid/aws-lambda-rie"
LOOPBACK = "127.0.0.1"
CACHE_REPOSITORY = "photo-publish/sam-image-cache"


class SamChanged(SystemExit):
    """SAM's internals are not what the adaptation was written against."""


def _resolve(qualified: str) -> Any:
    module_name, _, attribute_path = qualified.partition(":")
    target: Any = __import__(module_name, fromlist=["_"])
    for part in attribute_path.split("."):
        target = getattr(target, part)
    return target


def source_digest(qualified: str) -> str:
    return hashlib.sha256(inspect.getsource(_resolve(qualified)).encode()).hexdigest()[:32]


def check_sam() -> None:
    """Fail unless SAM is the pinned version with the very functions the adaptation replaces."""
    import samcli

    problems = []
    if samcli.__version__ != SAM_VERSION:
        problems.append(f"SAM CLI is {samcli.__version__}, the adaptation was written for {SAM_VERSION}")
    for qualified, expected in EXPECTED_SOURCES.items():
        try:
            found = source_digest(qualified)
        except (ImportError, AttributeError, OSError, TypeError) as error:
            problems.append(f"{qualified} is gone ({error})")
            continue
        if found != expected:
            problems.append(f"{qualified} changed (source sha256 {found}, expected {expected})")
    from docker.models.containers import ContainerCollection

    if list(inspect.signature(ContainerCollection.create).parameters) != [
        "self",
        "image",
        "command",
        "kwargs",
    ]:
        problems.append("docker's ContainerCollection.create(self, image, command=None, **kwargs) changed")
    if problems:
        raise SamChanged(
            "awslocal.sam: SAM's internals changed under the host-network adaptation; re-read them "
            "and update awslocal/sam.py (and its EXPECTED_SOURCES):\n  " + "\n  ".join(problems)
        )


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def host_network_create_arguments(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A SAM function container's creation arguments, moved onto the host's network (loopback)."""
    ports = dict(kwargs.pop("ports", None) or {})
    rapid = ports.pop("8080", None)
    if ports:
        raise SystemExit(
            f"awslocal.sam: ports {sorted(ports)} cannot be published on the host network (debugging?)"
        )
    entrypoint = list(kwargs.get("entrypoint") or [])
    if rapid is None or not entrypoint or entrypoint[0] != RIE:
        raise SamChanged(
            f"awslocal.sam: unexpected function container (ports {rapid}, entrypoint {entrypoint})"
        )
    interface, port = rapid
    if interface != LOOPBACK:
        raise SystemExit(f"awslocal.sam: the emulator must listen on {LOOPBACK}, not {interface}")
    kwargs["entrypoint"] = [
        RIE,
        "--runtime-interface-emulator-address",
        f"{LOOPBACK}:{port}",
        "--runtime-api-address",
        f"{LOOPBACK}:{free_loopback_port()}",
        *entrypoint[1:],
    ]
    kwargs["network_mode"] = "host"
    return kwargs


def adapt_host_network() -> None:
    from docker.models.containers import ContainerCollection

    original = ContainerCollection.create

    def create(self: Any, image: str, command: Any = None, **kwargs: Any) -> Any:
        if (kwargs.get("labels") or {}).get("sam.cli.container.type") == "lambda":
            kwargs = host_network_create_arguments(kwargs)
        return original(self, image, command, **kwargs)

    ContainerCollection.create = create


def layers_digest(base_image_id: str, layer_dirs: list[Path], rie: Path, architecture: str) -> str:
    """What SAM's image is made of, cheaply: file names, sizes and times, not their bytes."""
    h = hashlib.sha256(f"{base_image_id}\0{architecture}\0".encode())
    h.update(hashlib.sha256(rie.read_bytes()).digest() if rie.is_file() else str(rie).encode())
    for layer in layer_dirs:
        h.update(f"\0layer\0{layer.name}\0".encode())
        for path in sorted(p for p in layer.rglob("*") if p.is_file()):
            stat = path.stat()
            h.update(f"{path.relative_to(layer)}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return h.hexdigest()[:32]


def adapt_image_reuse() -> None:
    import docker.errors
    from samcli.local.docker.lambda_image import LambdaImage
    from samcli.local.docker.utils import get_rapid_name

    original = LambdaImage._build_image

    def _build_image(  # noqa: PLR0917  (SAM's signature)
        self: Any, base_image: str, docker_tag: str, layers: list[Any], architecture: str, stream: Any = None
    ) -> None:
        client = self.docker_client
        rie = Path(self._RAPID_SOURCE_PATH) / get_rapid_name(architecture)
        key = layers_digest(
            client.images.get(base_image).id, [Path(layer.codeuri) for layer in layers], rie, architecture
        )
        owner = hashlib.sha256(docker_tag.encode()).hexdigest()[:12]
        cached = f"{CACHE_REPOSITORY}:{owner}-{key}"
        try:
            client.images.get(cached).tag(docker_tag)
            print(
                f"awslocal.sam: reusing {docker_tag} (its base, layers and emulator are unchanged)",
                file=sys.stderr,
            )
            return
        except docker.errors.ImageNotFound:
            pass
        original(self, base_image, docker_tag, layers, architecture, stream=stream)
        client.images.get(docker_tag).tag(cached)
        # Only the newest image of each SAM tag is kept.
        for image in client.images.list(name=CACHE_REPOSITORY):
            for tag in image.tags:
                if tag.startswith(f"{CACHE_REPOSITORY}:{owner}-") and tag != cached:
                    client.images.remove(tag, noprune=False)

    LambdaImage._build_image = _build_image


def main() -> None:
    check_sam()
    arguments = sys.argv[1:]
    if "--docker-network" in arguments and arguments[arguments.index("--docker-network") + 1] == "host":
        adapt_host_network()
    if os.environ.get("AWS_LOCAL_SAM_IMAGE_REUSE", "1") != "0":  # 0: SAM's own rebuild, to compare
        adapt_image_reuse()
    from samcli.cli.main import cli

    cli(args=arguments, prog_name="sam")


if __name__ == "__main__":
    main()
