"""HEVC-coded HEIF (phone photos), decoded by libheif through pi-heif.

The prebuilt libvips reads a HEIC's header but has no HEVC decoder. pi-heif (libheif and libde265,
LGPL, decode only) decodes the primary image into one interleaved buffer, which libvips wraps without
a copy; from there the photo goes through the same pipeline as any other.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

import pyvips

from photo_publish.errors import ErrorCode, PhotoError

# libvips' heifload header field, and the value that routes a HEIF here (AVIF says "av1").
COMPRESSION_FIELD = "heif-compression"
COMPRESSION = "hevc"
# What `Rendered.loader` says for a photo decoded here.
DECODER = "pi_heif"

# pi-heif's documented exceptions, by type: invalid input (ValueError), corrupted data (EOFError),
# an unsupported feature (SyntaxError), any other libheif error (RuntimeError), and libheif's
# refusals to allocate, its security limits among them (OSError). Each is the file's fault.
_DECODE_ERRORS = (ValueError, EOFError, SyntaxError, RuntimeError, OSError)


@dataclass(frozen=True, slots=True)
class Declared:
    """What a HEIF's primary image declares, read by pi-heif without decoding it."""

    width: int
    height: int
    bands: int
    sample_bytes: int  # 2 for 10 and 12-bit pictures


def header(data: bytes | bytearray) -> Declared:
    """The primary image's size and samples, as pi-heif's libheif reads them (no pixel decoded).

    libvips' own libheif refuses HEIFs of more than 256 items (grid tiles, auxiliary images,
    metadata); pi-heif's allows libheif's default of 1000, so it reads the files libvips refuses.
    """
    import pi_heif

    try:
        heif = pi_heif.open_heif(data, convert_hdr_to_8bit=False)
        _has_an_image(heif)
        width, height = heif.size
        mode = str(heif.mode)
    except _DECODE_ERRORS as error:
        raise PhotoError(ErrorCode.DECODE_FAILED, repr(error)) from None
    channels, _, depth = mode.partition(";")
    return Declared(width, height, len(channels), 2 if depth else 1)


def exif(data: bytes | bytearray) -> bytes | None:
    """The primary image's EXIF block as libheif gives it (no pixel decoded), for a HEIF whose
    header libvips could not read; None where it has none, or libheif cannot open the file (the
    decode says why)."""
    import pi_heif

    try:
        heif = pi_heif.open_heif(data, convert_hdr_to_8bit=False)
        _has_an_image(heif)
        block = heif.info.get("exif")
    except _DECODE_ERRORS:
        return None
    return bytes(block) if block else None


def _has_an_image(heif: object) -> None:
    # A file whose every image libheif refused opens as an empty HeifFile, whose properties raise
    # IndexError (found by the fuzzer: the pipeline took it for an unexpected error, and retried).
    if not len(heif):  # type: ignore[arg-type]
        raise ValueError("no image libheif can read")


@contextmanager
def decoded(data: bytes | bytearray, *, eight_bit: bool = False) -> Iterator[pyvips.Image]:
    """The primary image of an HEVC-coded HEIF, upright, at full size, with its ICC profile.

    The image is valid inside the `with` block only: libvips reads libheif's own buffer, without a
    copy, and pi-heif hands it out as a memoryview that does not keep it alive (measured: once the
    decoded file was collected, libvips read freed memory, pictures came out shifted). Make what
    you need from it (`copy_memory()`) before the block ends.

    Only the primary is decoded: the other images of a burst or a stereo pair, thumbnails, depth
    maps and gain maps are never touched. A grid (iPhones code 512 x 512 tiles) comes out whole.
    10 and 12-bit pictures come out as 16 bits, so that libvips rounds them to 8 bits after the
    colour conversion (libheif's own reduction to 8 bits truncates: measured 0.6 darker on average),
    unless `eight_bit` asks for libheif's reduction: half the memory, for pictures too large for 16.

    Memory: not streamed. About 4.5 bytes a pixel for 8-bit (the YCbCr planes, then the RGB), about
    9 for 10-bit, which is why the caller refuses oversized pictures from the header first.
    """
    # Imported on the first HEIC, not with the pipeline: it costs 25 ms (and Pillow's import) that
    # a cold start with a JPEG need not pay.
    import pi_heif

    try:
        heif = pi_heif.open_heif(data, convert_hdr_to_8bit=eight_bit)
        _has_an_image(heif)
        pixels = heif.data  # decodes the primary image, and only it
        width, height = heif.size
        mode = str(heif.mode)
        profile = heif.info.get("icc_profile")
    except _DECODE_ERRORS as error:
        raise PhotoError(ErrorCode.DECODE_FAILED, repr(error)) from None

    # Modes are "L", "LA", "RGB", "RGBA" (a lower-case "a": premultiplied alpha), ";16" when deeper
    # than 8 bits ("I;16" for grey).
    channels, _, depth = mode.partition(";")
    bands, wide = len(channels), bool(depth)
    if len(pixels) != width * height * bands * (2 if wide else 1):
        raise PhotoError(ErrorCode.DECODE_FAILED, f"{len(pixels)} bytes for {width}x{height} {mode}")
    image = pyvips.Image.new_from_memory(pixels, width, height, bands, "ushort" if wide else "uchar")
    colour = bands >= 3
    image = image.copy(
        interpretation=("rgb16" if colour else "grey16") if wide else ("srgb" if colour else "b-w")
    )
    if channels.endswith("a"):
        image = image.unpremultiply(max_alpha=65535 if wide else 255).cast(image.format)
    if profile:
        # The profile is what the colour conversion starts from (iPhones: Display P3).
        image.set_type(pyvips.GValue.blob_type, "icc-profile-data", bytes(profile))
    # Nothing else is carried over, EXIF least of all: libheif has already turned the picture
    # upright by the file's `irot`/`imir`, and the EXIF Orientation Apple also writes describes that
    # same turn. With no orientation on the image, libvips cannot apply it a second time.
    yield image  # `heif`, which owns the pixels, lives on until the block ends


# --- what a HEIF's boxes say, checked before libheif reads them -----------------------------------

# Derived images that libheif composes on a canvas of their own: a grid of tiles, an overlay.
_DERIVED = frozenset({b"grid", b"iovl"})
# A file whose boxes cannot be walked is left to libheif, which refuses it.
_UNWALKABLE = (IndexError, KeyError, struct.error)


def check_names(data: bytes | bytearray) -> None:
    """Refuse a HEIF whose item types and names are not UTF-8, before pi-heif reads them.

    pi-heif hands a metadata item's type and content type to Python unchecked: one that is not
    UTF-8 crashes the interpreter (found by the fuzzer: a segfault in pi-heif's metadata getter
    for an EXIF item typed b"\\xe1xif", one flipped byte of a phone's HEIC). The standard has them
    UTF-8; a file that breaks it is refused (DECODE_FAILED).
    """
    with suppress(*_UNWALKABLE):
        meta = _meta(data)
        for _, item_type, names in _infes(data, *meta[b"iinf"]) if meta else ():
            for text in (item_type.partition(b"\0")[0], *names.split(b"\0")):
                try:
                    text.decode("utf-8")
                except UnicodeDecodeError:
                    raise PhotoError(ErrorCode.DECODE_FAILED, f"an item is named {text!r}") from None


def check_canvas(data: bytes | bytearray) -> None:
    """Refuse a HEIF with a grid or an overlay composed on a canvas other than the size it declares.

    A grid (or overlay) image says its size twice: in its `ispe` property, which libheif reports
    and the limits judge, and in its own descriptor, the canvas libheif allocates and decodes every
    tile onto, before it compares the two. A file that lies is refused by libheif only after that
    (found by the fuzzer, then measured: one tile repeated 900 times on a canvas of 15000 x 15000,
    declaring 128 x 128, held 448 MB for 10 s before libheif's DECODE_FAILED; declaring no size at
    all, it rendered, at 1.1 GB). The same comparison here, on the boxes, costs microseconds. Every
    grid and overlay of the file is compared, not only the primary: an identity image (`iden`) may
    show one.
    """
    with suppress(*_UNWALKABLE):
        for item, canvas, declared in _canvases(data):
            if canvas != declared:
                raise PhotoError(
                    ErrorCode.DECODE_FAILED, f"item {item} declares {declared}, its canvas is {canvas}"
                )


@dataclass(frozen=True, slots=True)
class Coded:
    """How a HEIF's coded pictures lay out in their decoder: samples a pixel (1 monochrome, 1.5 for
    4:2:0, 2 for 4:2:2, 3 for 4:4:4) and the deepest bit depth, of the fullest picture in the file."""

    samples: float
    bits: int


def coded(data: bytes | bytearray) -> Coded:
    """What the decoders will decode, read without decoding: from each decoder configuration box
    (`hvcC`, `av1C`) and from what the decoders themselves read, the parameter sets an `hvcC`
    carries (its SPS) and each AV1 item's sequence header (profile, bit depth): a box that says less than
    its pictures are is no cheaper to decode. Every coded picture counts (a grid's tiles, a
    thumbnail, a gain map); where none can be read, 4:4:4, the most it can be."""
    samples, bits = 0.0, 8
    layouts: list[tuple[float, int] | None] = []
    with suppress(KeyError, IndexError, ValueError, struct.error):
        boxes = _meta(data) or {}
        iprp = _children(data, *boxes[b"iprp"])
        for kind, start, end in walk_boxes(data, *iprp[b"ipco"]):
            if kind == b"hvcC" and end - start > 22:
                samples = max(samples, _HEVC_SAMPLES[data[start + 16] & 3])
                bits = max(bits, 8 + (data[start + 17] & 7), 8 + (data[start + 18] & 7))
                for chroma, depth in _hvcc_sps(data, start + 23, end):
                    samples, bits = max(samples, _HEVC_SAMPLES[chroma & 3]), max(bits, depth)
            elif kind == b"av1C" and end - start > 2:
                flags = data[start + 2]
                across, down = bool(flags & 0x08), bool(flags & 0x04)
                samples = max(samples, 1.0 if flags & 0x10 else 1 + 2 / ((1 + across) * (1 + down)))
                bits = max(bits, 12 if flags & 0x20 else 10 if flags & 0x40 else 8)
                layouts.append(_av1_layout(data[start + 4 : end]))
        # The first AV1 items (a grid's first tiles: libheif lays the canvas out as its first tile
        # decodes), a bounded number: each is found by a walk of the whole item location box.
        pictures = (item for item, kind, _ in _infes(data, *boxes[b"iinf"]) if kind == b"av01")
        for item in itertools.islice(pictures, _AV1_ITEMS_READ):
            layouts.append(_av1_layout(_item_data(data, boxes, item) or b""))
    for layout in filter(None, layouts):
        samples, bits = max(samples, layout[0]), max(bits, layout[1])
    return Coded(samples or 3.0, bits)


# hvcC's chroma_format_idc: monochrome, 4:2:0, 4:2:2, 4:4:4.
_HEVC_SAMPLES = (1.0, 1.5, 2.0, 3.0)
_HEVC_SPS = 33
_AV1_SEQUENCE_HEADER = 1
_AV1_ITEMS_READ = 16


class _Bits:
    """A bitstream read most significant bit first: fixed-width numbers, H.265's Exp-Golomb codes
    (ue(v)) and AV1's uvlc()."""

    def __init__(self, payload: bytes | bytearray, *, h265: bool = False) -> None:
        # An H.265 NAL's emulation prevention bytes (00 00 03) are the encoder's, not the syntax's.
        self.data = bytes(payload).replace(b"\x00\x00\x03", b"\x00\x00") if h265 else payload
        self.at = 0

    def u(self, width: int) -> int:
        value = 0
        for _ in range(width):
            value = value << 1 | (self.data[self.at >> 3] >> (7 - (self.at & 7))) & 1
            self.at += 1
        return value

    def ue(self) -> int:
        zeros = 0
        while not self.u(1):
            zeros += 1
            if zeros > 31:
                raise ValueError("an Exp-Golomb code longer than 32 bits")
        return (1 << zeros) - 1 + self.u(zeros)

    uvlc = ue  # AV1 4.10.3: the same code


def _hvcc_sps(data: bytes | bytearray, at: int, end: int) -> Iterator[tuple[int, int]]:
    """Each SPS in an hvcC's arrays: its chroma_format_idc and deepest bit depth (ITU-T H.265 7.3.2.2)."""
    for _ in range(data[at - 1]):  # numOfArrays
        nal_type, count = data[at] & 0x3F, struct.unpack_from(">H", data, at + 1)[0]
        at += 3
        for _ in range(count):
            length = struct.unpack_from(">H", data, at)[0]
            nal = bytes(data[at + 2 : min(at + 2 + length, end)])
            at += 2 + length
            if nal_type == _HEVC_SPS:
                yield _sps(_Bits(nal[2:], h265=True))  # after the NAL unit header


def _sps(bits: _Bits) -> tuple[int, int]:
    bits.u(4)  # sps_video_parameter_set_id
    sub_layers = bits.u(3)
    bits.u(1)
    bits.u(96)  # the general profile, tier and level
    present = [(bits.u(1), bits.u(1)) for _ in range(sub_layers)]
    if sub_layers:
        bits.u(2 * (8 - sub_layers))
    for profile, level in present:
        bits.u(88 * profile + 8 * level)
    bits.ue()  # sps_seq_parameter_set_id
    chroma = bits.ue()
    if chroma == 3:
        bits.u(1)  # separate_colour_plane_flag
    bits.ue(), bits.ue()  # the picture's width and height
    if bits.u(1):  # a conformance window
        for _ in range(4):
            bits.ue()
    return chroma, 8 + max(bits.ue(), bits.ue())


def _av1_layout(obus: bytes | bytearray) -> tuple[float, int] | None:
    """Samples a pixel and bit depth of the sequence header among these AV1 OBUs, or None."""
    at = 0
    while at + 1 < len(obus):
        header = obus[at]
        kind, extended, sized = (header >> 3) & 15, header & 4, header & 2
        at += 2 if extended else 1
        size = len(obus) - at
        if sized:
            size, shift = 0, 0
            while True:  # leb128
                byte = obus[at]
                size |= (byte & 0x7F) << shift
                at, shift = at + 1, shift + 7
                if not byte & 0x80 or shift > 56:
                    break
        if kind == _AV1_SEQUENCE_HEADER:
            return _sequence_header(_Bits(obus[at : at + size]))
        at += size
    return None


def _sequence_header(bits: _Bits) -> tuple[float, int]:
    """AV1 5.5.1 sequence_header_obu, read as far as its color_config (5.5.2)."""
    profile, _still, reduced = bits.u(3), bits.u(1), bits.u(1)
    if reduced:
        bits.u(5)  # seq_level_idx
    else:
        _operating_points(bits)
    width_bits, height_bits = bits.u(4) + 1, bits.u(4) + 1
    bits.u(width_bits + height_bits)  # max_frame_width_minus_1, max_frame_height_minus_1
    if not reduced:
        _coding_tools(bits)
    else:
        bits.u(3)  # use_128x128_superblock, enable_filter_intra, enable_intra_edge_filter
    bits.u(3)  # superres, cdef, restoration
    return _color_config(bits, profile)


def _operating_points(bits: _Bits) -> None:
    model = 0
    if bits.u(1):  # timing_info_present_flag
        bits.u(64)  # num_units_in_display_tick, time_scale
        if bits.u(1):  # equal_picture_interval
            bits.uvlc()
        model = bits.u(1)
    delay_length = bits.u(5) + 1 if model else 0
    if model:
        bits.u(32 + 5 + 5)
    display_delay = bits.u(1)
    for _ in range(bits.u(5) + 1):
        bits.u(12)
        if bits.u(5) > 7:
            bits.u(1)  # seq_tier
        if model and bits.u(1):
            bits.u(2 * delay_length + 1)
        if display_delay and bits.u(1):
            bits.u(4)


def _coding_tools(bits: _Bits) -> None:
    if bits.u(1):  # frame_id_numbers_present_flag
        bits.u(7)
    bits.u(3 + 4)  # superblock size, filter intra, intra edge; interintra, masked, warped, dual filter
    order_hint = bits.u(1)
    if order_hint:
        bits.u(2)
    screen_content = 2 if bits.u(1) else bits.u(1)
    if screen_content and not bits.u(1):
        bits.u(1)  # seq_force_integer_mv
    if order_hint:
        bits.u(3)


def _color_config(bits: _Bits, profile: int) -> tuple[float, int]:
    deep = bits.u(1)
    depth = (12 if bits.u(1) else 10) if profile == 2 and deep else 10 if deep else 8
    if profile != 1 and bits.u(1):  # mono_chrome
        return 1.0, depth
    identity = bits.u(1) and bits.u(24) & 0xFF == 0  # sRGB's identity matrix: 4:4:4 whatever the profile
    # Main (0) is 4:2:0; High (1) 4:4:4; Professional (2) 4:2:2 or at 12 bits any: counted at the most.
    return (1.5 if profile == 0 and not identity else 3.0), depth


def walk_boxes(data: bytes | bytearray, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """(type, payload start, payload end) of the boxes in data[start:end]; stops at a broken one."""
    while start + 8 <= end:
        size, kind = struct.unpack_from(">I4s", data, start)
        header = 8
        if size == 1:
            size, header = struct.unpack_from(">Q", data, start + 8)[0], 16
        elif size == 0:
            size = end - start
        if size < header or start + size > end:
            return
        yield kind, start + header, start + size
        start += size


def _children(data: bytes | bytearray, start: int, end: int) -> dict[bytes, tuple[int, int]]:
    found: dict[bytes, tuple[int, int]] = {}
    for kind, s, e in walk_boxes(data, start, end):
        found.setdefault(kind, (s, e))
    return found


def _meta(data: bytes | bytearray) -> dict[bytes, tuple[int, int]] | None:
    """The boxes in the file's `meta` box (a full box: version and flags first)."""
    meta = _children(data, 0, len(data)).get(b"meta")
    return None if meta is None else _children(data, meta[0] + 4, meta[1])


def _infes(data: bytes | bytearray, start: int, end: int) -> Iterator[tuple[int, bytes, bytes]]:
    """Each item's id, type and the bytes of its names (NUL-terminated), from the `iinf` box."""
    first = start + 4 + (2 if data[start] == 0 else 4)
    for kind, s, e in walk_boxes(data, first, end):
        if kind != b"infe":
            continue
        version = data[s]
        if version < 2:  # id, protection index, then names: no type
            yield struct.unpack_from(">H", data, s + 4)[0], b"", bytes(data[s + 8 : e])
            continue
        wide = version >= 3
        at = s + (10 if wide else 8)
        yield (
            struct.unpack_from(">I" if wide else ">H", data, s + 4)[0],
            bytes(data[at : at + 4]),
            bytes(data[at + 4 : e]),
        )


def _canvases(data: bytes | bytearray) -> Iterator[tuple[int, tuple[int, int], tuple[int, int] | None]]:
    """Each grid or overlay item: its id, its canvas and the size it declares (`ispe`, if any)."""
    boxes = _meta(data)
    if boxes is None:
        return
    for item, kind, _ in _infes(data, *boxes[b"iinf"]):
        descriptor = _item_data(data, boxes, item) if kind in _DERIVED else None
        if descriptor is None:
            continue
        # grid: version, flags, rows - 1, columns - 1; iovl: version, flags, four 16-bit fill values.
        at = 4 if kind == b"grid" else 10
        width, height = struct.unpack_from(">II" if descriptor[1] & 1 else ">HH", descriptor, at)
        yield item, (width, height), _ispe(data, boxes, item)


def _item_data(data: bytes | bytearray, boxes: dict[bytes, tuple[int, int]], item: int) -> bytes | None:
    """An item's bytes, from the file (construction method 0) or the meta box's idat (1)."""
    start, end = boxes[b"iloc"]
    version = data[start]
    sizes = data[start + 4] << 8 | data[start + 5]
    offset_size, length_size, base_size = sizes >> 12, (sizes >> 8) & 15, (sizes >> 4) & 15
    index_size = sizes & 15 if version in (1, 2) else 0
    at = start + 6

    def number(size: int) -> int:
        nonlocal at
        if at + size > end:  # a count that lies: the box ends first
            raise IndexError("iloc")
        value = int.from_bytes(data[at : at + size], "big")
        at += size
        return value

    count = number(4 if version == 2 else 2)
    for _ in range(count):
        item_id = number(4 if version == 2 else 2)
        method = number(2) & 15 if version in (1, 2) else 0
        number(2)  # data reference index
        base = number(base_size)
        pieces = []
        for _ in range(number(2)):
            number(index_size)
            offset, length = number(offset_size), number(length_size)
            pieces.append((base + offset, length))
        if item_id != item:
            continue
        if method == 0:
            first, last = 0, len(data)
        elif method == 1 and b"idat" in boxes:
            first, last = boxes[b"idat"]
        else:
            return None
        # An extent of length 0 runs to the end of the file (or of the idat box).
        return b"".join(
            bytes(data[first + offset : first + offset + length if length else last])
            for offset, length in pieces
        )
    return None


def _ispe(data: bytes | bytearray, boxes: dict[bytes, tuple[int, int]], item: int) -> tuple[int, int] | None:
    """The item's `ispe` (image spatial extents), through the property associations of `iprp`."""
    iprp = _children(data, *boxes[b"iprp"])
    properties = list(walk_boxes(data, *iprp[b"ipco"]))
    start, end = iprp[b"ipma"]
    version, wide_index = data[start], data[start + 3] & 1
    entries = struct.unpack_from(">I", data, start + 4)[0]
    at = start + 8
    for _ in range(entries):
        if at >= end:  # a count that lies: the box ends first
            break
        item_id = struct.unpack_from(">I" if version >= 1 else ">H", data, at)[0]
        at += 4 if version >= 1 else 2
        count = data[at]
        at += 1
        for _ in range(count):
            index = (struct.unpack_from(">H", data, at)[0] & 0x7FFF) if wide_index else data[at] & 0x7F
            at += 2 if wide_index else 1
            kind, s, _ = properties[index - 1] if 1 <= index <= len(properties) else (b"", 0, 0)
            if item_id == item and kind == b"ispe":
                width, height = struct.unpack_from(">II", data, s + 4)
                return width, height
    return None
