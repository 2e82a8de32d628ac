"""Settings read from the environment and validated at cold start (SPEC 11)."""

from __future__ import annotations

from uuid import UUID

import pytest
from pydantic import ValidationError

from photo_publish.keys import original_key
from photo_publish.settings import Settings

REQUIRED = {
    "DATABASE_URL": "postgresql+psycopg://photos:secret@localhost:5432/photos",
    "PHOTO_BUCKET": "photo-publish-test",
    "STAGE": "dev",
}
# SPEC 11: the variables the template and the local runner set, and their defaults.
SPEC_DEFAULTS = {
    "MAX_ATTEMPTS": 3,
    "MAX_RECEIVE_COUNT": 5,
    "RETRY_BASE_SECONDS": 30,
    "STALE_AFTER_SECONDS": 300,
    "SWEEP_AFTER_SECONDS": 600,
    "MAX_INPUT_PIXELS": 100_000_000,
    "MAX_ORIGINAL_BYTES": 104_857_600,
}


def test_only_the_required_variables_give_the_spec_defaults() -> None:
    # GIVEN an environment with only the database, the bucket and the stage
    # WHEN the settings are read
    settings = Settings.from_env(REQUIRED)

    # THEN every number of SPEC 11 has its default
    assert {name: getattr(settings, name.lower()) for name in SPEC_DEFAULTS} == SPEC_DEFAULTS
    assert (settings.database_url, settings.photo_bucket, settings.stage) == tuple(REQUIRED.values())


@pytest.mark.parametrize("name", SPEC_DEFAULTS)
def test_an_environment_variable_overrides_its_default(name: str) -> None:
    # GIVEN the variable set to a value other than its default
    value = SPEC_DEFAULTS[name] + 7

    # WHEN the settings are read
    settings = Settings.from_env(REQUIRED | {name: str(value)})

    # THEN the setting takes it, as an integer
    assert getattr(settings, name.lower()) == value


@pytest.mark.parametrize("value", ["three", "-1", "1.5"])
@pytest.mark.parametrize("name", SPEC_DEFAULTS)
def test_an_invalid_number_fails_at_cold_start(name: str, value: str) -> None:
    # GIVEN a variable that is not a non-negative integer
    # WHEN the settings are read
    # THEN validation fails before any work starts
    with pytest.raises(ValidationError, match=name.lower()):
        Settings.from_env(REQUIRED | {name: value})


@pytest.mark.parametrize(
    "environ",
    [
        pytest.param({"PHOTO_BUCKET": "photo-publish-test", "STAGE": "dev"}, id="no-database"),
        pytest.param(REQUIRED | {"DATABASE_URL": ""}, id="empty-database-url"),
        pytest.param(
            REQUIRED | {"DATABASE_URL": "", "DB_SECRET_ARN": "arn:secret"}, id="secret-without-host"
        ),
        pytest.param(REQUIRED | {"DATABASE_URL": "", "DB_HOST": "proxy.local"}, id="host-without-secret"),
        pytest.param(REQUIRED | {"PHOTO_BUCKET": ""}, id="no-bucket"),
        pytest.param(REQUIRED | {"STAGE": ""}, id="no-stage"),
        pytest.param(REQUIRED | {"STAGE": "dev/originals"}, id="stage-with-a-slash"),
    ],
)
def test_missing_or_invalid_required_configuration_fails(environ: dict[str, str]) -> None:
    # GIVEN an environment without a usable database, bucket or stage
    # WHEN the settings are read
    # THEN validation fails at cold start
    with pytest.raises(ValidationError):
        Settings.from_env(environ)


def test_a_database_secret_and_host_stand_in_for_database_url() -> None:
    # GIVEN the AWS configuration: a Secrets Manager secret and a proxy host instead of a URL
    arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:photos-db-AbCdEf"
    environ = REQUIRED | {"DATABASE_URL": "", "DB_SECRET_ARN": arn, "DB_HOST": "proxy.rds.amazonaws.com"}

    # WHEN the settings are read
    settings = Settings.from_env(environ)

    # THEN they are accepted, with no URL
    assert (settings.database_url, settings.db_secret_arn, settings.db_host) == (
        None,
        arn,
        "proxy.rds.amazonaws.com",
    )


def test_the_settings_are_frozen() -> None:
    # GIVEN settings read at cold start
    settings = Settings.from_env(REQUIRED)

    # WHEN code tries to change one
    with pytest.raises(ValidationError, match="frozen"):
        settings.max_attempts = 10

    # THEN it keeps its value
    assert settings.max_attempts == 3


@pytest.mark.parametrize(("attempt", "seconds"), [(1, 30), (2, 60), (3, 120), (4, 240)])
def test_backoff_follows_bullmq_exponential_formula(attempt: int, seconds: int) -> None:
    # GIVEN the default base of 30 seconds
    settings = Settings.from_env(REQUIRED)

    # WHEN / THEN the backoff after an attempt is base * 2^(attempt - 1)
    assert settings.backoff_seconds(attempt) == seconds


def test_the_originals_prefix_is_the_stage_originals_folder() -> None:
    # GIVEN settings for a stage
    settings = Settings.from_env(REQUIRED | {"STAGE": "prod"})

    # WHEN / THEN the prefix the notification filters on holds every original key of that stage
    assert settings.originals_prefix == "prod/originals/"
    assert original_key("prod", UUID(int=1), UUID(int=2), "x.jpg").startswith(settings.originals_prefix)
