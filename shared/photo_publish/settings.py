"""One frozen settings object, read from the environment and validated at cold start."""

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from datetime import timedelta
from types import NoneType
from typing import Any, Self

from photo_publish.retry import ContradictoryRetry, RetryPolicy


class InvalidSettings(ValueError):
    """Configuration the functions cannot run with; the message names each variable and its rule."""


# What is wrong with a value of the field's type ("must be at least 1"), or None.
_Rule = Callable[[Any], str | None]


def _between(low: float, high: float | None = None) -> dict[str, _Rule]:
    def rule(value: float) -> str | None:
        if high is None:
            return None if value >= low else f"must be at least {low}"
        return None if low <= value <= high else f"must be between {low} and {high}"

    return {"rule": rule}


def _min_length(length: int) -> dict[str, _Rule]:
    return {"rule": lambda value: None if len(value) >= length else f"must be at least {length} characters"}


def _pattern(pattern: str) -> dict[str, _Rule]:
    return {"rule": lambda value: None if re.fullmatch(pattern, value) else f"must match ^{pattern}$"}


# An EventBridge bus name (PutEvents' EventBusName: a name, or a bus's ARN), or empty.
_EVENT_BUS = (
    r"(|[/.\-_A-Za-z0-9]{1,256}|arn:aws[a-z-]*:events:[a-z0-9-]+:[0-9]{12}:event-bus/[/.\-_A-Za-z0-9]{1,256})"
)


def _distribution_id() -> dict[str, _Rule]:
    # CreateInvalidation takes the id alone: an ARN or the distribution's domain pasted instead would
    # fail every deletion's call, so it fails the cold start.
    def rule(value: str) -> str | None:
        if re.fullmatch(r"[^\s/:.]*", value):
            return None
        return "must be a distribution's id (E2QWRUHAPOMQZL), not its ARN or domain name"

    return {"rule": rule}


def _ladder() -> dict[str, _Rule]:
    def rule(widths: tuple[int, ...]) -> str | None:
        if any(width < 16 for width in widths):
            return "must list long edges of at least 16 pixels"
        return None if len(set(widths)) == len(widths) else "must not list a size twice"

    return {"rule": rule}


def _formats() -> dict[str, _Rule]:
    allowed = (("webp",), ("webp", "avif"))
    return {"rule": lambda value: None if value in allowed else "must be webp or webp,avif"}


# The AVIF encoder's defaults (RenderOptions shares them). benchmarks/ladder.py, at equal SSIMULACRA2
# to WebP's quality 80 effort 2: effort 0 at quality 52 is 78% of WebP's bytes for 1.2x its encode
# time, effort 1 at 51 73% for 3.4x, effort 2 70% for 6.7x, effort 4 61% for 46x. Only effort 0
# keeps the ladder in both formats within 2x the two-variant render (effort 1: 3x; docs/variants.md).
AVIF_QUALITY = 52
AVIF_EFFORT = 0

# A claim older than this is its dead worker's; a dead letter's sender holds it as long (SPEC 5).
STALE_AFTER_SECONDS = 300

# Lambda's memory, in its MB (MiB), at the template's default (ProcessMemorySize: one full vCPU).
TEMPLATE_MEMORY_MB = 1769


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Every number the template also knows arrives here as an environment variable (SPEC 11).

    Built directly (tests, devkit) or by `from_env`, the same rules hold, checked on construction.
    """

    database_url: str | None = None
    db_secret_arn: str | None = None
    db_host: str | None = None
    db_name: str = "photos"
    # The schema of the project's tables in a database it shares (the migrations create it); empty,
    # the first schema of the search path that holds them.
    db_schema: str = field(default="", metadata=_pattern("|[a-z_][a-z0-9_]{0,62}"))
    # RDS Proxy pins a session that uses server-side prepared statements: psycopg's automatic
    # preparation is turned off behind it.
    db_prepare_statements: bool = True
    # The server-side timeouts sent once as startup options; off (RDS Proxy refuses startup
    # options), each transaction sets them with SET LOCAL instead: one round trip more a
    # transaction. Either way every statement runs under them.
    db_session_options: bool = True
    # statement_timeout; lock_timeout is half of it, idle_in_transaction_session_timeout six times.
    db_statement_timeout_seconds: float = field(default=10.0, metadata=_between(0.1))
    # TLS for a database reached through DB_SECRET_ARN + DB_HOST: `verify-full` with the RDS CA
    # bundle in DB_SSLROOTCERT checks the server, `require` only encrypts.
    db_sslmode: str = field(default="require", metadata=_pattern("require|verify-ca|verify-full"))
    db_sslrootcert: str | None = None
    # The migrate function's alone (SPEC 17): the runtime role's secret (username and password, as
    # Secrets Manager generates it), whose login the migrations create and grant. DB_SECRET_ARN is
    # then the owner's; every other function's DB_SECRET_ARN is this runtime secret.
    db_runtime_secret_arn: str | None = None
    # The head revision the stack's migrations reached before this function was deployed (the
    # Migrations custom resource's): its reference orders the function after the migrations.
    db_schema_revision: str = ""

    photo_bucket: str = field(metadata=_min_length(3))
    stage: str = field(metadata=_pattern("[A-Za-z0-9_-]+"))
    process_queue_url: str = ""
    dead_letter_queue_url: str = ""
    # The bus the outbox's events go to (SPEC 12): its name or ARN. Empty, the process function
    # hands nothing off and the relay refuses to start.
    event_bus_name: str = field(default="", metadata=_pattern(_EVENT_BUS))
    # The process function's hand-off of its event right after its commit: one try, bounded by this
    # (connect and read each), so a slow bus never holds the next record back for long.
    event_handoff_timeout_seconds: float = field(default=1.0, metadata=_between(0.1, 10))
    # Published outbox rows are deleted after this many days (the bus's archive keeps the events).
    outbox_retention_days: int = field(default=7, metadata=_between(1))

    # Uploads (SPEC 17): how long a registration's presigned POST is valid, and where variants are
    # served from (the CDN's URL: the status answer's URLs are built from it; empty, keys only).
    upload_expiry_seconds: int = field(default=600, metadata=_between(60, 3600))
    variant_base_url: str = field(default="", metadata=_pattern(r"(|https?://[^\s]+)"))
    # Private albums (SPEC 17): the CloudFront public key's id (the stack's CdnKeyPairId output) and
    # the Secrets Manager secret holding its private half (PEM) that signs an album's cookies.
    cdn_key_pair_id: str = field(default="", metadata=_pattern(r"[A-Z0-9]*"))
    cdn_private_key_secret_arn: str | None = None
    # The distribution serving the variants (SPEC 19): a deletion invalidates the photo's variants
    # path there (photo_publish.jobs.invalidations). Empty, there is no CDN and nothing to invalidate.
    cdn_distribution_id: str = field(default="", metadata=_distribution_id())
    # A deleted photo's tombstone is kept this long: an event for it arriving later (the queue keeps
    # messages up to 14 days) is acknowledged, not retried until it pages.
    tombstone_retention_days: int = field(default=14, metadata=_between(1))

    max_attempts: int = field(default=3, metadata=_between(1))
    max_receive_count: int = field(default=5, metadata=_between(1))
    retry_base_seconds: int = field(default=30, metadata=_between(0))
    stale_after_seconds: int = field(default=STALE_AFTER_SECONDS, metadata=_between(0))
    sweep_after_seconds: int = field(default=600, metadata=_between(0))
    # A queue holding this many visible messages is still delivering: the sweep re-sends no pending
    # row meanwhile (their messages may be in it), only stale and owed work.
    sweep_max_backlog: int = field(default=100, metadata=_between(1))
    max_input_pixels: int = field(default=100_000_000, metadata=_between(1))
    max_original_bytes: int = field(default=104_857_600, metadata=_between(1))
    # The render's bounds whatever the file's shape (SPEC 3; see RenderOptions, benchmarks/hostile.py).
    max_input_dimension: int = field(default=32_768, metadata=_between(1))
    max_input_row_bytes: int = field(default=196_608, metadata=_between(1))
    # The function's memory in MB, which Lambda sets from MemorySize (the template's ProcessMemorySize):
    # what a decoder may hold follows from it (image/slots.py). Elsewhere, the template's default.
    aws_lambda_function_memory_size: int = field(default=TEMPLATE_MEMORY_MB, metadata=_between(128, 10240))
    render_timeout_seconds: float = field(default=30.0, metadata=_between(1))

    thumb_size: int = field(default=400, metadata=_between(16))
    browse_size: int = field(default=2048, metadata=_between(16))
    webp_quality: int = field(default=80, metadata=_between(1, 100))
    webp_effort: int = field(default=2, metadata=_between(0, 6))  # see RenderOptions.effort
    # Version 2: the recipe with the responsive ladder (SPEC 18); 1 rendered thumb and browse alone.
    variant_version: int = field(default=2, metadata=_between(1))
    # The responsive ladder (SPEC 18): long edges in pixels, each resized from the browse already in
    # memory, at most BROWSE_SIZE ("none": no ladder). With the thumb (400) below it: 640 (phones at
    # 2x, a laptop's content column), 1280 (phones at 3x, 1x screens), 2048 (the browse itself, no
    # second encode in WebP): steps 1.6-2x apart, as sites' srcsets run (Next.js' 640-2048). The
    # benchmark's numbers: this ladder costs 1.3x the two-variant render's CPU; 320,640,960,1280
    # cost 1.4x, over the 1.35x this project allows the ladder (docs/variants.md).
    variant_widths: tuple[int, ...] = field(default=(640, 1280, 2048), metadata=_ladder())
    # The ladder's formats: "webp", or "webp,avif" for the same ladder in AVIF too (thumb and browse
    # stay WebP).
    variant_formats: tuple[str, ...] = field(default=("webp",), metadata=_formats())
    # AVIF (libheif's AV1 encoder, aom): chosen at equal SSIMULACRA2 to WebP's quality 80 over the
    # bench corpus and the sample set (benchmarks/ladder.py, docs/variants.md).
    avif_quality: int = field(default=AVIF_QUALITY, metadata=_between(1, 100))
    avif_effort: int = field(default=AVIF_EFFORT, metadata=_between(0, 9))
    # The backfill (SPEC 14): job messages a sweep run sends, only while the process queue holds
    # fewer than BACKFILL_MAX_QUEUE_DEPTH messages (new uploads never wait behind a backfill), and
    # how long a replaced version's objects are kept for the clients and caches still holding them.
    backfill_batch_size: int = field(default=50, metadata=_between(1))
    backfill_max_queue_depth: int = field(default=10, metadata=_between(1))
    # A run's backfill messages are delayed evenly over this (the sweep's period): a trickle.
    backfill_spread_seconds: int = field(default=60, metadata=_between(0, 900))
    variant_grace_seconds: int = field(default=7 * 24 * 3600, metadata=_between(0))
    # Records of a batch worked on side by side (each holds one database connection at a time), of
    # which at most RENDER_CONCURRENCY render at once: the others read, claim, put and commit
    # meanwhile, so the renders' cores do not wait on S3's and the database's round trips.
    # Measured with AWS's latencies (benchmarks/delivery.py): 4 in flight, 2 rendering, a batch of
    # five 1-2 MP photos 29% faster than 2 and 2, 8-24 MP ones 10%.
    record_concurrency: int = field(default=4, metadata=_between(1, 10))
    # Renders at once in a container: its memory and CPU (JPEG decoding uses one core a photo).
    render_concurrency: int = field(default=2, metadata=_between(1, 10))
    # Seconds a record needs, at least, to finish once it starts, and to commit once rendered.
    record_budget_seconds: float = field(default=20.0, metadata=_between(0))
    commit_budget_seconds: float = field(default=5.0, metadata=_between(0))

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = getattr(self, spec.name)
            # An int is a valid float (`record_budget_seconds=0`), held as a float all the same.
            if spec.type is float and _KINDS[float].accepts(value):
                object.__setattr__(self, spec.name, float(value))
        problems = _problems({spec.name: getattr(self, spec.name) for spec in fields(self)})
        if problems:
            raise InvalidSettings("; ".join(problems))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Each field from the variable of its name in upper case; others, and empty ones, ignored."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        problems: list[str] = []
        for spec in fields(cls):
            variable, text = spec.name.upper(), env.get(spec.name.upper())
            if not text:
                if spec.default is MISSING:
                    problems.append(f"{variable} is required")
                continue
            kind = _KINDS[spec.type]
            try:
                values[spec.name] = kind.parse(text.strip())
            except ValueError:
                problems.append(f"{variable} must be {kind.noun}, got {text!r}")
        # Everything wrong at once: the operator fixes the environment in one deployment, not one
        # variable per failed cold start.
        problems += _problems(values)
        if problems:
            raise InvalidSettings("; ".join(problems))
        return cls(**values)

    def environment(self) -> dict[str, str]:
        """The variables `from_env` reads back as these settings (unset ones left out): what the
        template sets, for a function run in another process or in-process by the tools and tests."""
        return {
            spec.name.upper(): _text(value)
            for spec in fields(self)
            if (value := getattr(self, spec.name)) is not None
        }

    @property
    def originals_prefix(self) -> str:
        return f"{self.stage}/originals/"

    @property
    def purge_delay(self) -> timedelta:
        """When a deleted photo's objects are purged once more: after any worker that held it is
        stale (a render that raced the deletion may have put variants meanwhile)."""
        return timedelta(seconds=self.stale_after_seconds + self.record_budget_seconds)

    @property
    def retry(self) -> RetryPolicy:
        """The retry policy of these numbers (retry.py): checked with the others on construction."""
        return RetryPolicy(**{name: getattr(self, name) for name in _RETRY_NUMBERS})


def _text(value: object) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value)) if value else "none"
    return str(value)


def _parse_sizes(text: str) -> tuple[int, ...]:
    """Comma-separated integers ("320,640"); "none" for no size at all."""
    if text.lower() == "none":
        return ()
    return tuple(int(part) for part in text.split(","))


def _parse_names(text: str) -> tuple[str, ...]:
    return tuple(part.strip().lower() for part in text.split(","))


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


@dataclass(frozen=True, slots=True)
class _Kind:
    noun: str
    parse: Callable[[str], object]
    types: tuple[type, ...]

    # For a tuple: what each of its members must be.
    members: type | None = None

    def accepts(self, value: object) -> bool:
        if self.members is not None:
            members = self.members
            return isinstance(value, tuple) and all(_KINDS[members].accepts(member) for member in value)
        # True is an int to Python, never a number to these settings.
        return isinstance(value, self.types) and (bool in self.types or not isinstance(value, bool))


# Keyed by the fields' annotations themselves, which `from __future__ import annotations` would turn
# into strings: this module does without it.
_KINDS: dict[object, _Kind] = {
    str: _Kind("a string", str, (str,)),
    str | None: _Kind("a string", str, (str, NoneType)),
    int: _Kind("an integer", int, (int,)),
    float: _Kind("a number", float, (int, float)),
    bool: _Kind("true or false (or 1/0, yes/no, on/off)", _parse_bool, (bool,)),
    tuple[int, ...]: _Kind("comma-separated integers (or none)", _parse_sizes, (tuple,), int),
    tuple[str, ...]: _Kind("comma-separated names", _parse_names, (tuple,), str),
}


_DEFAULTS = {spec.name: spec.default for spec in fields(Settings)}
# The settings the retry policy is made of, named alike there.
_RETRY_NUMBERS = ("max_attempts", "max_receive_count", "retry_base_seconds")


def _problems(values: Mapping[str, Any]) -> list[str]:
    """What is wrong with the fields present in `values`, each named by its variable."""
    problems = []
    for spec in fields(Settings):
        if spec.name not in values:
            continue
        variable, value, kind = spec.name.upper(), values[spec.name], _KINDS[spec.type]
        broken = None if kind.accepts(value) else f"must be {kind.noun}"
        if broken is None and "rule" in spec.metadata:
            broken = spec.metadata["rule"](value)
        if broken is not None:
            problems.append(f"{variable} {broken}, got {value!r}")
    if not values.get("database_url") and not (values.get("db_secret_arn") and values.get("db_host")):
        problems.append("set DATABASE_URL, or DB_SECRET_ARN and DB_HOST")
    problems += _retry_problems(values)
    widths = values.get("variant_widths", _DEFAULTS["variant_widths"])
    browse = values.get("browse_size", _DEFAULTS["browse_size"])
    if (
        isinstance(widths, tuple)
        and isinstance(browse, int)
        and any(w > browse for w in widths if isinstance(w, int))
    ):
        # The ladder is made from the browse: a larger step would only ever be the browse's size again.
        problems.append(f"VARIANT_WIDTHS ({widths}) must not exceed BROWSE_SIZE ({browse})")
    if values.get("variant_formats") == ("webp", "avif") and widths == ():
        # AVIF is the ladder's alone: with no ladder it would render nothing, silently.
        problems.append("VARIANT_FORMATS webp,avif needs a ladder (VARIANT_WIDTHS is none)")
    if values.get("db_sslmode", "require") != "require" and not values.get("db_sslrootcert"):
        problems.append("DB_SSLMODE verify-ca and verify-full need DB_SSLROOTCERT (the CA bundle's path)")
    return problems


def _retry_problems(values: Mapping[str, Any]) -> list[str]:
    """What the retry policy refuses in its numbers (retry.py), once each is an integer at all."""
    numbers = {name: values.get(name, _DEFAULTS[name]) for name in _RETRY_NUMBERS}
    if not all(_KINDS[int].accepts(number) for number in numbers.values()):
        return []  # named already by its own variable's rule
    try:
        RetryPolicy(**numbers)
    except ContradictoryRetry as error:
        return [str(error)]
    return []
