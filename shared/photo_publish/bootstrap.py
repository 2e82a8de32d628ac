"""Clients, engine and settings: created once per container, on first use.

Each function imports only its own work: the renderer (pyvips, Powertools' batch utility) is
imported by the factories of the process function, the sweep by its own, so the sweep function
never loads libvips. The coldstart benchmark times the process handler's import together with
these factories, so nothing is hidden from its figure by being imported late.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

import boto3
from botocore.config import Config
from sqlalchemy import Engine

from photo_publish.database import create_database_engine
from photo_publish.queue import SqsQueue
from photo_publish.settings import Settings

if TYPE_CHECKING:
    from aws_lambda_powertools import Metrics
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sqs import SQSClient

    from photo_publish.delivery import ConcurrentBatchProcessor, Delivery
    from photo_publish.sweep import Sweeper

# boto3 reads AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL_SQS itself (LocalStack,
# MinIO, a local server), so nothing here knows about endpoints.
_CLIENT_CONFIG = Config(
    retries={"mode": "standard", "max_attempts": 3},
    connect_timeout=3,
    read_timeout=20,
    max_pool_connections=16,
)


@cache
def settings() -> Settings:
    return Settings.from_env()


@cache
def s3_client() -> S3Client:
    return boto3.client("s3", config=_CLIENT_CONFIG)


@cache
def sqs_client() -> SQSClient:
    return boto3.client("sqs", config=_CLIENT_CONFIG)


@cache
def engine() -> Engine:
    def read_secret(arn: str) -> str:
        return boto3.client("secretsmanager", config=_CLIENT_CONFIG).get_secret_value(SecretId=arn)[
            "SecretString"
        ]

    return create_database_engine(settings(), read_secret)


@cache
def queue() -> SqsQueue:
    config = settings()
    return SqsQueue(sqs_client(), config.process_queue_url, config.dead_letter_queue_url)


@cache
def delivery(metrics: Metrics) -> Delivery:
    from photo_publish.delivery import Delivery
    from photo_publish.repository import PhotoRepository
    from photo_publish.service import PhotoService
    from photo_publish.storage import S3Store

    config = settings()
    service = PhotoService(
        PhotoRepository(engine()), S3Store(s3_client(), config.photo_bucket), queue(), config
    )
    return Delivery(service, queue(), config, metrics)


@cache
def batch_processor() -> ConcurrentBatchProcessor:
    from photo_publish.delivery import ConcurrentBatchProcessor

    return ConcurrentBatchProcessor(workers=settings().record_concurrency)


@cache
def sweeper() -> Sweeper:
    from photo_publish.sweep import Sweeper

    return Sweeper(engine(), queue(), settings())


def reset() -> None:
    """Forget every client (tests that change the environment between cases)."""
    for factory in (settings, s3_client, sqs_client, engine, queue, delivery, batch_processor, sweeper):
        factory.cache_clear()
