"""What a file's own bytes say about how its decoder lays the picture out in memory: a HEIF's chroma
subsampling, a strip TIFF's rows read at once, a still WebP's chunks. The render's count of what a
decoder holds (pipeline._Header) reads them; tests/unit/test_fullsize.py measures that count against
real peaks at 100 MP. Each file here is made by a real encoder.
"""

from __future__ import annotations

import io

import pytest
import pyvips
from PIL import Image

from devkit import samples
from photo_publish.image import frames, heic, tiff, vp8l


def _tile() -> pyvips.Image:
    return samples.photograph().crop(0, 0, 256, 256)


@pytest.mark.parametrize(("chroma", "samples_a_pixel"), [(420, 1.5), (422, 2.0), (444, 3.0)])
def test_a_heics_chroma_subsampling_is_read_from_its_hevc_configuration(
    chroma: int, samples_a_pixel: float
) -> None:
    # GIVEN an HEVC-coded HEIF made by x265 at that subsampling
    data = samples.heic(_tile(), tile_size=0, chroma=chroma)

    # WHEN its samples a pixel are read (no pixel decoded) THEN they are the subsampling's
    assert heic.coded(data).samples == samples_a_pixel


@pytest.mark.parametrize(("subsampled", "samples_a_pixel"), [(True, 1.5), (False, 3.0)])
def test_an_avifs_chroma_subsampling_is_read_from_its_av1_configuration(
    subsampled: bool, samples_a_pixel: float
) -> None:
    # GIVEN an AV1-coded HEIF made by libvips (aom), subsampled or not
    mode = "on" if subsampled else "off"
    data = bytes(_tile().heifsave_buffer(compression="av1", Q=50, effort=0, subsample_mode=mode))

    # THEN its samples a pixel are read from its av1C box
    assert heic.coded(data).samples == samples_a_pixel


def test_a_heif_whose_configuration_cannot_be_read_counts_as_the_fullest() -> None:
    # GIVEN a HEIF cut short before its properties, and bytes that are no HEIF at all
    whole = samples.heic(_tile(), tile_size=0)
    cut = whole[: whole.index(b"iprp") + 12]

    # THEN each counts 3 samples a pixel (4:4:4), the most a decoder could hold
    assert heic.coded(cut).samples == 3.0
    assert heic.coded(b"\x00" * 64).samples == 3.0


def _pillow_tiff(mode: str, **options: object) -> bytes:
    picture = Image.frombytes(
        "RGB", (300, 200), _tile().resize(300 / 256, vscale=200 / 256).write_to_memory()
    )
    out = io.BytesIO()
    picture.convert(mode).save(out, "TIFF", **options)
    return out.getvalue()


def test_a_one_strip_ycbcr_jpeg_tiff_is_read_whole() -> None:
    # GIVEN a JPEG-coded YCbCr TIFF written as one strip (Pillow, as scanners write them)
    data = _pillow_tiff("YCbCr", compression="jpeg", strip_size=2**40)

    # THEN libvips reads the whole strip at once: every row
    assert tiff.rows_read_at_once(data, 200) == 200


def test_a_one_strip_rgb_tiff_is_read_a_scanline_at_a_time() -> None:
    # GIVEN the same picture as RGB in one strip of more than 128 rows
    data = _pillow_tiff("RGB", compression="jpeg", strip_size=2**40)

    # THEN libvips reads it a scanline at a time
    assert tiff.rows_read_at_once(data, 200) == 1


@pytest.mark.parametrize("bigtiff", [False, True])
def test_small_strips_are_read_a_strip_at_a_time_in_tiff_and_bigtiff(bigtiff: bool) -> None:
    # GIVEN libvips' own strip TIFF (strips of a few rows), classic or BigTIFF
    data = bytes(_tile().tiffsave_buffer(bigtiff=bigtiff))
    rows = Image.open(io.BytesIO(data)).tag_v2[278]

    # THEN a strip's rows are read at once
    assert rows <= 128
    assert tiff.rows_read_at_once(data, 256) == rows


def test_a_tiff_whose_tags_cannot_be_read_counts_every_row() -> None:
    data = _pillow_tiff("RGB")
    assert tiff.rows_read_at_once(data[:12], 200) == 200
    assert tiff.rows_read_at_once(b"II+\x00" + b"\xff" * 12, 200) == 200


@pytest.mark.parametrize(
    ("options", "alpha"), [({"Q": 75}, False), ({"lossless": True}, False), ({"Q": 75}, True)]
)
def test_a_still_webps_chunks_say_lossless_and_alpha(options: dict[str, object], alpha: bool) -> None:
    # GIVEN a still WebP made by libwebp: lossy, lossless, or lossy with an alpha
    picture = _tile()
    if alpha:
        picture = picture.bandjoin(picture.extract_band(1))
    chunks = set(frames.webp_chunks(bytes(picture.webpsave_buffer(**options))))

    # THEN its chunks say which: VP8L for lossless, ALPH beside VP8 for an alpha
    assert (b"VP8L" in chunks, b"ALPH" in chunks) == (bool(options.get("lossless")), alpha)
    assert (b"VP8 " in chunks) != (b"VP8L" in chunks)
    # AND what is no WebP has none
    assert frames.webp_chunks(b"RIFF\x00\x00\x00\x00WAVE") == {}


@pytest.mark.parametrize(("chroma", "bits"), [(420, 10), (422, 8), (444, 8), (444, 10)])
def test_a_heics_layout_is_read_from_its_parameter_sets_whatever_its_box_says(chroma: int, bits: int) -> None:
    # GIVEN an HEVC HEIF, and the same file whose hvcC box says 4:2:0 at 8 bits (its SPS unchanged:
    # libde265 decodes what the SPS says)
    data = samples.heic(_tile(), tile_size=0, chroma=chroma, bits=bits)
    lying = bytearray(data)
    iprp = heic._children(lying, *(heic._meta(lying) or {})[b"iprp"])
    for kind, start, _ in heic.walk_boxes(lying, *iprp[b"ipco"]):
        if kind == b"hvcC":
            lying[start + 16] = (lying[start + 16] & ~3) | 1
            lying[start + 17] &= ~7
            lying[start + 18] &= ~7

    # THEN both read as what the SPS codes
    expected = heic.Coded({420: 1.5, 422: 2.0, 444: 3.0}[chroma], bits)
    assert heic.coded(data) == expected
    assert heic.coded(bytes(lying)) == expected


def test_an_avifs_profile_in_its_sequence_header_outranks_its_box() -> None:
    # GIVEN a 4:4:4 AVIF (AV1 High profile) whose av1C box says 4:2:0
    data = bytearray(_tile().heifsave_buffer(compression="av1", Q=50, effort=0, subsample_mode="off"))
    iprp = heic._children(data, *(heic._meta(data) or {})[b"iprp"])
    for kind, start, _ in heic.walk_boxes(data, *iprp[b"ipco"]):
        if kind == b"av1C":
            data[start + 2] = (data[start + 2] & ~0x1C) | 0x0C

    # THEN it reads as 4:4:4, from the sequence header its decoder reads
    assert heic.coded(bytes(data)).samples == 3.0


@pytest.mark.parametrize("effort", [0, 4, 6])
def test_a_lossless_webp_from_libwebp_names_few_prefix_code_groups(effort: int) -> None:
    # GIVEN the photograph as libwebp writes it lossless, at three efforts
    data = bytes(samples.photograph().webpsave_buffer(lossless=True, effort=effort))
    start, end = frames.webp_chunks(data)[b"VP8L"]

    # WHEN its stream is walked to its entropy image
    groups, cache_bits = vp8l._Reader(data[start + 5 : end]).groups(2560, 1600)

    # THEN it names a few groups (libwebp's encoder keeps to 2600), whose tables are a few hundred KB
    assert 1 <= groups <= 2600
    assert vp8l.table_bytes(data[start + 5 : end], 2560, 1600) < (1 << 20) * groups // 40
    assert 0 <= cache_bits <= 11


def test_a_lossless_stream_cut_short_counts_the_most_groups() -> None:
    data = bytes(samples.photograph().webpsave_buffer(lossless=True, effort=4))
    start, _ = frames.webp_chunks(data)[b"VP8L"]
    most = vp8l.MOST_GROUPS * (4 * 5004 + 64)
    assert vp8l.table_bytes(data[start + 5 : start + 40], 2560, 1600) == most
    assert vp8l.table_bytes(b"", 1, 1) == most
