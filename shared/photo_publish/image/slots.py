"""What one render may hold: the function's memory, shared among the renders in flight (SPEC 3, amended).

Bounded is not the same as small. The bound is the function's memory (Lambda's
AWS_LAMBDA_FUNCTION_MEMORY_SIZE), less what the process holds of its own, shared among what runs at
once:

    available = memory - resident - HEAP_GROWTH
    slot      = (available - (records - renders) x RECORD_RESERVE) / renders - work
    whole     =  available - (records - 1) x RECORD_RESERVE - work

`resident` is measured (the process's resident set when the service is built: the interpreter, libvips,
boto3, the engine); `records` and `renders` are RECORD_CONCURRENCY and RENDER_CONCURRENCY. A render
is admitted by what its header says its decoder will hold (pipeline._Header): within a slot it renders
beside the others; over a slot but within the whole, it waits until no other render runs and renders
alone (publish/service.py's gate); over the whole, nothing this function runs could hold it:
DIMENSIONS_EXCEEDED. Every render also holds its `work` beyond its header's figure (RENDER_WORK, and
AVIF_WORK more where the ladder is encoded in AVIF too), so RENDER_CONCURRENCY slots, each with its
work, the reserves and the resident set add up to the function's memory.

Stdlib and the settings only: the process function derives its budget here without libvips, and
the settings keep the plain numbers it is derived from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from photo_publish.settings import TEMPLATE_MEMORY_MB, InvalidSettings, Settings

MIB = 1 << 20
# What glibc's heap keeps above the resident set measured at the cold start once renders have run
# (the trim after each batch gives most of it back; docs/performance.md, Memory: 94 MB at the
# cold start, 105-112 MB warm, peaks 135-147 MB).
HEAP_GROWTH = 64 * MIB
# What a record in flight holds while it does not render: its original's open stream, its encoded
# variants until they are put (a 2048 browse and its thumb: about 1 MB), its rows.
RECORD_RESERVE = 16 * MIB
# What a render holds beyond its header's figure: libvips' buffers and threads, the browse in memory,
# the encoders (benchmarks/fullsize.py measures it for every accepted format at 100 MP, and
# benchmarks/hostile.py for the hostile corpus: at most 77 MB over the count, a float TIFF's; a
# picture with alpha counts its premultiplied browse in its header's figure, pipeline._ALPHA_WORK).
RENDER_WORK = 96 * MIB
# What the AVIF encoder holds more, where VARIANT_FORMATS has avif (libaom's frames of each step of
# the ladder, an alpha coded as a second picture): with it, at most 159 MB over the count, a 2048 x
# 2048 lossy WebP with alpha, whose browse is the picture itself (benchmarks/fullsize.py).
AVIF_WORK = 96 * MIB
# The process function's resident set at its cold start, where it cannot be measured (no /proc) and
# for a render outside the function (tests, benchmarks, the fuzzer): measured 93-94 MB here (x86_64,
# the handler's imports and clients), with room for the Lambda runtime's own.
NOMINAL_RESIDENT = 128 * MIB


class TooSmall(ValueError):
    """The function's memory cannot hold its renders at once (`decode_budget` names the variables)."""


@dataclass(frozen=True, slots=True)
class DecodeBudget:
    """What a render's decoder may hold beside the others (`slot`) and alone (`whole`), in bytes."""

    slot: int
    whole: int
    memory: int
    resident: int
    records: int
    renders: int
    work: int = RENDER_WORK  # what each render holds beyond its header's figure
    # The renders at once asked for (RENDER_CONCURRENCY): more than `renders` where they do not fit.
    asked: int = 0
    formats: tuple[str, ...] = ("webp",)  # the ladder's (VARIANT_FORMATS), whose encoders the work counts

    @classmethod
    def of(
        cls,
        *,
        memory_mb: int,
        records: int,
        renders: int,
        resident: int = NOMINAL_RESIDENT,
        formats: tuple[str, ...] = ("webp",),
    ) -> DecodeBudget:
        memory = memory_mb * MIB
        asked = min(renders, records)  # no more renders at once than records in flight
        work = render_work(formats)
        available = memory - resident - HEAP_GROWTH

        def slot_of(renders: int) -> int:
            return (available - (records - renders) * RECORD_RESERVE) // renders - work

        # Where the memory cannot hold the renders asked for at once, fewer render at once (AVIF's
        # work at 512 MB: one), rather than every photo failing at every cold start.
        renders = next((n for n in range(asked, 0, -1) if slot_of(n) >= 0), 0)
        if not renders:
            least = -(-(resident + HEAP_GROWTH + (records - 1) * RECORD_RESERVE + work) // MIB)
            raise TooSmall(f"one render beside {records - 1} records needs at least {least} MB")
        whole = available - (records - 1) * RECORD_RESERVE - work
        return cls(slot_of(renders), whole, memory, resident, records, renders, work, asked, formats)

    def with_memory(self, memory_mb: int) -> DecodeBudget:
        """The same function's budget with `memory_mb` of memory."""
        return self._again(memory_mb, self.formats)

    def encoding(self, formats: tuple[str, ...]) -> DecodeBudget:
        """The same function's budget where the ladder is encoded in `formats`."""
        return self._again(self.memory // MIB, formats)

    def _again(self, memory_mb: int, formats: tuple[str, ...]) -> DecodeBudget:
        renders = self.asked or self.renders
        return DecodeBudget.of(
            memory_mb=memory_mb,
            records=self.records,
            renders=renders,
            resident=self.resident,
            formats=formats,
        )

    def describe(self) -> str:
        """Where the two figures come from, for a refusal's detail and the cold start's log line."""
        fewer = f" of {self.asked} asked, as many as the memory holds" if self.renders < self.asked else ""
        return (
            f"{self.memory // MIB} MB of function memory, less {self.resident // MIB} MB resident, "
            f"{HEAP_GROWTH // MIB} MB of heap growth and {RECORD_RESERVE // MIB} MB for each other record "
            f"in flight ({self.records} at once, {self.renders} rendering{fewer}); a render's own work "
            f"{self.work // MIB} MB"
        )


def decode_budget(settings: Settings, resident: int | None = None) -> DecodeBudget:
    """What a render's decoder may hold under `settings`, in a shared slot and alone, given this
    process's resident set (measured where it can be, else the function's as measured here).

    Asked by the process function only, when it builds its service (its first batch): the other
    functions render nothing, whatever their memory. Memory too small for one render is a
    configuration error, refused like any other setting (InvalidSettings).
    """
    memory, records, renders = (
        settings.aws_lambda_function_memory_size,
        settings.record_concurrency,
        settings.render_concurrency,
    )
    try:
        return DecodeBudget.of(
            memory_mb=memory,
            records=records,
            renders=renders,
            resident=NOMINAL_RESIDENT if resident is None else resident,
            formats=settings.variant_formats,
        )
    except TooSmall as error:
        raise InvalidSettings(
            f"AWS_LAMBDA_FUNCTION_MEMORY_SIZE ({memory}) is too small for RECORD_CONCURRENCY "
            f"({records}) and RENDER_CONCURRENCY ({renders}): {error}"
        ) from None


def render_work(formats: tuple[str, ...]) -> int:
    """What a render holds beyond its header's figure, where its ladder is encoded in `formats`."""
    return RENDER_WORK + (AVIF_WORK if "avif" in formats else 0)


def resident_bytes() -> int | None:
    """This process's resident set (VmRSS), or None where the kernel does not say (no /proc)."""
    try:
        with open("/proc/self/status") as status:  # noqa: PTH123
            text = status.read()
    except OSError:
        return None
    found = re.search(r"^VmRSS:\s+(\d+) kB", text, re.MULTILINE)
    return int(found.group(1)) * 1024 if found else None


# What a render outside the function assumes: the template's memory, the default concurrency.
DEFAULT = DecodeBudget.of(memory_mb=TEMPLATE_MEMORY_MB, records=4, renders=2)
