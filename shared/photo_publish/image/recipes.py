"""Recipes (SPEC 14): everything that decides a variant's bytes, named by VARIANT_VERSION.

Variant objects are cached for a year as immutable, under keys that carry the version. So a version
means one recipe forever: the first function to render a version records its fingerprint, and a
function whose settings hash differently refuses to start rendering (a configuration error,
loud), instead of writing other bytes under keys that caches already hold.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from photo_publish.settings import Settings

# The pipeline's own part of the recipe: bump it with any change to pipeline.py (or its libraries'
# options) that changes the bytes it writes, together with VARIANT_VERSION.
PIPELINE_VERSION = 1
# How colour reaches sRGB (pipeline._converts): through the embedded profile, converting only where
# there is something to convert.
COLOUR_POLICY = "srgb-from-embedded-profile"


_LADDER_FIELDS = ("widths", "formats", "avif_quality", "avif_effort")


class RecipeMismatch(RuntimeError):
    """These settings would write other bytes under an existing version's keys."""


@dataclass(frozen=True, slots=True)
class Recipe:
    thumb_size: int
    browse_size: int
    format: str
    quality: int
    effort: int
    colour: str
    pipeline: int
    # The responsive ladder (SPEC 18): its long edges and formats, and AVIF's settings where it is
    # one of them. Without a ladder, none of these is part of the fingerprint: a recipe of thumb and
    # browse alone hashes as it did before the ladder existed (version 1's recorded fingerprint).
    widths: tuple[int, ...] = ()
    formats: tuple[str, ...] = ("webp",)
    avif_quality: int | None = None
    avif_effort: int | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> Recipe:
        return cls(
            thumb_size=settings.thumb_size,
            browse_size=settings.browse_size,
            format="webp",
            quality=settings.webp_quality,
            effort=settings.webp_effort,
            colour=COLOUR_POLICY,
            pipeline=PIPELINE_VERSION,
            widths=tuple(sorted(settings.variant_widths)),
            formats=settings.variant_formats,
            **(
                {"avif_quality": settings.avif_quality, "avif_effort": settings.avif_effort}
                if "avif" in settings.variant_formats and settings.variant_widths
                else {}
            ),
        )

    def as_record(self) -> dict[str, object]:
        """The recipe as recorded and hashed (JSON): the ladder's part only where there is a ladder."""
        record: dict[str, object] = json.loads(json.dumps(asdict(self)))
        if not self.widths:
            for name in _LADDER_FIELDS:
                del record[name]
        elif self.avif_quality is None:
            del record["avif_quality"], record["avif_effort"]
        return record

    @property
    def fingerprint(self) -> str:
        canonical = json.dumps(self.as_record(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def mismatch(
    version: int, fingerprint: str, recorded: dict[str, object], recipe: Recipe
) -> RecipeMismatch | None:
    """The refusal to render `recipe` under `version`, recorded as `recorded` (of `fingerprint`);
    None if they agree."""
    if fingerprint == recipe.fingerprint:
        return None
    current = recipe.as_record()
    changed = {
        name: f"{recorded.get(name)!r} -> {current.get(name)!r}"
        for name in sorted(current.keys() | recorded.keys())
        if recorded.get(name) != current.get(name)
    }
    return RecipeMismatch(
        f"VARIANT_VERSION {version} was recorded with another recipe ({changed}): these settings "
        "would write other bytes under its immutable keys. Give the new recipe a new VARIANT_VERSION "
        "(and backfill), or restore the settings."
    )
