"""Capture metadata (SPEC 18): the EXIF reader on real photographs and crafted blocks, and the
pipeline that reads it from the header it already has, for every format that carries EXIF."""

from __future__ import annotations

import io
import struct
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pyvips
from PIL import Image

from devkit import exif, hostile, samples
from devkit.exif import (
    ALTITUDE,
    ALTITUDE_REF,
    DATE_TIME_ORIGINAL,
    EXPOSURE_TIME,
    F_NUMBER,
    FOCAL_LENGTH,
    ISO,
    ISO_SPEED,
    LATITUDE,
    LATITUDE_REF,
    LONGITUDE,
    LONGITUDE_REF,
    MAKE,
    MODEL,
    OFFSET_TIME_ORIGINAL,
    SUBSEC_TIME_ORIGINAL,
    Entry,
    block,
    byte,
    rational,
    short,
    text,
)
from photo_publish.contracts import NO_CAPTURE, Capture, Location
from photo_publish.image import capture
from photo_publish.image.pipeline import RenderOptions, render

CAMERA, PARIS, CAMERA_WITH_POSITION = exif.CAMERA, exif.PARIS, exif.CAMERA_WITH_POSITION


def exif_of(path: Path) -> bytes | None:
    image = pyvips.Image.new_from_file(str(path))
    return image.get("exif-data") if image.get_typeof("exif-data") else None


def pillow_capture(block_: bytes) -> Capture:
    """The same fields as Pillow's EXIF reader (an independent implementation) reads them."""
    tags = Image.Exif()
    tags.load(block_)
    ifd = tags.get_ifd(0x8769)

    def number(value: Any) -> float | None:
        return None if value is None or float(value) == 0 else float(value)

    taken = ifd.get(DATE_TIME_ORIGINAL)
    return Capture(
        taken_at_local=datetime.strptime(taken, "%Y:%m:%d %H:%M:%S") if taken else None,
        make=(tags.get(MAKE) or "").strip() or None,
        model=(tags.get(MODEL) or "").strip() or None,
        lens=ifd.get(0xA434),
        f_number=number(ifd.get(F_NUMBER)),
        exposure_time=number(ifd.get(EXPOSURE_TIME)),
        iso=ifd.get(ISO),
        focal_length=number(ifd.get(FOCAL_LENGTH)),
    )


# --- real photographs ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", samples.photographs(), ids=lambda p: p.name)
def test_each_sample_photograph_reads_as_pillows_exif_reader_reads_it(path: Path) -> None:
    # GIVEN a sample photograph's EXIF block, as libvips' header holds it
    block_ = exif_of(path)
    assert block_ is not None

    # WHEN it is read
    reading = capture.read(block_)

    # THEN every field is what an independent reader finds, and nothing was wrong with it
    assert reading == capture.Reading(pillow_capture(block_))


def test_the_two_camera_photographs_say_what_their_cameras_wrote() -> None:
    # GIVEN the two sample photographs taken by a camera that wrote its EXIF (the others' are empty)
    storm, wood = (capture.read(exif_of(samples.IMAGES / name)).capture for name in ("Storm.jpg", "Wood.jpg"))

    # THEN a Canon EOS 400D at f/3.5, 4/10 s (libvips' string says "1/2 sec."), ISO 100, 18 mm, on
    # its clock only (no offset recorded) ...
    assert storm == Capture(
        taken_at_local=datetime(2008, 4, 20, 19, 12, 6),
        make="Canon",
        model="Canon EOS 400D DIGITAL",
        f_number=3.5,
        exposure_time=0.4,
        iso=100,
        focal_length=18.0,
    )
    # ... and a Konica Minolta whose make has a trailing space, at 673500/65536 mm
    assert (wood.make, wood.model, wood.f_number, wood.exposure_time, wood.iso) == (
        "KONICA MINOLTA",
        "DiMAGE Z5",
        3.2,
        0.001,
        50,
    )
    assert wood.focal_length == 673500 / 65536


# --- a phone's block -------------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["<", ">"], ids=["little-endian", "big-endian"])
def test_a_phones_block_reads_whole_and_its_position_only_when_asked(order: str) -> None:
    # GIVEN a phone's EXIF: time with offset and milliseconds, exposure, lens, and GPS
    block_ = exif.camera(order=order)

    # WHEN it is read without and with the user's agreement to keep the location
    kept, dropped = capture.read(block_, location=True), capture.read(block_)

    # THEN the instant is in UTC, the clock as the camera showed it, the position signed degrees
    assert kept == capture.Reading(CAMERA_WITH_POSITION)
    # AND without the agreement, the same without the position
    assert dropped == capture.Reading(CAMERA)
    # AND Pillow reads the same block the same way (the builder writes what the standard says;
    # Pillow's reading here leaves out the offset and the milliseconds)
    assert CAMERA.taken_at_local is not None
    clock = CAMERA.taken_at_local.replace(microsecond=0)
    assert pillow_capture(block_) == replace(CAMERA, taken_at=None, taken_at_local=clock)


def test_without_the_users_agreement_the_gps_directory_is_never_opened() -> None:
    # GIVEN a block whose GPS pointer leads outside the block
    block_ = block([text(MAKE, "Apple"), Entry(0x8825, exif.LONG, (10**6,))])

    # WHEN it is read without and with the agreement
    # THEN only the reading that was allowed to follow the pointer found it broken
    assert capture.read(block_) == capture.Reading(Capture(make="Apple"))
    assert capture.read(block_, location=True) == capture.Reading(
        Capture(make="Apple"), "GPSIFD at an offset (1000000) outside the block"
    )


def test_a_block_with_a_jpeg_marker_before_it_is_read_as_a_xiaomi_heic_carries_it() -> None:
    # GIVEN a block with the APP1 marker and length still before "Exif\0\0" (Xiaomi's HEIC items)
    block_ = exif.camera()
    marked = b"\xff\xe1" + struct.pack(">H", len(block_) + 2) + block_

    # WHEN / THEN it reads as the block itself; so does a bare TIFF structure (a PNG's eXIf chunk)
    assert capture.read(marked) == capture.read(block_) == capture.read(block_[6:])


# --- when ------------------------------------------------------------------------------------------


def taken(date: str | bytes, offset: str | None = None, subsec: str | None = None) -> capture.Reading:
    entries = [text(DATE_TIME_ORIGINAL, date)]
    entries += [text(OFFSET_TIME_ORIGINAL, offset)] if offset is not None else []
    entries += [text(SUBSEC_TIME_ORIGINAL, subsec)] if subsec is not None else []
    return capture.read(block([text(MAKE, "x")], entries))


@pytest.mark.parametrize(
    ("date", "offset", "subsec", "instant", "local"),
    [
        ("2024:06:01 18:42:07", None, None, None, datetime(2024, 6, 1, 18, 42, 7)),
        ("2024:06:01 18:42:07", "+00:00", None, datetime(2024, 6, 1, 18, 42, 7, tzinfo=UTC), None),
        ("2024:06:01 18:42:07", "-05:30", "5", datetime(2024, 6, 2, 0, 12, 7, 500000, tzinfo=UTC), None),
        (
            "2024:06:01 18:42:07",
            "+14:00",
            "1234567",
            datetime(2024, 6, 1, 4, 42, 7, 123456, tzinfo=UTC),
            None,
        ),
        # As some software writes it (an Apple Vision Pro's DateTime, in this layout)
        ("2024-06-01T18:42:07", None, None, None, datetime(2024, 6, 1, 18, 42, 7)),
        # What cameras write for "unknown": nothing, no problem
        ("0000:00:00 00:00:00", "+02:00", None, None, None),
        ("    :  :     :  :  ", None, None, None, None),
        ("", None, None, None, None),
        ("2024:06:01 18:42:07", "   :  ", None, None, datetime(2024, 6, 1, 18, 42, 7)),
    ],
    ids=[
        "clock-only",
        "utc",
        "minus-5-30-half-second",
        "plus-14-microseconds",
        "dashes-and-t",
        "zeros",
        "blanks",
        "empty",
        "blank-offset",
    ],
)
def test_the_time_taken_is_an_instant_only_where_the_camera_recorded_its_offset(
    date: str, offset: str | None, subsec: str | None, instant: datetime | None, local: datetime | None
) -> None:
    reading = taken(date, offset, subsec)
    assert reading.problem is None
    assert reading.capture.taken_at == instant
    # The clock is the instant at the recorded offset, or as written
    if instant is not None and offset is not None:
        sign, hours, minutes = offset[0], int(offset[1:3]), int(offset[4:6])
        shift = timedelta(hours=hours, minutes=minutes) * (-1 if sign == "-" else 1)
        local = (instant + shift).replace(tzinfo=None)
    assert reading.capture.taken_at_local == local


@pytest.mark.parametrize(
    ("date", "offset", "subsec", "problem", "local"),
    [
        ("2024:13:01 00:00:00", None, None, "DateTimeOriginal: month must be in 1..12", None),
        ("0000:01:01 00:00:00", None, None, "DateTimeOriginal: year 0 is out of range", None),
        ("2024:02:30 25:61:61", None, None, "DateTimeOriginal: day is out of range", None),
        ("yesterday at noon", None, None, "DateTimeOriginal: not a date and time", None),
        (
            "2024:06:01 18:42:07",
            "+25:00",
            None,
            "OffsetTimeOriginal: not an offset",
            datetime(2024, 6, 1, 18, 42, 7),
        ),
        (
            "2024:06:01 18:42:07",
            "02:00",
            None,
            "OffsetTimeOriginal: not an offset",
            datetime(2024, 6, 1, 18, 42, 7),
        ),
        (
            "2024:06:01 18:42:07",
            None,
            "12a",
            "SubSecTimeOriginal: not digits",
            datetime(2024, 6, 1, 18, 42, 7),
        ),
        (
            "0001:01:01 00:30:00",
            "+01:00",
            None,
            "DateTimeOriginal: out of range in UTC",
            datetime(1, 1, 1, 0, 30),
        ),
        (
            "\uff12\uff10\uff12\uff14:06:01 18:42:07",
            None,
            None,
            "DateTimeOriginal: not a date and time",
            None,
        ),
    ],
    ids=[
        "month-13",
        "year-0",
        "day-30-of-february",
        "words",
        "offset-25h",
        "offset-unsigned",
        "subsec",
        "utc-overflow",
        "wide-digits",
    ],
)
def test_an_absurd_time_leaves_what_it_cannot_say_empty_and_says_why(
    date: str, offset: str | None, subsec: str | None, problem: str, local: datetime | None
) -> None:
    reading = taken(date, offset, subsec)
    assert reading.problem is not None and reading.problem.startswith(problem)
    assert (reading.capture.taken_at, reading.capture.taken_at_local) == (None, local)
    # The rest of the block is still read
    assert reading.capture.make == "x"


# --- with what -------------------------------------------------------------------------------------


def exposure(*entries: Entry) -> capture.Reading:
    return capture.read(block([text(MAKE, "x")], entries))


@pytest.mark.parametrize(
    ("entries", "fields", "problem"),
    [
        ((rational(F_NUMBER, (0, 0)), rational(EXPOSURE_TIME, (0, 1))), {}, None),
        ((rational(F_NUMBER, (28, 0)),), {}, "FNumber: a rational over zero"),
        ((rational(EXPOSURE_TIME, (-1, 100), signed=True),), {}, "ExposureTime: negative"),
        ((rational(EXPOSURE_TIME, (-1, -100), signed=True),), {"exposure_time": 0.01}, None),
        ((short(FOCAL_LENGTH, 50),), {"focal_length": 50.0}, None),
        ((text(FOCAL_LENGTH, "50mm"),), {}, "FocalLength: type 2 x 5, not 1 number(s)"),
        ((Entry(FOCAL_LENGTH, exif.DOUBLE, (float("inf"),)),), {}, "FocalLength: not a finite number"),
        ((short(ISO, 65535), Entry(ISO_SPEED, exif.LONG, (102400,))), {"iso": 102400}, None),
        ((short(ISO, 0),), {}, None),
        ((rational(ISO, (100, 1)),), {}, "PhotographicSensitivity: type 5, not an integer"),
        ((Entry(ISO_SPEED, exif.LONG, (2**32 - 1,)),), {}, "ISOSpeed: 4294967295, out of range"),
        ((short(ISO, 100, 200),), {"iso": 100}, None),
    ],
    ids=[
        "zero-over-zero-unknown",
        "over-zero",
        "negative-time",
        "negative-over-negative",
        "focal-length-short",
        "focal-length-text",
        "infinite-double",
        "iso-over-65534",
        "iso-zero-unknown",
        "iso-rational",
        "iso-over-int32",
        "iso-two-values",
    ],
)
def test_an_exposure_value_that_is_no_quantity_stays_empty(
    entries: tuple[Entry, ...], fields: dict[str, Any], problem: str | None
) -> None:
    assert exposure(*entries) == capture.Reading(Capture(make="x", **fields), problem)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"Canon\x00junk after the NUL", "Canon"),
        (b"  NIKON  CORPORATION \t", "NIKON CORPORATION"),
        (b"Caf\xe9 Cam", "Café Cam"),  # Latin-1, not UTF-8
        ("Câmera Ünïcode".encode(), "Câmera Ünïcode"),
        (b"bell\x07and\x1b[31mescape\x7f", "bell and [31mescape"),
        (b"\x00", None),
        (b"A" * 1000, "A" * 128),
    ],
    ids=["nul", "spaces", "latin-1", "utf-8", "controls", "empty", "long"],
)
def test_text_is_cleaned_to_what_a_person_reads_and_bounded(raw: bytes, expected: str | None) -> None:
    reading = capture.read(block([Entry(MAKE, exif.ASCII, raw)]))
    assert reading == capture.Reading(Capture(make=expected))


def test_text_of_another_type_is_not_read() -> None:
    reading = capture.read(block([short(MAKE, 67, 97, 110), text(MODEL, "EOS")]))
    assert reading == capture.Reading(Capture(model="EOS"), "Make: type 3, not text")


# --- where -----------------------------------------------------------------------------------------


def located(*entries: Entry) -> capture.Reading:
    return capture.read(block([text(MAKE, "x")], gps=entries), location=True)


NORTH = (text(LATITUDE_REF, "N"), rational(LATITUDE, (10, 1), (30, 1), (0, 1)))
EAST = (text(LONGITUDE_REF, "E"), rational(LONGITUDE, (20, 1), (15, 1), (0, 1)))


@pytest.mark.parametrize(
    ("entries", "location", "problem"),
    [
        ((*NORTH, *EAST), Location(latitude=10.5, longitude=20.25), None),
        (
            (
                text(LATITUDE_REF, "S"),
                NORTH[1],
                text(LONGITUDE_REF, "w"),
                EAST[1],
                byte(ALTITUDE_REF, 1),
                rational(ALTITUDE, (4305, 10)),
            ),
            Location(latitude=-10.5, longitude=-20.25, altitude=-430.5),
            None,
        ),
        ((*NORTH, *EAST, rational(ALTITUDE, (0, 0))), Location(latitude=10.5, longitude=20.25), None),
        # A phone without a fix: 0/0 everywhere and no hemisphere (Samsung), or 0 and 0 (Vision Pro)
        (
            (
                text(LATITUDE_REF, "\0"),
                rational(LATITUDE, (0, 0), (0, 0), (0, 0)),
                text(LONGITUDE_REF, "\0"),
                rational(LONGITUDE, (0, 0), (0, 0), (0, 0)),
            ),
            None,
            None,
        ),
        (
            (
                text(LATITUDE_REF, "N"),
                rational(LATITUDE, (0, 1), (0, 1), (0, 1)),
                text(LONGITUDE_REF, "E"),
                rational(LONGITUDE, (0, 1), (0, 1), (0, 1)),
            ),
            None,
            None,
        ),
        ((NORTH[1], *EAST), None, None),
        (
            (text(LATITUDE_REF, "N"), rational(LATITUDE, (95, 1), (0, 1), (0, 1)), *EAST),
            None,
            "GPSLatitude: out of range",
        ),
        (
            (text(LATITUDE_REF, "N"), rational(LATITUDE, (10, 1), (60, 1), (0, 1)), *EAST),
            None,
            "GPSLatitude: out of range",
        ),
        (
            (text(LATITUDE_REF, "N"), rational(LATITUDE, (10, 1), (30, 1)), *EAST),
            None,
            "GPSLatitude: type 5 x 2, not 3 number(s)",
        ),
        ((text(LATITUDE_REF, "Q"), NORTH[1], *EAST), None, "GPSLatitudeRef: not a hemisphere"),
        (
            (*NORTH, text(LONGITUDE_REF, "E"), rational(LONGITUDE, (181, 1), (0, 1), (0, 1))),
            None,
            "GPSLongitude: out of range",
        ),
    ],
    ids=[
        "north-east",
        "south-west-below-sea",
        "unknown-altitude",
        "no-fix-samsung",
        "no-fix-null-island",
        "no-hemisphere",
        "latitude-95",
        "minutes-60",
        "two-numbers",
        "hemisphere-q",
        "longitude-181",
    ],
)
def test_a_position_is_signed_decimal_degrees_or_nothing(
    entries: tuple[Entry, ...], location: Location | None, problem: str | None
) -> None:
    assert located(*entries) == capture.Reading(Capture(make="x", location=location), problem)


# --- broken blocks ---------------------------------------------------------------------------------


def test_a_block_over_the_limit_is_not_read_at_all() -> None:
    # GIVEN a phone's block padded past MAX_EXIF_BYTES (its directories intact)
    padded = exif.camera() + bytes(capture.MAX_EXIF_BYTES)

    # WHEN / THEN nothing is read, and the reading says why
    assert capture.read(padded, location=True) == capture.Reading(
        NO_CAPTURE, f"an EXIF block of {len(padded)} bytes, over {capture.MAX_EXIF_BYTES}"
    )


@pytest.mark.parametrize(
    ("blob", "problem"),
    [
        (b"Exif\0\0GIF89a", "no TIFF header"),
        (b"Exif\0\0II*\0", "an offset (4) outside the block"),
        (b"II*\0" + struct.pack("<I", 4), "IFD0 at an offset (4) outside the block"),
        (b"II*\0" + struct.pack("<IH", 8, 65535), "IFD0 declares 65535 entries, over 1000"),
        (b"MM\0*" + struct.pack(">I", 2**32 - 1), "IFD0 at an offset (4294967295) outside the block"),
    ],
    ids=["no-header", "header-cut", "ifd0-in-header", "ifd0-huge-count", "ifd0-far-away"],
)
def test_a_block_whose_structure_is_broken_reads_as_nothing_and_says_why(blob: bytes, problem: str) -> None:
    assert capture.read(blob, location=True) == capture.Reading(NO_CAPTURE, problem)


def test_a_block_cut_anywhere_never_raises_and_keeps_only_what_lies_inside() -> None:
    # GIVEN a phone's block, cut at every length
    whole = exif.camera()
    for length in range(len(whole)):
        # WHEN it is read
        reading = capture.read(whole[:length], location=True)
        # THEN a field is either the whole block's or empty (the altitude is a field of its own),
        # and anything missing is explained
        for name, value in _fields(reading.capture).items():
            if name == "location":
                assert value in (None, PARIS, Location(latitude=PARIS.latitude, longitude=PARIS.longitude))
            else:
                assert value in (None, getattr(CAMERA, name))
        if reading.capture != CAMERA_WITH_POSITION and length > 6:
            assert reading.problem is not None


@pytest.mark.parametrize("loop", ["exif-to-ifd0", "gps-to-ifd0", "next-to-itself"])
def test_a_directory_pointing_back_is_read_once(loop: str) -> None:
    # GIVEN IFD0 with its Exif or GPS pointer back to itself (offset 8), or its link to a next
    # directory naming itself (the chain a reader that follows links would walk forever)
    pointer = {"exif-to-ifd0": 0x8769, "gps-to-ifd0": 0x8825}.get(loop)
    ifd0 = [text(MAKE, "Loop"), short(ISO, 100)] + ([Entry(pointer, exif.LONG, (8,))] if pointer else [])
    blob = bytearray(block(ifd0, order="<", prefix=b""))
    if pointer is None:
        struct.pack_into("<I", blob, 8 + 2 + 12 * len(ifd0), 8)

    # WHEN / THEN it is read, once: the IFD0 entries are what a directory pointed to finds
    reading = capture.read(bytes(blob), location=True)
    assert reading.capture.make == "Loop"
    assert reading.capture.iso == (100 if loop == "exif-to-ifd0" else None)


def test_a_value_whose_count_runs_past_the_block_stays_empty() -> None:
    # GIVEN a make declaring four billion characters, and a model that is fine
    blob = block([Entry(MAKE, exif.ASCII, b"Canon\0", count=2**32 - 1), text(MODEL, "EOS")])

    # WHEN / THEN the model is read, the make is not
    reading = capture.read(blob)
    assert reading.capture == Capture(model="EOS")
    assert reading.problem == f"Make: its {2**32 - 1} bytes run past the end of the block"


def test_many_problems_make_one_bounded_line() -> None:
    entries = [Entry(tag, exif.ASCII, b"x", count=10**9) for tag in (MAKE, MODEL)]
    entries += [rational(F_NUMBER, (1, 0)), rational(EXPOSURE_TIME, (1, 0)), rational(FOCAL_LENGTH, (1, 0))]
    reading = capture.read(block(entries[:2], entries[2:]))
    assert reading.problem is not None and reading.problem.endswith("(and 1 more)")
    assert reading.problem.count(";") == 3


# --- through the pipeline --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def upright() -> pyvips.Image:
    return samples.photograph().thumbnail_image(640).copy_memory()


def as_png(image: pyvips.Image, block_: bytes) -> bytes:
    tagged = image.copy()
    tagged.set_type(pyvips.GValue.blob_type, "exif-data", block_)
    return bytes(tagged.pngsave_buffer(keep="exif"))


def as_webp(image: pyvips.Image, block_: bytes) -> bytes:
    tagged = image.copy()
    tagged.set_type(pyvips.GValue.blob_type, "exif-data", block_)
    return bytes(tagged.webpsave_buffer(keep="exif"))


def as_tiff(image: pyvips.Image, block_: bytes) -> bytes:
    # libvips writes no EXIF into a TIFF: Pillow puts the tags in the file's own directories.
    picture = Image.open(io.BytesIO(bytes(image.jpegsave_buffer())))
    out = io.BytesIO()
    tags = Image.Exif()
    tags.load(block_)
    picture.save(out, "TIFF", exif=tags)
    return out.getvalue()


FORMATS = {
    "jpeg": lambda image, block_: exif.jpeg_with(bytes(image.jpegsave_buffer(keep="none")), exif=block_),
    "png": as_png,
    "webp": as_webp,
    "tiff": as_tiff,
    "heic": lambda image, block_: samples.heic(image, tile_size=0, exif=block_),
}


@pytest.mark.parametrize("kind", FORMATS)
def test_every_format_that_carries_exif_gives_its_capture_from_the_header(
    kind: str, upright: pyvips.Image
) -> None:
    # GIVEN a phone's EXIF in a file of that format
    data = FORMATS[kind](upright, exif.camera())

    # WHEN it is rendered, with and without the agreement to keep the location
    kept = render(io.BytesIO(data), RenderOptions(), location=True)
    dropped = render(io.BytesIO(data), RenderOptions())

    # THEN the capture is the block's, its position only where it was agreed
    assert (kept.capture, kept.capture_problem) == (CAMERA_WITH_POSITION, None)
    assert (dropped.capture, dropped.capture_problem) == (CAMERA, None)


def test_a_heic_whose_header_libvips_cannot_read_gives_pi_heifs_exif() -> None:
    # GIVEN a HEIC of 1600 x 1200 in 475 tiles of 64 x 64 (477 items with its grid and EXIF, over the
    # 256 that libvips' libheif reads)
    picture = samples.photograph().crop(0, 0, 1600, 1200)
    data = samples.heic(picture, tile_size=64, exif=exif.camera())
    with pytest.raises(pyvips.Error):
        pyvips.Image.new_from_buffer(data, "")

    # WHEN it is rendered
    rendered = render(io.BytesIO(data), RenderOptions(), location=True)

    # THEN pi-heif read its header, its pixels and its EXIF
    assert rendered.loader == "pi_heif"
    assert rendered.capture == CAMERA_WITH_POSITION


def test_a_png_whose_exif_block_is_over_the_limit_publishes_without_it(upright: pyvips.Image) -> None:
    # GIVEN a PNG whose eXIf chunk (after its header chunk) is a phone's block padded to 2 MB: written
    # by hand, as libvips' writer re-encodes a block and drops the padding
    png = bytes(upright.pngsave_buffer())
    header_end = 8 + 25
    chunk = hostile._png_chunk(b"eXIf", exif.camera()[6:] + bytes(2 << 20))
    data = png[:header_end] + chunk + png[header_end:]

    # WHEN it is rendered
    rendered = render(io.BytesIO(data), RenderOptions(), location=True)

    # THEN it renders, with nothing read from the block, and says why
    assert len(rendered.variants) >= 2
    assert rendered.capture == NO_CAPTURE
    assert (
        rendered.capture_problem
        == f"an EXIF block of {len(exif.camera()) - 6 + (2 << 20)} bytes, over {capture.MAX_EXIF_BYTES}"
    )


def _fields(value: Capture) -> dict[str, Any]:
    return {name: getattr(value, name) for name in Capture.__dataclass_fields__}
