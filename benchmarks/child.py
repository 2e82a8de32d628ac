"""One measurement in a fresh Python process: every Python peer of the benchmarks, written once.

    python -m benchmarks.child <peer> <photo> [--stream] [--max-pixels N] [--browse-to PATH] [--formats F] [--as-function] [--memory-mb N]
    python -m benchmarks.child over-time <trim-every> <photo>...
    python -m benchmarks.child at-once <photo>...

The benchmarks (compare, heic, memory, report) start one interpreter per measurement through
measure() below, so that a time or a peak of memory belongs to that measurement alone: nothing is
cached, pooled or grown by what ran before. The child runs with MALLOC_ARENA_MAX=2, as Lambda and
the Makefile do, and PYTHONPATH=shared:<root>, the layout the handler sees plus this package.

This module imports only the standard library's few at its top: each peer imports what it names, in
its own function, and nothing else, so that a Pillow child holds no libvips, a pyvips child no
Pillow, and a floor is a floor. In order, the child reads the photo whole into memory (as an S3
body held in memory; --stream: not at all, the render reads the file as a stream), then does the
peer's imports, then times the peer's run alone (not the interpreter's start, the read or the
imports), then writes the browse to --browse-to if asked, then reads its peak resident memory.
Peers:
- photo-publish: render(stream, RenderOptions()) from shared/photo_publish/image/pipeline.py (pyvips);
  --max-pixels raises or lowers its pixel limit; a refusal (PhotoError) is the outcome, its code;
  --as-function (with --stream): rendered as the process function does, at the template's memory
  (devkit/fullsize.py's render_as_the_function: in a shared slot, or again alone), its route added,
  and, once the peak is read, what its header said it would hold (decode_bytes); --formats sets its
  ladder's formats (VARIANT_FORMATS, as "webp,avif"); --memory-mb the function's memory, where not
  the template's;
- pyvips-2dec: pyvips making each variant from the original, thumbnail_buffer() then WebP Q80
  (libvips' default effort), cache off: what the original worker did with sharp, on this libvips;
- pillow: draft mode (a JPEG decodes at the smallest 1/2^n scale still >= 2048), exif_transpose,
  LANCZOS thumbnail() to 2048 and from that to 400, WebP quality 80 method 4, the decompression-bomb
  limit lifted (the large images are measured on purpose);
- heic-decode: photo_publish.image.heic.decoded(), pi-heif's decode of the primary image alone (pixels);
- imports: photo_publish.image.pipeline imported (pyvips, photo_publish.image.heic), nothing run: the floor
  under the pipeline's peaks;
- imports+pi_heif: the same, and `import pi_heif` (and Pillow with it) is what is timed: the
  floor under a HEIC's peaks, and the import the first HEIC of a container pays.
Printed: one JSON line with seconds, peak_mb and floor_mb (the resident set before the run, imports
done), plus what the peer has of bytes (both variants), browse_bytes, outcome (the browse's size, or
what happened instead) and pixels (of the photo).

Peak memory is VmHWM from /proc/self/status, not getrusage's ru_maxrss: Linux carries ru_maxrss
over from the parent across fork and exec, so a child of a big benchmark process would report at
least its parent's size.

at-once: one process renders the photos as the process function does (--as-function), all at once, a
thread each (the renders it lets run side by side), and prints seconds, peak_mb, floor_mb and each
one's result.

over-time: one process renders photos in a row on demand, cycling through the photos, each read as
a file stream with RenderOptions(): it prints its resident set (VmRSS) before the first, then for
each line of stdin (a count N) renders the next N photos and prints one JSON line with each one's
render time and VmRSS after it; at the end of stdin, its peak. With <trim-every> > 0 it calls
photo_publish.image.memory.trim() after every that many photos (the process function trims once per
batch), inside the photo's time. measure() does not set its environment: benchmarks.memory runs it
once per allocator setting and feeds the processes in turn.
"""

from __future__ import annotations

import io
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

# Neither pathlib nor subprocess here (measure() imports it): a Pillow child imports neither, and this
# module's imports sit in every child's peak. typing and collections.abc: every peer imports them.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # noqa: PTH100, PTH120
SIZES = {"thumb": 400, "browse": 2048}
QUALITY = 80

Run = Callable[[], dict[str, Any]]


def env(malloc_arena_max: str | None = "2") -> dict[str, str]:
    """A child's whole environment: nothing of the caller's (its PYTHONPATH, its malloc settings)."""
    values = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{ROOT}/shared:{ROOT}"}
    if malloc_arena_max is not None:
        values["MALLOC_ARENA_MAX"] = malloc_arena_max
    return values


def command(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "benchmarks.child", *map(str, args)]


def measure(
    peer: str,
    photo: Path,
    *options: str | Path,
    prefix: Sequence[str] = (),
    environment: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run one peer on one photo in a fresh interpreter (after `prefix`, e.g. taskset); its JSON."""
    import subprocess

    out = subprocess.run(
        [*prefix, *command(peer, photo, *options)],
        capture_output=True,
        text=True,
        env=dict(environment if environment is not None else env()),
        cwd=ROOT,
        check=False,
    )
    if out.returncode:
        raise SystemExit(f"benchmarks.child {peer} {photo.name} failed ({out.returncode}):\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def capped(*args: str | Path, cap_bytes: int, timeout: float) -> dict[str, Any]:
    """One child (`args` as for command()) under an address space cap: its JSON, or what happened to
    it instead (code: timed out, crashed; no peak)."""
    import subprocess

    try:
        out = subprocess.run(
            ["prlimit", f"--as={cap_bytes}", *command(*args)],
            capture_output=True,
            text=True,
            env=env(),
            cwd=ROOT,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {
            "code": f"timed out ({timeout:g} s)",
            "seconds": timeout,
            "peak_mb": math.nan,
            "floor_mb": 0.0,
        }
    if out.returncode:
        last = out.stderr.strip().splitlines()[-1:] or [""]
        return {
            "code": f"crashed ({out.returncode}): {last[0][:60]}",
            "seconds": 0.0,
            "peak_mb": math.nan,
            "floor_mb": 0.0,
        }
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def status_mb(field: str) -> float:
    """A figure of /proc/self/status (VmHWM, VmRSS) in MB."""
    with open("/proc/self/status") as status:  # noqa: PTH123
        kb = next(int(line.split()[1]) for line in status if line.startswith(f"{field}:"))
    return kb / 1024


def _variants(outputs: dict[str, bytes], browse_size: tuple[int, int]) -> dict[str, Any]:
    return {
        "variants": outputs,
        "bytes": sum(map(len, outputs.values())),
        "browse_bytes": len(outputs["browse"]),
        "outcome": "{}x{} browse".format(*browse_size),
    }


# Each peer: given the photo (its bytes, or None with --stream, and its path) and the options, it does
# its imports and returns the run to time.


def photo_publish(data: bytes | None, path: str, options: dict[str, str]) -> Run:
    from dataclasses import replace

    from photo_publish.errors import PhotoError
    from photo_publish.image.pipeline import RenderOptions, render

    limit, formats = options.get("max-pixels"), options.get("formats")
    if "as-function" in options:
        from devkit.fullsize import render_as_the_function
        from photo_publish.image import slots

        chosen = None if formats is None else tuple(formats.split(","))
        memory = options.get("memory-mb")
        budget = slots.DEFAULT if memory is None else slots.DEFAULT.with_memory(int(memory))
        return lambda: render_as_the_function(path, budget, formats=chosen)
    render_options = RenderOptions() if limit is None else RenderOptions(max_input_pixels=int(limit))
    if formats is not None:
        render_options = replace(render_options, variant_formats=tuple(formats.split(",")))

    def run() -> dict[str, Any]:
        with io.BytesIO(data) if data is not None else open(path, "rb") as stream:  # noqa: PTH123
            try:
                rendered = render(stream, render_options)
            except PhotoError as error:
                return {"outcome": str(error.code)}
        outputs = {v.kind: v.data for v in rendered.variants}
        browse = next(v for v in rendered.variants if v.kind == "browse")
        return _variants(outputs, (browse.width, browse.height)) | {
            "pixels": rendered.width * rendered.height
        }

    return run


def pyvips_two_decodes(data: bytes | None, path: str, options: dict[str, str]) -> Run:
    import pyvips

    pyvips.cache_set_max(0)

    def run() -> dict[str, Any]:
        outputs, shape = {}, (0, 0)
        for kind, size in SIZES.items():
            if data is not None:
                image = pyvips.Image.thumbnail_buffer(data, size, height=size, size="down")
            else:
                image = pyvips.Image.thumbnail(path, size, height=size, size="down")
            outputs[kind] = image.webpsave_buffer(Q=QUALITY, keep="none")
            shape = (image.width, image.height)  # the browse's, made last
        return _variants(outputs, shape)

    return run


def pillow(data: bytes | None, path: str, options: dict[str, str]) -> Run:
    from PIL import Image, ImageOps

    Image.MAX_IMAGE_PIXELS = None
    browse_box = (SIZES["browse"], SIZES["browse"])

    def run() -> dict[str, Any]:
        image = Image.open(io.BytesIO(data) if data is not None else path)
        image.draft("RGB", browse_box)
        image = ImageOps.exif_transpose(image).convert("RGB")
        browse = image.copy()
        del image
        browse.thumbnail(browse_box, Image.LANCZOS)
        thumb = browse.copy()
        thumb.thumbnail((SIZES["thumb"], SIZES["thumb"]), Image.LANCZOS)
        outputs = {}
        for kind, im in (("thumb", thumb), ("browse", browse)):
            buffer = io.BytesIO()
            im.save(buffer, "WEBP", quality=QUALITY, method=4)
            outputs[kind] = buffer.getvalue()
        return _variants(outputs, browse.size)

    return run


def heic_decode(data: bytes | None, path: str, options: dict[str, str]) -> Run:
    from photo_publish.image import heic

    if data is None:
        raise SystemExit("heic-decode decodes bytes: no --stream")

    def run() -> dict[str, Any]:
        with heic.decoded(data) as image:
            return {"pixels": image.width * image.height}

    return run


def imports(data: bytes | None, path: str, options: dict[str, str]) -> Run:
    import photo_publish.image.pipeline  # noqa: F401

    return lambda: {"outcome": "imports only"}


def imports_pi_heif(data: bytes | None, path: str, options: dict[str, str]) -> Run:
    import photo_publish.image.pipeline  # noqa: F401

    def run() -> dict[str, Any]:
        import pi_heif  # noqa: F401

        return {"outcome": "imports only"}

    return run


PEERS: dict[str, Callable[[bytes | None, str, dict[str, str]], Run]] = {
    "photo-publish": photo_publish,
    "pyvips-2dec": pyvips_two_decodes,
    "pillow": pillow,
    "heic-decode": heic_decode,
    "imports": imports,
    "imports+pi_heif": imports_pi_heif,
}


def one(peer: str, path: str, options: dict[str, str]) -> dict[str, Any]:
    if peer not in PEERS:
        raise SystemExit(f"unknown peer {peer!r}: one of {', '.join(PEERS)}, over-time")
    data = None
    if "stream" not in options:
        with open(path, "rb") as file:  # noqa: PTH123
            data = file.read()
    run = PEERS[peer](data, path, options)
    floor = status_mb("VmRSS")
    started = time.perf_counter()
    result = run()
    seconds = time.perf_counter() - started
    variants = result.pop("variants", {})
    if "browse-to" in options:
        with open(options["browse-to"], "wb") as file:  # noqa: PTH123
            file.write(variants["browse"])
    measured = {"seconds": seconds, "peak_mb": status_mb("VmHWM"), "floor_mb": floor}
    if "as-function" in options:
        from devkit.fullsize import decode_estimate

        # After the peak is read: this second read of the header must not count in it.
        with open(path, "rb") as stream:  # noqa: PTH123
            result["decode_bytes"] = decode_estimate(stream)
    return measured | result


def over_time(trim_every: int, paths: list[str]) -> dict[str, Any]:
    """Render on demand: each line of stdin is a count of photos to render next; a JSON line answers it."""
    from photo_publish.image.memory import trim
    from photo_publish.image.pipeline import RenderOptions, render

    options = RenderOptions()
    with open("/proc/self/maps") as maps:  # noqa: PTH123
        jemalloc = "libjemalloc" in maps.read()  # LD_PRELOAD took
    print(json.dumps({"rss_mb": [status_mb("VmRSS")], "seconds": [0.0], "jemalloc": jemalloc}), flush=True)
    done = 0
    for line in sys.stdin:
        rss, seconds = [], []
        for _ in range(int(line)):
            started = time.perf_counter()
            with open(paths[done % len(paths)], "rb") as stream:  # noqa: PTH123
                render(stream, options)
            done += 1
            if trim_every and done % trim_every == 0:
                trim()  # as the process function does after each batch: its time is the render's
            seconds.append(time.perf_counter() - started)
            rss.append(status_mb("VmRSS"))
        print(json.dumps({"rss_mb": rss, "seconds": seconds}), flush=True)
    return {"peak_mb": status_mb("VmHWM")}


def at_once(paths: list[str]) -> dict[str, Any]:
    """Each photo rendered as the process function does (--as-function), all at once, one thread each:
    the renders the function lets run side by side, in one process as in one container."""
    from concurrent.futures import ThreadPoolExecutor

    from devkit.fullsize import render_as_the_function

    floor = status_mb("VmRSS")
    started = time.perf_counter()
    with ThreadPoolExecutor(len(paths)) as pool:
        results = list(pool.map(render_as_the_function, paths))
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "peak_mb": status_mb("VmHWM"), "floor_mb": floor, "results": results}


def _options(args: list[str]) -> dict[str, str]:
    """--stream, --max-pixels N, --formats F, --browse-to PATH, --memory-mb N (no argparse: its imports would sit in every floor)."""
    options: dict[str, str] = {}
    while args:
        name = args.pop(0)
        if name in ("--stream", "--as-function"):
            options[name.removeprefix("--")] = ""
        elif name in ("--max-pixels", "--formats", "--browse-to", "--memory-mb") and args:
            options[name.removeprefix("--")] = args.pop(0)
        else:
            raise SystemExit(f"unknown option {name!r} (see benchmarks/child.py)")
    return options


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    if argv[0] == "over-time":
        result = over_time(int(argv[1]), argv[2:])
    elif argv[0] == "at-once":
        result = at_once(argv[1:])
    else:
        result = one(argv[0], argv[1], _options(argv[2:]))
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
