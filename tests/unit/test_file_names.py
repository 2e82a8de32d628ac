"""A registered file name is the last part of an original key (SPEC 17): cleaned, bounded."""

from __future__ import annotations

import pytest

from photo_publish.keys import MAX_FILE_NAME_BYTES, clean_file_name


@pytest.mark.parametrize(
    ("given", "cleaned"),
    [
        ("IMG_0001.HEIC", "IMG_0001.HEIC"),
        ("holiday/../../etc/passwd", "holiday....etcpasswd"),
        ("a\\b.jpg", "ab.jpg"),
        ("tab\there\nnew\x00line\x7f.png", "tabherenewline.png"),
        ("  .hidden. ", "hidden"),
        ("Été à Paris + 100%.jpg", "Été à Paris + 100%.jpg"),
        ("/\x01/", ""),
    ],
)
def test_a_file_name_loses_separators_and_control_characters(given: str, cleaned: str) -> None:
    assert clean_file_name(given) == cleaned


def test_a_long_name_is_cut_on_a_character_boundary_before_its_extension() -> None:
    name = "写真" * 100 + ".jpeg"  # 600 bytes of UTF-8 before the extension
    cleaned = clean_file_name(name)
    assert len(cleaned.encode()) <= MAX_FILE_NAME_BYTES
    assert cleaned.endswith(".jpeg") and cleaned.startswith("写真写真")
    cleaned.encode().decode()  # whole characters only
