"""The S3 key layout of SPEC 2: originals in, variants out."""

from __future__ import annotations

from uuid import UUID

import pytest

from photo_publish.keys import MalformedKey, OriginalKey, original_key, parse_original_key, variant_key

STAGE = "dev"
ALBUM_ID = UUID("7d3c6a52-1f0e-4b59-9a57-2a1f1c0f4e11")
PHOTO_ID = UUID("0b9f2d4e-8c61-4f6a-b2a3-6d5e4c3b2a10")
ORIGINALS = f"{STAGE}/originals/albums"


def test_an_originals_key_gives_its_album_photo_and_file_name() -> None:
    # GIVEN an original uploaded under the stage's originals prefix
    key = f"{ORIGINALS}/{ALBUM_ID}/{PHOTO_ID}/My photo (2).jpg"

    # WHEN it is parsed
    parsed = parse_original_key(key, STAGE)

    # THEN the ids are UUIDs and the file name is kept as it is
    assert parsed == OriginalKey(key=key, album_id=ALBUM_ID, photo_id=PHOTO_ID, file_name="My photo (2).jpg")


def test_original_key_builds_the_key_that_parses_back() -> None:
    # GIVEN / WHEN the key of an original is built
    key = original_key(STAGE, ALBUM_ID, PHOTO_ID, "été.jpg")

    # THEN it follows the layout and parses back into the same parts
    assert key == f"{ORIGINALS}/{ALBUM_ID}/{PHOTO_ID}/été.jpg"
    assert parse_original_key(key, STAGE) == OriginalKey(key, ALBUM_ID, PHOTO_ID, "été.jpg")


@pytest.mark.parametrize(
    "key",
    [
        pytest.param(f"prod/originals/albums/{ALBUM_ID}/{PHOTO_ID}/x.jpg", id="another-stage"),
        pytest.param(f"development/originals/albums/{ALBUM_ID}/{PHOTO_ID}/x.jpg", id="stage-name-prefix"),
        pytest.param(f"dev/albums/{ALBUM_ID}/variants/{PHOTO_ID}/1/browse.webp", id="variants-prefix"),
        pytest.param(f"dev/originals-old/albums/{ALBUM_ID}/{PHOTO_ID}/x.jpg", id="look-alike-prefix"),
        pytest.param("dev/originals", id="prefix-without-slash"),
    ],
)
def test_a_key_outside_the_stage_originals_prefix_is_not_ours(key: str) -> None:
    # GIVEN a key that is not under {stage}/originals/
    # WHEN it is parsed
    # THEN it is ignored, not rejected
    assert parse_original_key(key, STAGE) is None


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("dev/originals/", id="prefix-only"),
        pytest.param("dev/originals/x.jpg", id="file-at-the-root"),
        pytest.param(f"{ORIGINALS}/{ALBUM_ID}/x.jpg", id="missing-photo-folder"),
        pytest.param(f"dev/originals/photos/{ALBUM_ID}/{PHOTO_ID}/x.jpg", id="not-albums"),
        pytest.param(f"{ORIGINALS}/{ALBUM_ID}/{PHOTO_ID}/extra/x.jpg", id="extra-folder"),
        pytest.param(f"{ORIGINALS}/not-a-uuid/{PHOTO_ID}/x.jpg", id="album-not-a-uuid"),
        pytest.param(f"{ORIGINALS}/{ALBUM_ID}/not-a-uuid/x.jpg", id="photo-not-a-uuid"),
        pytest.param(f"{ORIGINALS}/{{{ALBUM_ID}}}/{PHOTO_ID}/x.jpg", id="album-in-braces"),
        pytest.param(f"{ORIGINALS}/{ALBUM_ID}/{PHOTO_ID.hex}/x.jpg", id="photo-without-dashes"),
        pytest.param(f"{ORIGINALS}/{ALBUM_ID}/{PHOTO_ID}/", id="empty-file-name"),
    ],
)
def test_a_key_under_the_originals_prefix_off_the_layout_is_malformed(key: str) -> None:
    # GIVEN a key under the originals prefix that breaks albums/{albumId}/{photoId}/{fileName}
    # WHEN it is parsed
    # THEN it is rejected before any I/O
    with pytest.raises(MalformedKey):
        parse_original_key(key, STAGE)


@pytest.mark.parametrize(
    ("kind", "version", "ext"),
    [("thumb", 1, "webp"), ("browse", 1, "webp"), ("browse", 2, "avif")],
)
def test_variant_key_follows_the_versioned_layout_outside_the_originals_prefix(
    kind: str, version: int, ext: str
) -> None:
    # GIVEN / WHEN the key of a variant is built
    key = variant_key(STAGE, ALBUM_ID, PHOTO_ID, version=version, kind=kind, ext=ext)  # type: ignore[arg-type]

    # THEN it follows {stage}/albums/{albumId}/variants/{photoId}/{version}/{kind}.{ext},
    # outside the originals prefix: writing a variant never triggers processing
    assert key == f"dev/albums/{ALBUM_ID}/variants/{PHOTO_ID}/{version}/{kind}.{ext}"
    assert parse_original_key(key, STAGE) is None
