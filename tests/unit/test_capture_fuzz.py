"""Hostile EXIF never fails a photo (SPEC 18): real blocks mutated by hypothesis, read by the reader
and rendered through the real pipeline.

The seeds are real: the two camera blocks of the sample photographs (a Canon's, little-endian with
a maker note; a Konica Minolta's, big-endian, 64 KB) and a phone's (devkit/exif.py, both byte
orders, with GPS). The mutations are the ways a block lies: cut short, bytes overwritten, a directory
entry's type, count or value offset replaced (huge counts, wrong types, offsets outside the block,
pointers back to IFD0 or to the entry itself), its text replaced by bytes that are no ASCII or by
absurd dates (month 13, year 0), a rational's denominator zeroed, bytes inserted or deleted (every
offset after them wrong).
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from functools import cache

import pytest
import pyvips
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devkit import exif, samples
from photo_publish.contracts import MAX_CAPTURE_TEXT, Capture, Location
from photo_publish.image import capture
from photo_publish.image.pipeline import RenderOptions, render

# Enough to say why for four problems and how many more.
MAX_PROBLEM = 4 * 200 + 40
# A directory entry of a seed: where it starts, its type, where its value is.
Entry = tuple[int, int, int]


@dataclass(frozen=True)
class Seed:
    name: str
    data: bytes
    # (where the entry starts, its type, where its value is) for each entry of IFD0, Exif and GPS
    entries: tuple[Entry, ...]


def _entries(data: bytes) -> tuple[Entry, ...]:
    """The entries of a well-formed block's three directories (a seed's, so trusted)."""
    start = data.index(b"Exif\0\0") + 6
    order = "<" if data[start : start + 2] == b"II" else ">"
    found: list[Entry] = []
    pending = [struct.unpack_from(order + "I", data, start + 4)[0]]
    while pending:
        offset = pending.pop()
        count = struct.unpack_from(order + "H", data, start + offset)[0]
        for index in range(count):
            at = start + offset + 2 + 12 * index
            tag, kind, number = struct.unpack_from(order + "HHI", data, at)
            size = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 7: 1, 9: 4, 10: 8}.get(kind, 1) * number
            value = at + 8 if size <= 4 else start + struct.unpack_from(order + "I", data, at + 8)[0]
            found.append((at, kind, value))
            if tag in (exif.EXIF_POINTER, exif.GPS_POINTER):
                pending.append(struct.unpack_from(order + "I", data, at + 8)[0])
    return tuple(found)


@cache
def seeds() -> tuple[Seed, ...]:
    blocks = {
        "canon-400d": pyvips.Image.new_from_file(str(samples.IMAGES / "Storm.jpg")).get("exif-data"),
        "konica-minolta-z5": pyvips.Image.new_from_file(str(samples.IMAGES / "Wood.jpg")).get("exif-data"),
        "phone-big-endian": exif.camera(order=">"),
        "phone-little-endian": exif.camera(order="<"),
    }
    return tuple(Seed(name, bytes(data), _entries(bytes(data))) for name, data in blocks.items())


def _cut(draw: st.DrawFn, data: bytearray, entry: Entry) -> None:
    del data[draw(st.integers(0, len(data))) :]


def _overwrite(draw: st.DrawFn, data: bytearray, entry: Entry) -> None:
    if data:
        at = draw(st.integers(0, len(data) - 1))
        data[at : at + 4] = draw(st.binary(min_size=1, max_size=4))


def _type(draw: st.DrawFn, data: bytearray, entry: Entry) -> None:
    kinds = st.sampled_from([0, 2, 3, 4, 5, 7, 10, 11, 12, 13, 99, 0xFFFF])
    data[entry[0] + 2 : entry[0] + 4] = draw(kinds).to_bytes(2, draw(st.sampled_from(["little", "big"])))


def _count(draw: st.DrawFn, data: bytearray, entry: Entry) -> None:
    count = draw(st.sampled_from([0, 1, 3, 4, 5, 2**16, 2**31, 2**32 - 1]) | st.integers(0, 2**32 - 1))
    data[entry[0] + 4 : entry[0] + 8] = count.to_bytes(4, draw(st.sampled_from(["little", "big"])))


def _offset(draw: st.DrawFn, data: bytearray, entry: Entry) -> None:
    # Outside the block, back to IFD0 (offset 8), onto the entry itself, or anything.
    target = draw(st.sampled_from([8, 2**32 - 1, len(data), entry[0]]) | st.integers(0, 2**32 - 1))
    data[entry[0] + 8 : entry[0] + 12] = target.to_bytes(4, draw(st.sampled_from(["little", "big"])))


def _text(draw: st.DrawFn, data: bytearray, entry: Entry) -> None:
    if entry[1] == exif.ASCII:
        value = draw(st.binary(min_size=1, max_size=24))
        data[entry[2] : entry[2] + len(value)] = value


def _date(draw: st.DrawFn, data: bytearray, entry: Entry) -> None:
    if entry[1] == exif.ASCII:
        parts = (draw(st.integers(0, limit)) for limit in (9999, 99, 99, 99, 99, 99))
        value = "{:04d}:{:02d}:{:02d} {:02d}:{:02d}:{:02d}".format(*parts).encode()
        data[entry[2] : entry[2] + len(value)] = value


def _zero(draw: st.DrawFn, data: bytearray, entry: Entry) -> None:
    if entry[1] in (exif.RATIONAL, exif.SRATIONAL):
        data[entry[2] + 4 : entry[2] + 8] = bytes(4)


def _splice(draw: st.DrawFn, data: bytearray, entry: Entry) -> None:
    if data:
        at = draw(st.integers(0, len(data) - 1))
        if draw(st.booleans()):
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        else:
            del data[at : at + draw(st.integers(1, 16))]


MUTATIONS = [_cut, _overwrite, _type, _count, _offset, _text, _date, _zero, _splice]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A seed with one to six mutations, each at one of its entries where it needs one."""
    seed = draw(st.sampled_from(seeds()))
    data = bytearray(seed.data)
    for _ in range(draw(st.integers(1, 6))):
        mutation, entry = draw(st.sampled_from(MUTATIONS)), draw(st.sampled_from(seed.entries))
        # An entry a cut or a splice has moved out of the block: overwrite bytes instead.
        (mutation if entry[2] + 12 <= len(data) and entry[0] + 12 <= len(data) else _overwrite)(
            draw, data, entry
        )
    return bytes(data)


def assert_bounded(reading: capture.Reading, *, location: bool) -> None:
    value = reading.capture
    assert isinstance(value, Capture)  # built, so valid: every field its type, finite, in range
    for text in (value.make, value.model, value.lens):
        assert text is None or len(text) <= MAX_CAPTURE_TEXT
    assert value.location is None or (location and isinstance(value.location, Location))
    assert reading.problem is None or (
        isinstance(reading.problem, str) and len(reading.problem) <= MAX_PROBLEM
    )


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(block=mutated(), location=st.booleans())
def test_a_mutated_block_never_raises_and_reads_bounded(block: bytes, location: bool) -> None:
    # GIVEN a real block, mutated
    # WHEN it is read
    reading = capture.read(block, location=location)

    # THEN it returned a valid, bounded reading (the position only where it was asked for), the
    # same every time
    assert_bounded(reading, location=location)
    assert capture.read(block, location=location) == reading


@settings(max_examples=1000, deadline=None)
@given(block=st.binary(max_size=512), location=st.booleans())
def test_any_bytes_at_all_never_raise(block: bytes, location: bool) -> None:
    assert_bounded(capture.read(block, location=location), location=location)
    assert_bounded(capture.read(b"Exif\0\0MM\0*" + block, location=location), location=location)


@pytest.fixture(scope="module")
def small_jpeg() -> bytes:
    return bytes(samples.photograph().thumbnail_image(64).jpegsave_buffer(keep="none"))


def rendered_with(jpeg: bytes, block: bytes, *, location: bool = True) -> None:
    # At most what a JPEG's APP1 segment holds, "Exif\0\0" kept in front so that libvips takes it
    # for EXIF (and parses it itself with libexif, as it does every upload's).
    payload = (b"Exif\0\0" + block[6:] if block[:6] != b"Exif\0\0" else block)[:65533]
    result = render(io.BytesIO(exif.jpeg_with(jpeg, exif=payload)), RenderOptions(), location=location)
    assert [v.kind for v in result.variants][:2] == ["thumb", "browse"]
    assert_bounded(capture.Reading(result.capture, result.capture_problem), location=location)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(block=mutated())
def test_a_photo_with_a_mutated_block_renders_through_the_real_pipeline(
    small_jpeg: bytes, block: bytes
) -> None:
    # GIVEN a JPEG whose EXIF is a mutated real block
    # WHEN it is rendered (libvips reads its header, libexif and this reader its EXIF)
    # THEN it renders, whatever the block says
    rendered_with(small_jpeg, block)


HOSTILE = {
    "ifd0-cut": exif.camera()[:40],
    "ifd0-65535-entries": b"Exif\0\0II*\0" + struct.pack("<IH", 8, 65535) + bytes(64),
    "exif-pointer-loop": exif.block([exif.text(exif.MAKE, "Loop"), exif.long(exif.EXIF_POINTER, 8)]),
    "make-count-4-billion": exif.block([exif.Entry(exif.MAKE, exif.ASCII, b"Canon\0", count=2**32 - 1)]),
    "month-13-and-over-zero": exif.block(
        [exif.text(exif.MAKE, "x")],
        [exif.text(exif.DATE_TIME_ORIGINAL, "2024:13:01 00:00:00"), exif.rational(exif.F_NUMBER, (28, 0))],
    ),
    "make-not-utf8-with-controls": exif.block([exif.Entry(exif.MAKE, exif.ASCII, b"\xff\xfe\x07\x1b[2J\0")]),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_photo_with_hostile_exif_renders_with_what_could_be_read(small_jpeg: bytes, name: str) -> None:
    rendered_with(small_jpeg, HOSTILE[name])
