"""Settings read from the environment and validated at cold start (SPEC 11)."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, replace
from uuid import UUID

import pytest

from photo_publish.keys import original_key
from photo_publish.retry import HAND_ON_SLACK
from photo_publish.settings import InvalidSettings, Settings

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
    "MAX_INPUT_DIMENSION": 32_768,
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
    # GIVEN the variable set to a value other than its default (the redrive's receive count raised
    # with the attempts: it may not leave fewer receives than attempts before the hand-on)
    value = SPEC_DEFAULTS[name] + 7
    environ = REQUIRED | {name: str(value)}
    if name == "MAX_ATTEMPTS":
        environ["MAX_RECEIVE_COUNT"] = str(value + HAND_ON_SLACK)

    # WHEN the settings are read
    settings = Settings.from_env(environ)

    # THEN the setting takes it, as an integer
    assert getattr(settings, name.lower()) == value


@pytest.mark.parametrize("value", ["three", "-1", "1.5"])
@pytest.mark.parametrize("name", SPEC_DEFAULTS)
def test_an_invalid_number_fails_at_cold_start(name: str, value: str) -> None:
    # GIVEN a variable that is not a non-negative integer
    # WHEN the settings are read
    # THEN validation fails before any work starts, naming the variable
    with pytest.raises(InvalidSettings, match=f"^{name} must be"):
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
    with pytest.raises(InvalidSettings):
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
    with pytest.raises(FrozenInstanceError):
        settings.max_attempts = 10

    # THEN it keeps its value
    assert settings.max_attempts == 3


def test_the_originals_prefix_is_the_stage_originals_folder() -> None:
    # GIVEN settings for a stage
    settings = Settings.from_env(REQUIRED | {"STAGE": "prod"})

    # WHEN / THEN the prefix the notification filters on holds every original key of that stage
    assert settings.originals_prefix == "prod/originals/"
    assert original_key("prod", UUID(int=1), UUID(int=2), "x.jpg").startswith(settings.originals_prefix)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"WEBP_QUALITY": "0"}, "WEBP_QUALITY must be between 1 and 100, got 0"),
        ({"RECORD_BUDGET_SECONDS": "-1"}, "RECORD_BUDGET_SECONDS must be at least 0, got -1.0"),
        ({"MAX_ATTEMPTS": "three"}, "MAX_ATTEMPTS must be an integer, got 'three'"),
        ({"PHOTO_BUCKET": "ab"}, "PHOTO_BUCKET must be at least 3 characters, got 'ab'"),
        ({"PHOTO_BUCKET": ""}, "PHOTO_BUCKET is required"),
        ({"STAGE": "dev/originals"}, "STAGE must match ^[A-Za-z0-9_-]+$, got 'dev/originals'"),
        ({"DATABASE_URL": ""}, "set DATABASE_URL, or DB_SECRET_ARN and DB_HOST"),
        (
            {"DB_PREPARE_STATEMENTS": "maybe"},
            "DB_PREPARE_STATEMENTS must be true or false (or 1/0, yes/no, on/off), got 'maybe'",
        ),
    ],
)
def test_the_error_names_the_variable_and_the_rule_it_breaks(environ: dict[str, str], message: str) -> None:
    # GIVEN one variable the functions cannot run with
    # WHEN the settings are read at cold start
    with pytest.raises(InvalidSettings) as raised:
        Settings.from_env(REQUIRED | environ)

    # THEN the operator reads which variable is wrong, why, and the value it had
    assert str(raised.value) == message


def test_the_cdn_is_off_until_a_distribution_is_named() -> None:
    # GIVEN no CDN_DISTRIBUTION_ID: no CDN, nothing to invalidate
    assert Settings.from_env(REQUIRED).cdn_distribution_id == ""
    # WHEN the template names its distribution, THEN the deletions' paths go to it
    assert Settings.from_env(REQUIRED | {"CDN_DISTRIBUTION_ID": "E2QWRUHAPOMQZL"}).cdn_distribution_id == (
        "E2QWRUHAPOMQZL"
    )


@pytest.mark.parametrize(
    "value",
    [
        "arn:aws:cloudfront::123456789012:distribution/E2QWRUHAPOMQZL",
        "d111111abcdef8.cloudfront.net",
        "E2QWRUHAPOMQZL E3",
    ],
)
def test_a_distributions_arn_or_domain_is_no_distribution_id(value: str) -> None:
    # GIVEN what an operator may paste instead of the id (CreateInvalidation takes the id alone)
    # WHEN / THEN the functions refuse it at cold start, not at the first deletion
    with pytest.raises(InvalidSettings, match="CDN_DISTRIBUTION_ID must be a distribution's id"):
        Settings.from_env(REQUIRED | {"CDN_DISTRIBUTION_ID": value})


def test_every_wrong_variable_is_reported_at_once() -> None:
    # GIVEN an environment wrong in three ways
    environ = {"STAGE": "dev", "MAX_ATTEMPTS": "x", "WEBP_EFFORT": "7"}

    # WHEN the settings are read
    with pytest.raises(InvalidSettings) as raised:
        Settings.from_env(environ)

    # THEN one error names all of them: one deployment fixes the environment
    assert str(raised.value).split("; ") == [
        "PHOTO_BUCKET is required",
        "MAX_ATTEMPTS must be an integer, got 'x'",
        "WEBP_EFFORT must be between 0 and 6, got 7",
        "set DATABASE_URL, or DB_SECRET_ARN and DB_HOST",
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        *[(text, True) for text in ("true", "TRUE", "True", "1", "yes", "YES", "on", " true")],
        *[(text, False) for text in ("false", "FALSE", "False", "0", "no", "No", "off", "false\n")],
    ],
)
def test_a_boolean_variable_takes_the_usual_spellings_in_any_case(value: str, expected: bool) -> None:
    # GIVEN DB_PREPARE_STATEMENTS spelled one of the usual ways
    # WHEN the settings are read
    settings = Settings.from_env(REQUIRED | {"DB_PREPARE_STATEMENTS": value})

    # THEN it is that boolean
    assert settings.db_prepare_statements is expected


@pytest.mark.parametrize("value", ["maybe", "2", "1.0", "t", "n", "truthy", "nope"])
def test_a_boolean_variable_refuses_anything_else(value: str) -> None:
    # GIVEN DB_PREPARE_STATEMENTS set to something that is not one of those words
    # WHEN / THEN the settings are refused rather than guessed
    with pytest.raises(InvalidSettings, match=r"^DB_PREPARE_STATEMENTS must be true or false"):
        Settings.from_env(REQUIRED | {"DB_PREPARE_STATEMENTS": value})


@pytest.mark.parametrize(("value", "expected"), [(" 7 ", 7), ("+7", 7), ("07", 7), ("1_000", 1000)])
def test_an_integer_variable_reads_as_python_reads_integers(value: str, expected: int) -> None:
    # GIVEN MAX_RECEIVE_COUNT with spaces around, a sign, a leading zero or digit separators
    # WHEN the settings are read
    # THEN it is that integer
    assert Settings.from_env(REQUIRED | {"MAX_RECEIVE_COUNT": value}).max_receive_count == expected


@pytest.mark.parametrize("value", ["7.5", "7.0", "1e3", "0x7", "seven", "7 0"])
def test_an_integer_variable_refuses_anything_else(value: str) -> None:
    # GIVEN MAX_ATTEMPTS that is no integer (a fraction, an exponent, hex, a word, two numbers)
    # WHEN / THEN the settings are refused
    with pytest.raises(InvalidSettings, match=r"^MAX_ATTEMPTS must be an integer"):
        Settings.from_env(REQUIRED | {"MAX_ATTEMPTS": value})


@pytest.mark.parametrize(("value", "expected"), [("2.5", 2.5), (" 3 ", 3.0), (".5", 0.5), ("1e1", 10.0)])
def test_a_number_variable_is_read_as_a_float(value: str, expected: float) -> None:
    # GIVEN RECORD_BUDGET_SECONDS as a decimal, an integer or in scientific notation
    settings = Settings.from_env(REQUIRED | {"RECORD_BUDGET_SECONDS": value})

    # WHEN / THEN it is that number, as a float
    assert settings.record_budget_seconds == expected
    assert isinstance(settings.record_budget_seconds, float)


@pytest.mark.parametrize(
    ("value", "rule"),
    [("nan", "at least 0"), ("-inf", "at least 0"), ("-1", "at least 0"), ("ten", "a number")],
)
def test_a_number_variable_refuses_what_is_no_number_of_seconds(value: str, rule: str) -> None:
    # GIVEN RECORD_BUDGET_SECONDS that is no number, or no number of seconds
    # WHEN / THEN the settings are refused
    with pytest.raises(InvalidSettings, match=f"^RECORD_BUDGET_SECONDS must be {rule}"):
        Settings.from_env(REQUIRED | {"RECORD_BUDGET_SECONDS": value})


def test_unknown_and_lower_case_variables_are_ignored() -> None:
    # GIVEN the Lambda's own variables and a lower-case spelling of a setting
    environ = REQUIRED | {"AWS_REGION": "eu-west-1", "PATH": "/usr/bin", "max_attempts": "9"}

    # WHEN the settings are read
    settings = Settings.from_env(environ)

    # THEN only the settings' upper-case names count
    assert settings == Settings.from_env(REQUIRED)
    assert settings.max_attempts == 3


def test_settings_built_directly_follow_the_same_rules() -> None:
    # GIVEN settings built in code (tests, devkit), not read from an environment
    good = Settings(
        database_url="postgresql://x", photo_bucket="bucket", stage="dev", record_budget_seconds=0
    )

    # WHEN / THEN an int is taken for a float setting, and held as a float
    assert good.record_budget_seconds == 0.0
    assert isinstance(good.record_budget_seconds, float)
    # AND every rule of from_env holds: bounds, lengths, the database, and the types
    with pytest.raises(InvalidSettings, match=r"^PHOTO_BUCKET must be at least 3 characters"):
        Settings(database_url="postgresql://x", photo_bucket="b", stage="dev")
    with pytest.raises(InvalidSettings, match=r"^set DATABASE_URL"):
        Settings(photo_bucket="bucket", stage="dev")
    with pytest.raises(InvalidSettings, match=r"^MAX_ATTEMPTS must be an integer, got True"):
        Settings(database_url="postgresql://x", photo_bucket="bucket", stage="dev", max_attempts=True)
    with pytest.raises(InvalidSettings, match=r"^MAX_ATTEMPTS must be an integer, got '3'"):
        Settings(database_url="postgresql://x", photo_bucket="bucket", stage="dev", max_attempts="3")  # type: ignore[arg-type]


def test_a_changed_copy_is_validated_too() -> None:
    # GIVEN valid settings
    settings = Settings.from_env(REQUIRED)

    # WHEN a copy changes a setting (as tests do), within and then outside its bounds
    copy = replace(settings, webp_quality=90)

    # THEN the valid copy has it and the original is untouched; the invalid one is refused
    assert (copy.webp_quality, settings.webp_quality) == (90, 80)
    with pytest.raises(InvalidSettings, match=r"^WEBP_QUALITY must be between 1 and 100, got 101"):
        replace(settings, webp_quality=101)


@pytest.mark.parametrize("mode", ["verify-ca", "verify-full"])
def test_verifying_the_database_server_needs_its_ca_bundle(mode: str) -> None:
    with pytest.raises(InvalidSettings, match="need DB_SSLROOTCERT"):
        Settings.from_env(REQUIRED | {"DB_SSLMODE": mode})
    settings = Settings.from_env(
        REQUIRED | {"DB_SSLMODE": mode, "DB_SSLROOTCERT": "/opt/rds/global-bundle.pem"}
    )
    assert (settings.db_sslmode, settings.db_sslrootcert) == (mode, "/opt/rds/global-bundle.pem")


def test_a_tls_mode_that_does_not_encrypt_is_refused() -> None:
    with pytest.raises(InvalidSettings, match="DB_SSLMODE must match"):
        Settings.from_env(REQUIRED | {"DB_SSLMODE": "prefer"})


def test_the_render_gets_every_limit_the_settings_give() -> None:
    # GIVEN settings whose every render limit differs from the pipeline's own default (the function's
    # memory: what a decoder may hold)
    from dataclasses import fields

    from photo_publish.image.pipeline import RenderOptions
    from photo_publish.publish.service import render_options

    defaults = RenderOptions()
    environ = REQUIRED | {
        "THUMB_SIZE": "320",
        "BROWSE_SIZE": "1600",
        "WEBP_QUALITY": "75",
        "WEBP_EFFORT": "3",
        "VARIANT_WIDTHS": "480,960",
        "VARIANT_FORMATS": "webp,avif",
        "AVIF_QUALITY": "61",
        "AVIF_EFFORT": "3",
        "MAX_INPUT_PIXELS": "50000000",
        "MAX_INPUT_DIMENSION": "20000",
        "MAX_INPUT_ROW_BYTES": "100000",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "3008",
        "RENDER_TIMEOUT_SECONDS": "12",
    }

    # WHEN the service builds the pipeline's options from them
    options = render_options(Settings.from_env(environ))

    # THEN not one option is left at the pipeline's default
    assert [
        f.name for f in fields(RenderOptions) if getattr(options, f.name) == getattr(defaults, f.name)
    ] == []


def test_the_ladder_and_its_formats_are_read_from_comma_separated_lists() -> None:
    # GIVEN the ladder as an operator writes it, with blanks and capitals
    settings = Settings.from_env(
        REQUIRED | {"VARIANT_WIDTHS": "480, 960,1600", "VARIANT_FORMATS": "WebP, AVIF"}
    )

    # THEN the sizes are integers and the formats libvips' names, in the order given
    assert settings.variant_widths == (480, 960, 1600)
    assert settings.variant_formats == ("webp", "avif")
    # ... and "none" turns the ladder off
    assert Settings.from_env(REQUIRED | {"VARIANT_WIDTHS": "none"}).variant_widths == ()


@pytest.mark.parametrize(
    ("environ", "problem"),
    [
        ({"VARIANT_WIDTHS": "320,abc"}, "VARIANT_WIDTHS must be comma-separated integers"),
        ({"VARIANT_WIDTHS": "320,"}, "VARIANT_WIDTHS must be comma-separated integers"),
        ({"VARIANT_WIDTHS": "8,640"}, "VARIANT_WIDTHS must list long edges of at least 16 pixels"),
        ({"VARIANT_WIDTHS": "640,640"}, "VARIANT_WIDTHS must not list a size twice"),
        (
            {"VARIANT_WIDTHS": "640,4096"},
            r"VARIANT_WIDTHS \(\(640, 4096\)\) must not exceed BROWSE_SIZE \(2048\)",
        ),
        ({"VARIANT_WIDTHS": "1280", "BROWSE_SIZE": "1024"}, "must not exceed BROWSE_SIZE \\(1024\\)"),
        ({"VARIANT_FORMATS": "avif"}, "VARIANT_FORMATS must be webp or webp,avif"),
        ({"VARIANT_FORMATS": "webp,jpeg"}, "VARIANT_FORMATS must be webp or webp,avif"),
        ({"AVIF_EFFORT": "10"}, "AVIF_EFFORT must be between 0 and 9"),
        (
            {"VARIANT_WIDTHS": "none", "VARIANT_FORMATS": "webp,avif"},
            "VARIANT_FORMATS webp,avif needs a ladder",
        ),
    ],
)
def test_a_ladder_the_pipeline_cannot_render_is_refused_at_start(
    environ: dict[str, str], problem: str
) -> None:
    # GIVEN a ladder or a format the pipeline would not render as written
    # WHEN / THEN the settings refuse it at cold start, naming the variable
    with pytest.raises(InvalidSettings, match=problem):
        Settings.from_env(REQUIRED | environ)


@pytest.mark.parametrize(
    ("widths", "formats"), [("320,640,960,1280", "webp,avif"), ("480", "webp,avif"), ("none", "webp")]
)
def test_settings_written_as_an_environment_read_back_the_same(widths: str, formats: str) -> None:
    # GIVEN settings with a ladder in both formats, or none
    settings = Settings.from_env(REQUIRED | {"VARIANT_WIDTHS": widths, "VARIANT_FORMATS": formats})

    # WHEN they are written as the functions' environment (tools, tests) and read back
    # THEN they are the same settings
    assert Settings.from_env(settings.environment()) == settings
