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
        )

    @property
    def fingerprint(self) -> str:
        canonical = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def mismatch(
    version: int, fingerprint: str, recorded: dict[str, object], recipe: Recipe
) -> RecipeMismatch | None:
    """The refusal to render `recipe` under `version`, recorded as `recorded` (of `fingerprint`);
    None if they agree."""
    if fingerprint == recipe.fingerprint:
        return None
    changed = {
        name: f"{recorded.get(name)!r} -> {value!r}"
        for name, value in asdict(recipe).items()
        if recorded.get(name) != value
    }
    return RecipeMismatch(
        f"VARIANT_VERSION {version} was recorded with another recipe ({changed}): these settings "
        "would write other bytes under its immutable keys. Give the new recipe a new VARIANT_VERSION "
        "(and backfill), or restore the settings."
    )
