"""The responsive ladder and AVIF (SPEC 18): its arithmetic, its kinds and keys, its recipe, and the
variants real libvips renders for it from real photographs."""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import replace

import pytest
import pyvips

from devkit import samples
from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.image import ladder
from photo_publish.image.pipeline import Rendered, RenderedVariant, RenderOptions, render
from photo_publish.image.recipes import Recipe, mismatch
from photo_publish.keys import FIXED_KINDS, is_ladder_kind, ladder_kind, variant_key
from photo_publish.settings import Settings
from tests.readers import metadata_in

BOTH = replace(RenderOptions(), variant_formats=("webp", "avif"))


def rendered_from(data: bytes, options: RenderOptions = BOTH) -> Rendered:
    return render(io.BytesIO(data), options)


def ladder_of(rendered: Rendered) -> list[RenderedVariant]:
    return [v for v in rendered.variants if v.kind not in FIXED_KINDS]


# --- the arithmetic -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("widths", "long_edge", "expected"),
    [
        pytest.param((320, 640, 960, 1280), 2048, (320, 640, 960, 1280), id="all-below"),
        pytest.param((1280, 320, 960, 640), 2048, (320, 640, 960, 1280), id="smallest-first"),
        pytest.param((320, 640, 960, 1280, 1920), 1500, (320, 640, 960, 1280, 1500), id="collapse-one"),
        pytest.param((320, 640, 960, 1280), 700, (320, 640, 700), id="collapse-several-into-one"),
        pytest.param((320, 640), 640, (320, 640), id="equal-is-the-source"),
        pytest.param((320, 640), 200, (200,), id="smaller-than-every-step"),
        pytest.param((), 2048, (), id="no-ladder"),
    ],
)
def test_the_steps_are_the_widths_below_the_source_and_one_at_its_size(
    widths: tuple[int, ...], long_edge: int, expected: tuple[int, ...]
) -> None:
    # GIVEN the configured widths and the long edge of the picture in memory
    # WHEN the ladder is worked out
    steps = ladder.steps(widths, long_edge)

    # THEN it is smallest first, never above the source, the larger widths one step at its size
    assert steps == expected
    assert all(step <= long_edge for step in steps)
    assert list(steps) == sorted(set(steps))


def test_a_step_kind_names_its_long_edge_and_format_and_is_unique_per_format() -> None:
    # GIVEN / WHEN the kinds of one step in both formats
    kinds = [ladder_kind(640, "webp"), ladder_kind(640, "avif")]

    # THEN each is readable in the key, distinct, and neither is thumb's or browse's
    assert kinds == ["w640-webp", "w640-avif"]
    assert all(is_ladder_kind(kind) for kind in kinds)
    assert not any(is_ladder_kind(kind) for kind in FIXED_KINDS)
    album, photo = samples_ids()
    assert variant_key("dev", album, photo, version=2, kind=kinds[1], ext="avif") == (
        f"dev/albums/{album}/variants/{photo}/2/w640-avif.avif"
    )
    with pytest.raises(ValueError, match="not a ladder step"):
        ladder_kind(640, "jpeg")


def samples_ids() -> tuple[object, object]:
    from uuid import UUID

    return UUID("7d3c6a52-1f0e-4b59-9a57-2a1f1c0f4e11"), UUID("0b9f2d4e-8c61-4f6a-b2a3-6d5e4c3b2a10")


# --- the recipe -----------------------------------------------------------------------------------

REQUIRED = {"DATABASE_URL": "postgresql://localhost/photos", "PHOTO_BUCKET": "photos", "STAGE": "dev"}


def recipe(**environ: str) -> Recipe:
    return Recipe.from_settings(Settings.from_env(REQUIRED | environ))


def test_a_recipe_without_a_ladder_hashes_as_the_recipe_before_the_ladder() -> None:
    # GIVEN the recipe version 1 recorded before the ladder existed: its seven fields, hashed
    before = {
        "thumb_size": 400,
        "browse_size": 2048,
        "format": "webp",
        "quality": 80,
        "effort": 2,
        "colour": "srgb-from-embedded-profile",
        "pipeline": 1,
    }
    recorded = hashlib.sha256(json.dumps(before, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    # WHEN today's settings render no ladder
    # THEN their fingerprint is version 1's: such a deployment keeps rendering version 1
    assert recipe(VARIANT_WIDTHS="none").fingerprint == recorded
    # ... and the default ladder is another recipe
    assert recipe().fingerprint != recorded


@pytest.mark.parametrize(
    "changed",
    [
        {"VARIANT_WIDTHS": "320,640"},
        {"VARIANT_WIDTHS": "320,640,960,1280,1920"},
        {"VARIANT_FORMATS": "webp,avif"},
    ],
    ids=["fewer-steps", "more-steps", "avif"],
)
def test_changing_the_ladder_or_its_formats_is_a_recipe_change(changed: dict[str, str]) -> None:
    # GIVEN the default recipe recorded for a version
    default = recipe()

    # WHEN the ladder or its formats change
    other = recipe(**changed)

    # THEN the fingerprint differs, and the refusal names what changed
    assert other.fingerprint != default.fingerprint
    refusal = mismatch(2, default.fingerprint, default.as_record(), other)
    assert refusal is not None
    assert any(name in str(refusal) for name in ("widths", "formats"))


def test_avif_settings_are_part_of_the_recipe_only_where_avif_is_rendered() -> None:
    # GIVEN AVIF's settings changed
    # THEN they change nothing while the ladder is WebP alone
    assert recipe(AVIF_QUALITY="70").fingerprint == recipe().fingerprint
    # ... and change the recipe where the ladder is also AVIF
    with_avif = {"VARIANT_FORMATS": "webp,avif"}
    assert recipe(**with_avif, AVIF_QUALITY="70").fingerprint != recipe(**with_avif).fingerprint
    assert recipe(**with_avif, AVIF_EFFORT="3").fingerprint != recipe(**with_avif).fingerprint


def test_the_order_the_widths_are_listed_in_is_not_a_recipe_change() -> None:
    assert recipe(VARIANT_WIDTHS="2048,640,1280").fingerprint == recipe().fingerprint


# --- the render -----------------------------------------------------------------------------------


def test_every_step_in_both_formats_is_resized_from_the_browse_in_order() -> None:
    # GIVEN a 2560 x 1600 photograph (browse 2048 x 1280)
    data = (samples.IMAGES / "LadyBird.jpg").read_bytes()

    # WHEN it is rendered with the default ladder in both formats
    rendered = rendered_from(data)

    # THEN thumb and browse come first, as before, then each step smallest first, WebP then AVIF
    kinds = [v.kind for v in rendered.variants]
    assert kinds[:2] == ["thumb", "browse"]
    widths = BOTH.variant_widths
    assert kinds[2:] == [ladder_kind(w, f) for w in sorted(widths) for f in ("webp", "avif")]
    # ... each the step's long edge, the picture's shape kept, in its format
    for v in ladder_of(rendered):
        edge = int(v.kind[1:].split("-")[0])
        assert max(v.width, v.height) == edge
        assert abs(v.width / v.height - 2560 / 1600) < 0.01
        decoded = pyvips.Image.new_from_buffer(v.data, "")
        assert (decoded.width, decoded.height) == (v.width, v.height)
        assert (
            decoded.get("vips-loader") == {"webp": "webpload_buffer", "avif": "heifload_buffer"}[v.extension]
        )
        assert v.content_type == f"image/{v.extension}"


def test_a_small_photo_is_never_upscaled_and_its_larger_steps_collapse_into_one() -> None:
    # GIVEN a photo whose long edge (700) is below most steps
    data = samples.photograph("Storm.jpg").thumbnail_image(700).jpegsave_buffer(Q=90)

    # WHEN it is rendered with widths 320 to 1920
    rendered = rendered_from(bytes(data), replace(BOTH, variant_widths=(320, 640, 960, 1280, 1920)))

    # THEN the steps above it are one step at its own size, in each format, nothing larger
    steps = ladder_of(rendered)
    assert [v.kind for v in steps] == [
        "w320-webp",
        "w320-avif",
        "w640-webp",
        "w640-avif",
        "w700-webp",
        "w700-avif",
    ]
    assert max(max(v.width, v.height) for v in steps) == 700
    # ... whose WebP is the browse itself (the same pixels and settings: not encoded or stored twice)
    browse = next(v for v in rendered.variants if v.kind == "browse")
    assert (browse.width, browse.height) == (700, 467)
    top = next(v for v in steps if v.kind == "w700-webp")
    assert (top.data, top.same_as) == (browse.data, "browse")
    assert all(v.same_as is None for v in rendered.variants if v is not top)


def test_a_photo_with_alpha_keeps_it_at_every_step_in_both_formats() -> None:
    # GIVEN a PNG with an alpha channel
    data = samples.alpha_png(samples.photograph())

    # WHEN it is rendered
    rendered = rendered_from(data)

    # THEN every variant keeps the alpha, AVIF's included
    for v in ladder_of(rendered):
        decoded = pyvips.Image.new_from_buffer(v.data, "")
        assert decoded.hasalpha(), v.kind
        # ... and what was transparent stays transparent (the alpha is the picture's, not opaque)
        assert decoded.extract_band(decoded.bands - 1).min() < 128, v.kind


@pytest.mark.parametrize(
    "make",
    [
        pytest.param((samples.IMAGES / "Wood.jpg").read_bytes, id="camera-exif"),
        pytest.param(lambda: samples.profiled_jpeg(samples.photograph(), "p3"), id="display-p3-icc"),
        pytest.param(lambda: samples.alpha_png(samples.photograph()), id="png-alpha"),
    ],
)
def test_no_variant_of_any_kind_or_format_carries_metadata(make: object) -> None:
    # GIVEN a photo with EXIF (a camera's), or an ICC profile
    data = make()  # type: ignore[operator]

    # WHEN it is rendered, the ladder in both formats
    rendered = rendered_from(data)

    # THEN no variant, whatever its kind or format, holds EXIF, XMP, IPTC or an ICC profile
    assert len(rendered.variants) == 2 + 2 * len(BOTH.variant_widths)
    for v in rendered.variants:
        assert metadata_in(v.data) == [], v.kind


@pytest.mark.parametrize("save", ["webpsave_buffer", "heifsave_buffer"])
def test_the_metadata_check_sees_exif_and_icc_profiles_where_they_are_kept(save: str) -> None:
    # GIVEN a camera photograph with EXIF and a Display P3 one with its profile, encoded as libvips
    # does when told to keep everything
    camera = pyvips.Image.new_from_file(str(samples.IMAGES / "Wood.jpg"))
    profiled = pyvips.Image.new_from_buffer(samples.profiled_jpeg(samples.photograph(), "p3"), "")
    options = {"compression": "av1", "effort": 0} if save == "heifsave_buffer" else {}

    # WHEN each is checked for metadata
    # THEN the check finds it: the variants' empty findings above are not a blind check's
    assert "exif-data" in metadata_in(bytes(getattr(camera, save)(keep="all", **options)))
    assert "icc-profile-data" in metadata_in(bytes(getattr(profiled, save)(keep="all", **options)))


def test_the_ladder_off_renders_thumb_and_browse_alone() -> None:
    # GIVEN VARIANT_WIDTHS=none
    options = replace(RenderOptions(), variant_widths=())

    # WHEN a photo is rendered
    rendered = rendered_from((samples.IMAGES / "Garden.jpg").read_bytes(), options)

    # THEN it has the two variants it had before the ladder
    assert [v.kind for v in rendered.variants] == ["thumb", "browse"]


def test_the_render_deadline_stops_the_ladder_too() -> None:
    # GIVEN a render whose time budget runs out during the ladder's encodes (AVIF at its slowest)
    options = replace(BOTH, avif_effort=9)
    data = (samples.IMAGES / "LadyBird.jpg").read_bytes()

    # WHEN it is rendered with less time than the AVIF ladder takes
    with pytest.raises(PhotoError) as raised:
        render(io.BytesIO(data), options, time_budget=1.0)

    # THEN it stops with the budget's code, before every step is encoded
    assert raised.value.code is ErrorCode.TIME_BUDGET_EXCEEDED
