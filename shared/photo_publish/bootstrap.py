"""Clients, engine and settings: created once per container, on first use.

Once, even when the batch's worker threads ask for them at the same moment: every factory builds
under one lock (factories call each other, and boto3 documents building clients on one session from
several threads as unsafe: boto/boto3#1592). Once built, an object is returned without the lock.

Each function imports only its own work: the renderer (pyvips, Powertools' batch utility) is
imported by the factories of the process function, the sweep by its own, so the sweep function
never loads libvips. The coldstart benchmark times the process handler's import together with
these factories, so nothing is hidden from its figure by being imported late.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import update_wrapper
from typing import TYPE_CHECKING, Generic, ParamSpec, TypeVar

import boto3
from botocore.config import Config
from sqlalchemy import Engine

from photo_publish.adapters.database import create_database_engine
from photo_publish.adapters.queue import SqsQueue
from photo_publish.settings import InvalidSettings, Settings

if TYPE_CHECKING:
    from aws_lambda_powertools import Metrics
    from mypy_boto3_cloudfront import CloudFrontClient
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_secretsmanager import SecretsManagerClient
    from mypy_boto3_sqs import SQSClient

    from photo_publish.adapters.cdn import CloudFrontCdn
    from photo_publish.jobs.sweep import Sweeper
    from photo_publish.outbox.relay import Relay
    from photo_publish.publish.delivery import ConcurrentBatchProcessor, Delivery
    from photo_publish.serving import SigningKey

# boto3 reads AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL_SQS /
# AWS_ENDPOINT_URL_EVENTBRIDGE / AWS_ENDPOINT_URL_CLOUDFRONT itself (LocalStack, MinIO, a local server), so nothing here knows
# about endpoints.
_CLIENT_CONFIG = Config(
    retries={"mode": "standard", "max_attempts": 3},
    connect_timeout=3,
    read_timeout=20,
    max_pool_connections=16,
)


P = ParamSpec("P")
T = TypeVar("T")
# Reentrant: a factory builds what it needs through the others.
_BUILDING = threading.RLock()


class _Once(Generic[P, T]):
    """A factory whose object is built once per container (per argument), whichever threads ask."""

    def __init__(self, factory: Callable[P, T]) -> None:
        self._factory = factory
        self._built: dict[tuple[object, ...], T] = {}
        update_wrapper(self, factory)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> T:
        if kwargs:
            raise TypeError("factories take positional arguments only")
        if args in self._built:
            return self._built[args]
        with _BUILDING:
            if args not in self._built:
                self._built[args] = self._factory(*args, **kwargs)
            return self._built[args]

    def cache_clear(self) -> None:
        with _BUILDING:
            self._built.clear()


@_Once
def settings() -> Settings:
    return Settings.from_env()


@_Once
def session() -> boto3.session.Session:
    # The container's own session: nothing else in the process builds clients on it.
    return boto3.session.Session()


@_Once
def s3_client() -> S3Client:
    # SigV4 named, not left to botocore: unset, it presigns S3 (a registration's POST) with SigV2,
    # which S3 refuses on buckets created after June 2020 and in regions opened since 2014.
    return session().client("s3", config=_CLIENT_CONFIG.merge(Config(signature_version="s3v4")))


@_Once
def sqs_client() -> SQSClient:
    return session().client("sqs", config=_CLIENT_CONFIG)


@_Once
def events_client() -> EventBridgeClient:
    """The relay's: its own tries (only the entries that failed) are the retries."""
    return session().client(
        "events", config=_CLIENT_CONFIG.merge(Config(retries={"total_max_attempts": 1}, read_timeout=10))
    )


@_Once
def handoff_events_client() -> EventBridgeClient:
    """The process function's hand-off after a commit: one short try, never a wait on a slow bus
    (the relay sends what it could not)."""
    timeout = settings().event_handoff_timeout_seconds
    return session().client(
        "events",
        config=_CLIENT_CONFIG.merge(
            Config(retries={"total_max_attempts": 1}, connect_timeout=timeout, read_timeout=timeout)
        ),
    )


@_Once
def secrets_client() -> SecretsManagerClient:
    return session().client("secretsmanager", config=_CLIENT_CONFIG)


@_Once
def cloudfront_client() -> CloudFrontClient:
    """A deletion's invalidation: one short try, within the upload function's 10 s (the sweep sends
    what it could not)."""
    return session().client(
        "cloudfront",
        config=_CLIENT_CONFIG.merge(
            Config(retries={"total_max_attempts": 1}, connect_timeout=2, read_timeout=4)
        ),
    )


@_Once
def cdn() -> CloudFrontCdn | None:
    """The distribution's invalidations (SPEC 19); None without CDN_DISTRIBUTION_ID: no CDN."""
    from photo_publish.adapters.cdn import CloudFrontCdn

    distribution = settings().cdn_distribution_id
    return CloudFrontCdn(cloudfront_client(), distribution) if distribution else None


@_Once
def cdn_signing_key() -> SigningKey:
    """Private albums' key (photo_publish.serving): its private half read from Secrets Manager once
    per container, never written anywhere else."""
    from photo_publish.serving import SigningKey

    config = settings()
    if not (config.cdn_key_pair_id and config.cdn_private_key_secret_arn):
        raise InvalidSettings(
            "CDN_KEY_PAIR_ID and CDN_PRIVATE_KEY_SECRET_ARN are required to sign private albums' cookies"
        )
    pem = secrets_client().get_secret_value(SecretId=config.cdn_private_key_secret_arn)["SecretString"]
    return SigningKey.from_pem(config.cdn_key_pair_id, pem)


def read_secret(arn: str) -> str:
    """A Secrets Manager secret's string (the database's credentials)."""
    return secrets_client().get_secret_value(SecretId=arn)["SecretString"]


@_Once
def engine() -> Engine:
    return create_database_engine(settings(), read_secret)


@_Once
def queue() -> SqsQueue:
    config = settings()
    return SqsQueue(sqs_client(), config.process_queue_url, config.dead_letter_queue_url)


@_Once
def delivery(metrics: Metrics) -> Delivery:
    from photo_publish.adapters.storage import S3Store
    from photo_publish.publish.delivery import Delivery
    from photo_publish.publish.service import PhotoService

    config = settings()
    service = PhotoService(
        engine(),
        S3Store(s3_client(), config.photo_bucket),
        queue(),
        config,
        events=handoff() if config.event_bus_name else None,
    )
    return Delivery(service, queue(), config, metrics)


@_Once
def handoff() -> Relay:
    from photo_publish.outbox.relay import EventBridgeBus, Relay

    config = settings()
    return Relay(engine(), EventBridgeBus(handoff_events_client(), config.event_bus_name), config)


@_Once
def relay() -> Relay:
    from photo_publish.outbox.relay import EventBridgeBus, Relay

    config = settings()
    if not config.event_bus_name:
        raise InvalidSettings("EVENT_BUS_NAME is required: the relay has no bus to publish to")
    return Relay(engine(), EventBridgeBus(events_client(), config.event_bus_name), config)


@_Once
def batch_processor() -> ConcurrentBatchProcessor:
    from photo_publish.publish.delivery import ConcurrentBatchProcessor

    return ConcurrentBatchProcessor(workers=settings().record_concurrency)


@_Once
def sweeper() -> Sweeper:
    from photo_publish.adapters.queue import DeadLetterQueue
    from photo_publish.adapters.storage import S3Store
    from photo_publish.jobs.sweep import Sweeper

    config = settings()
    dead_letters = DeadLetterQueue(
        sqs_client(), config.dead_letter_queue_url, bucket=config.photo_bucket, stage=config.stage
    )
    return Sweeper(
        engine(),
        queue(),
        config,
        store=S3Store(s3_client(), config.photo_bucket),
        cdn=cdn(),
        dead_letters=dead_letters if config.dead_letter_queue_url else None,
    )


def reset() -> None:
    """Forget every client (tests that change the environment between cases)."""
    for factory in (
        settings,
        session,
        s3_client,
        sqs_client,
        events_client,
        handoff_events_client,
        secrets_client,
        cloudfront_client,
        cdn,
        cdn_signing_key,
        engine,
        queue,
        delivery,
        handoff,
        relay,
        batch_processor,
        sweeper,
    ):
        factory.cache_clear()
