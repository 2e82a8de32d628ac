"""How many prefix-code groups a lossless WebP stream (VP8L, RFC 9649) names, read without decoding it.

libwebp builds the lookup tables of every group before it decodes a pixel: up to 65536 groups of up
to 5004 four-byte entries each (its kTableSize, with a colour cache of 2048). A hand-built file of
half a megabyte names them all and holds 366 MB; with a colour cache, 899 MB (measured). Real encoders
keep to a few thousand groups (libwebp's to 2600). The count is the entropy image's largest group
number, and the entropy image comes after the transforms' own images, so those are walked too: each
is a small entropy-coded image, decoded here only as far as its literals (a backward reference or a
colour cache hit copies an earlier pixel, so the largest value is a literal's). Where the images to
walk are larger than real encoders make them, or the stream is broken, the most is assumed.
"""

from __future__ import annotations

MOST_GROUPS = 65536
# Bytes of lookup tables a group holds in libwebp, by colour cache bits (its kTableSize, 4 bytes an
# entry), and the group's own record.
_TABLE_ENTRIES = (2954, 2956, 2958, 2962, 2970, 2986, 3018, 3082, 3212, 3468, 3980, 5004)
_GROUP_RECORD = 64
# The transforms' and entropy images' pixels walked at most (real encoders: a few tens of thousands
# at 100 MP); beyond, the most is assumed rather than spending the render's time here.
_MOST_PIXELS_WALKED = 1 << 18
_CODE_LENGTH_ORDER = (17, 18, 0, 1, 2, 3, 4, 5, 16, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
_PREDICTOR, _CROSS_COLOR, _SUBTRACT_GREEN, _COLOR_INDEXING = range(4)


class _Broken(ValueError):
    pass


def table_bytes(stream: bytes | bytearray, width: int, height: int) -> int:
    """The bytes libwebp's prefix-code tables take for this image stream (the bytes after a VP8L
    chunk's 5-byte header, or an ALPH chunk's lossless stream), at most the most there can be."""
    try:
        groups, cache_bits = _Reader(stream).groups(width, height)
    except (_Broken, IndexError):
        groups, cache_bits = MOST_GROUPS, len(_TABLE_ENTRIES) - 1
    return groups * (4 * _TABLE_ENTRIES[cache_bits] + _GROUP_RECORD)


class _Reader:
    def __init__(self, data: bytes | bytearray) -> None:
        self.data, self.at, self.walked = data, 0, 0

    def bits(self, count: int) -> int:
        """The next `count` bits, least significant first, as VP8L packs them."""
        start = self.at >> 3
        value = int.from_bytes(self.data[start : start + 5], "little") >> (self.at & 7)
        if self.at + count > 8 * len(self.data):
            raise _Broken("the stream ends")
        self.at += count
        return value & ((1 << count) - 1)

    def groups(self, width: int, height: int) -> tuple[int, int]:
        """The main image's group count and colour cache bits (RFC 9649 5 and 6)."""
        seen: set[int] = set()
        while self.bits(1):
            kind = self.bits(2)
            if kind in seen:
                raise _Broken("a transform twice")
            seen.add(kind)
            if kind in (_PREDICTOR, _CROSS_COLOR):
                block = self.bits(3) + 2
                self.image(-(-width >> block), -(-height >> block))
            elif kind == _COLOR_INDEXING:
                colors = self.bits(8) + 1
                self.image(colors, 1)
                width = -(-width >> (3 if colors <= 2 else 2 if colors <= 4 else 1 if colors <= 16 else 0))
        cache_bits = self.cache_bits()
        groups = 1
        if self.bits(1):  # meta prefix codes: the entropy image names each block's group
            block = self.bits(3) + 2
            largest = self.image(-(-width >> block), -(-height >> block))
            groups = min(((largest >> 8) & 0xFFFF) + 1, MOST_GROUPS)
        return groups, cache_bits

    def cache_bits(self) -> int:
        if not self.bits(1):
            return 0
        bits = self.bits(4)
        if not 1 <= bits <= 11:
            raise _Broken("a colour cache out of range")
        return bits

    def image(self, width: int, height: int) -> int:
        """Walk an entropy-coded image of one group; its largest literal pixel (ARGB)."""
        pixels = width * height
        self.walked += pixels
        if self.walked > _MOST_PIXELS_WALKED:
            raise _Broken("more than real encoders make")
        cache = self.cache_bits()
        green, red, blue, alpha, distance = (
            self.code(256 + 24 + (1 << cache if cache else 0)),
            self.code(256),
            self.code(256),
            self.code(256),
            self.code(40),
        )
        largest, at = 0, 0
        while at < pixels:
            symbol = green.read(self)
            if symbol < 256:  # a literal: green, then red, blue and alpha
                argb = red.read(self) << 16 | symbol << 8 | blue.read(self)
                largest = max(largest, alpha.read(self) << 24 | argb)
                at += 1
            elif symbol < 256 + 24:
                at += self.prefixed(symbol - 256)
                self.prefixed(distance.read(self))
            else:
                at += 1  # a colour cache hit: an earlier pixel
        if at > pixels:
            raise _Broken("a backward reference past the image")
        return largest

    def prefixed(self, prefix: int) -> int:
        if prefix < 4:
            return prefix + 1
        extra = (prefix - 2) >> 1
        return ((2 + (prefix & 1)) << extra) + self.bits(extra) + 1

    def code(self, alphabet: int) -> _Code:
        """A prefix code (RFC 9649 3.7.2.1): simple, or its lengths coded by a code of lengths."""
        lengths = [0] * alphabet
        if self.bits(1):  # simple
            symbols = self.bits(1) + 1
            first = self.bits(8 if self.bits(1) else 1)
            chosen = [first] + ([self.bits(8)] if symbols == 2 else [])
            if max(chosen) >= alphabet:
                raise _Broken("a symbol out of its alphabet")
            for symbol in chosen:
                lengths[symbol] = 1
            return _Code(lengths)
        code_lengths = [0] * 19
        for index in range(self.bits(4) + 4):
            code_lengths[_CODE_LENGTH_ORDER[index]] = self.bits(3)
        of_lengths = _Code(code_lengths)
        most = alphabet
        if self.bits(1):
            most = 2 + self.bits(2 + 2 * self.bits(3))
            if most > alphabet:
                raise _Broken("more lengths than symbols")
        symbol, previous = 0, 8
        while symbol < alphabet and most:
            most -= 1
            length = of_lengths.read(self)
            if length < 16:
                lengths[symbol] = length
                symbol += 1
                previous = length or previous
                continue
            extra, offset = ((2, 3), (3, 3), (7, 11))[length - 16]
            repeat = self.bits(extra) + offset
            if symbol + repeat > alphabet:
                raise _Broken("a repeat past the alphabet")
            lengths[symbol : symbol + repeat] = [previous if length == 16 else 0] * repeat
            symbol += repeat
        return _Code(lengths)


class _Code:
    """A canonical prefix code, read from the stream through a table of its longest code's bits."""

    def __init__(self, lengths: list[int]) -> None:
        used = [(length, symbol) for symbol, length in enumerate(lengths) if length]
        if not used:
            raise _Broken("a code of no symbol")
        self.only = used[0][1] if len(used) == 1 else None  # one symbol: no bit read
        self.longest = max(length for length, _ in used)
        if self.longest > 15:
            raise _Broken("a code longer than 15 bits")
        self.table: list[tuple[int, int] | None] = [None] * (1 << self.longest)
        code, last = 0, 0
        for length, symbol in sorted(used):
            code <<= length - last
            last = length
            if code >> length:
                raise _Broken("an over-subscribed code")
            # The stream holds a code's first bit lowest: index by its bits reversed.
            reversed_code = int(f"{code:0{length}b}"[::-1], 2)
            for high in range(1 << (self.longest - length)):
                self.table[reversed_code | high << length] = (symbol, length)
            code += 1

    def read(self, reader: _Reader) -> int:
        if self.only is not None:
            return self.only
        start = reader.at
        entry = self.table[reader.bits(self.longest)]
        if entry is None:
            raise _Broken("no code for these bits")
        reader.at = start + entry[1]
        return entry[0]
