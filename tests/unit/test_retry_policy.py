"""The retry policy (SPEC 5, shared/photo_publish/retry.py): the backoff, the permanent codes, the
rule for a delivery that fails before its claim, the hand-on to a fresh message, and the numbers it
refuses at a cold start."""

from __future__ import annotations

import pytest

from photo_publish import bootstrap
from photo_publish.errors import ErrorCode
from photo_publish.retry import PERMANENT, ContradictoryRetry, RetryPolicy
from photo_publish.settings import InvalidSettings, Settings

REQUIRED = {
    "DATABASE_URL": "postgresql+psycopg://photos:secret@localhost:5432/photos",
    "PHOTO_BUCKET": "photo-publish-test",
    "STAGE": "dev",
}
# SPEC 5: the user's bad input is permanent, everything else may succeed next time.
USERS_BAD_INPUT = {
    ErrorCode.ORIGINAL_NOT_FOUND,
    ErrorCode.ORIGINAL_TOO_LARGE,
    ErrorCode.UNSUPPORTED_FORMAT,
    ErrorCode.DECODE_FAILED,
    ErrorCode.DIMENSIONS_EXCEEDED,
    ErrorCode.ENCODE_FAILED,
    # Past the render's own deadline: the file's fault, no attempt renders it faster.
    ErrorCode.RENDER_TIME_EXCEEDED,
}


def policy(**variables: str) -> RetryPolicy:
    """The policy the settings make of the environment's numbers."""
    return Settings.from_env(REQUIRED | variables).retry


@pytest.mark.parametrize(("attempt", "seconds"), [(1, 30), (2, 60), (3, 120), (4, 240)])
def test_backoff_follows_bullmq_exponential_formula(attempt: int, seconds: int) -> None:
    # GIVEN the default base of 30 seconds
    retry = policy()

    # WHEN / THEN the backoff after an attempt is base * 2^(attempt - 1)
    assert retry.backoff(attempt) == seconds


def test_the_backoff_grows_from_retry_base_seconds() -> None:
    # GIVEN a base of 1 second (the tests' and the soak's), and one of 0
    # WHEN / THEN each attempt waits twice the one before; a base of 0 retries at once
    assert [policy(RETRY_BASE_SECONDS="1").backoff(n) for n in (1, 2, 3)] == [1, 2, 4]
    assert [policy(RETRY_BASE_SECONDS="0").backoff(n) for n in (1, 2, 3)] == [0, 0, 0]


def test_the_permanent_codes_are_exactly_the_users_bad_input() -> None:
    # GIVEN the policy
    retry = policy()

    # WHEN every code of the closed set is judged
    # THEN exactly the bad-input codes are permanent, whatever the attempt
    assert {code for code in ErrorCode if retry.permanent(code)} == USERS_BAD_INPUT == PERMANENT


def test_a_transient_failure_of_the_last_attempt_is_final() -> None:
    # GIVEN three attempts a job
    retry = policy(MAX_ATTEMPTS="3")

    # WHEN / THEN the first two are retried after their backoff, the third is the last
    assert [retry.last(attempt) for attempt in (1, 2, 3)] == [False, False, True]


def test_an_upload_whose_photo_row_never_appears_is_given_up_at_the_max_attempts_th_receive() -> None:
    # GIVEN three attempts a job
    retry = policy(MAX_ATTEMPTS="3")

    # WHEN a delivery fails before its claim because the photo row does not exist (yet)
    # THEN it comes back until its third receive, and is dead-lettered then
    gives_up = [retry.gives_up_before_claim(ErrorCode.PHOTO_NOT_FOUND, n) for n in (1, 2, 3, 4)]
    assert gives_up == [False, False, True, True]
    assert retry.before_claim_backoff(ErrorCode.PHOTO_NOT_FOUND, 2) == retry.backoff(2)
    # AND a failure that is no fault of the photo (the database unreachable) is never given up
    assert not any(retry.gives_up_before_claim(ErrorCode.DATABASE_UNAVAILABLE, n) for n in (1, 3, 5))


def test_a_delivery_the_invocation_had_no_time_for_comes_back_at_once() -> None:
    # GIVEN a record that failed before its claim because the invocation's time ran out
    retry = policy()

    # WHEN / THEN it waits no backoff: the next invocation may take it at once
    assert retry.before_claim_backoff(ErrorCode.TIME_BUDGET_EXCEEDED, 3) == 0
    assert retry.before_claim_backoff(ErrorCode.DATABASE_UNAVAILABLE, 3) == 120


def test_a_record_that_must_come_back_is_handed_on_two_receives_before_the_redrives_limit() -> None:
    # GIVEN the template's redrive (five receives)
    retry = policy(MAX_RECEIVE_COUNT="5")

    # WHEN / THEN from the third receive on, it is handed on to a fresh message
    assert retry.first_hand_on == 3
    assert [retry.hands_on(n) for n in (1, 2, 3, 4, 5)] == [False, False, True, True, True]


@pytest.mark.parametrize(
    "environ",
    [
        {"MAX_ATTEMPTS": "4"},
        {"MAX_ATTEMPTS": "6"},
        {"MAX_RECEIVE_COUNT": "4"},
        {"MAX_ATTEMPTS": "3", "MAX_RECEIVE_COUNT": "3"},
        {"MAX_ATTEMPTS": "5", "MAX_RECEIVE_COUNT": "5"},
    ],
)
def test_attempts_that_the_hand_on_would_cut_short_are_refused_at_cold_start(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN more attempts than the receives before the first hand-on: a message would be handed on
    # (its receive count starting again) before the receive that gives up an upload whose photo row
    # never appears, which would then go round for ever
    for name in ("MAX_ATTEMPTS", "MAX_RECEIVE_COUNT", "RETRY_BASE_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (REQUIRED | environ).items():
        monkeypatch.setenv(name, value)
    bootstrap.reset()

    # WHEN a function reads its settings at a cold start
    # THEN they are refused, naming both variables and the receives the hand-on keeps
    with pytest.raises(
        InvalidSettings, match=r"MAX_ATTEMPTS \(\d+\) must not exceed MAX_RECEIVE_COUNT"
    ) as raised:
        bootstrap.settings()
    assert "less the 2 receives kept for handing a message on" in str(raised.value)
    # AND so are settings built directly
    with pytest.raises(InvalidSettings, match="must not exceed MAX_RECEIVE_COUNT"):
        Settings(database_url="postgresql://x", photo_bucket="bucket", stage="dev", max_attempts=4)


def test_the_refusal_comes_with_the_other_settings_problems() -> None:
    # GIVEN contradictory retry numbers and a quality out of its bounds
    # WHEN the settings are read
    # THEN both are named at once: the operator fixes the environment in one deployment
    with pytest.raises(InvalidSettings) as raised:
        Settings.from_env(REQUIRED | {"MAX_ATTEMPTS": "4", "WEBP_QUALITY": "101"})
    assert "WEBP_QUALITY must be between 1 and 100" in str(raised.value)
    assert "MAX_ATTEMPTS (4) must not exceed MAX_RECEIVE_COUNT (5)" in str(raised.value)


@pytest.mark.parametrize(("attempts", "receives"), [("3", "5"), ("1", "3"), ("5", "7")])
def test_as_many_attempts_as_receives_before_the_first_hand_on_are_accepted(
    attempts: str, receives: str
) -> None:
    # GIVEN attempts whose last receive is the first from which a message is handed on (the
    # template's 3 and 5 among them): the last attempt's receive gives up before it hands on
    retry = policy(MAX_ATTEMPTS=attempts, MAX_RECEIVE_COUNT=receives)
    assert (retry.max_attempts, retry.max_receive_count) == (int(attempts), int(receives))
    assert retry.max_attempts == retry.first_hand_on


def test_a_slack_that_leaves_no_receive_for_the_last_attempt_is_refused() -> None:
    # GIVEN the template's numbers, and a slack that would hand a message on from its first receive
    # WHEN / THEN the policy refuses it, naming the numbers
    with pytest.raises(
        ContradictoryRetry, match=r"MAX_ATTEMPTS \(3\) must not exceed MAX_RECEIVE_COUNT \(5\) less the 4"
    ):
        RetryPolicy(max_attempts=3, max_receive_count=5, retry_base_seconds=30, hand_on_slack=4)
