"""The order of two uploads of one key by their S3 sequencers (SPEC 5): the shorter right-padded with
zeros, then compared as text (AWS's event message structure page)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from photo_publish.keys import sequencer_order

# AWS's sample sequencer (its event notification examples).
SAMPLE = "0055AED6DCD90281E5"
hex_digits = st.text(alphabet="0123456789ABCDEF", min_size=1, max_size=24)


@pytest.mark.parametrize(
    ("later", "earlier"),
    [
        pytest.param("0055AED6DCD90281F", SAMPLE, id="shorter-and-later"),
        pytest.param(SAMPLE, "0055AED6DCD90281E", id="longer-and-later"),
        pytest.param("0055AED6DCD90281E501", SAMPLE, id="an-extension-is-later"),
        pytest.param("FF", "0100", id="not-a-number:-FF-is-FF00"),
        pytest.param("0B", "0A", id="same-length"),
    ],
)
def test_the_shorter_sequencer_is_right_padded_before_the_comparison(later: str, earlier: str) -> None:
    # GIVEN two sequencers of one key  WHEN they are ordered
    # THEN the later upload is the greater after right-padding, whatever their lengths
    assert sequencer_order(later, earlier) > 0
    assert sequencer_order(earlier, later) < 0


def test_a_sequencer_and_its_right_padded_form_are_the_same_upload() -> None:
    # GIVEN / WHEN / THEN trailing zeros are what the padding adds: no order between them
    assert sequencer_order(SAMPLE, SAMPLE) == 0
    assert sequencer_order("0A", "0A00") == 0


def test_the_case_of_the_hex_digits_does_not_order_uploads() -> None:
    # GIVEN the same sequencer in upper and lower case (AWS's EventBridge example spells its
    # sequencer in lower case, its notification example in upper case)
    # WHEN / THEN they are one upload, and a lower-case "a" is no later than an upper-case "F"
    assert sequencer_order("617f08299329d189", "617F08299329D189") == 0
    assert sequencer_order("0a", "0F") < 0


@given(hex_digits, hex_digits)
def test_the_order_is_the_text_order_of_the_right_padded_pair(a: str, b: str) -> None:
    # GIVEN any two sequencers  WHEN ordered  THEN as their right-padded text, antisymmetrically
    width = max(len(a), len(b))
    padded_a, padded_b = a.ljust(width, "0"), b.ljust(width, "0")
    expected = (padded_a > padded_b) - (padded_a < padded_b)
    assert sequencer_order(a, b) == expected == -sequencer_order(b, a)
