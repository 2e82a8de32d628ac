"""One frozen settings object, read from the environment and validated at cold start."""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Settings(BaseModel):
    """Every number the template also knows arrives here as an environment variable (SPEC 11)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    database_url: str | None = None
    db_secret_arn: str | None = None
    db_host: str | None = None
    db_name: str = "photos"
    # RDS Proxy pins a session that uses server-side prepared statements: psycopg's automatic
    # preparation is turned off behind it.
    db_prepare_statements: bool = True

    photo_bucket: str = Field(min_length=3)
    stage: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_-]+$")
    process_queue_url: str = ""
    dead_letter_queue_url: str = ""

    max_attempts: int = Field(3, ge=1)
    max_receive_count: int = Field(5, ge=1)
    retry_base_seconds: int = Field(30, ge=0)
    stale_after_seconds: int = Field(300, ge=0)
    sweep_after_seconds: int = Field(600, ge=0)
    max_input_pixels: int = Field(100_000_000, ge=1)
    max_original_bytes: int = Field(104_857_600, ge=1)

    thumb_size: int = Field(400, ge=16)
    browse_size: int = Field(2048, ge=16)
    webp_quality: int = Field(80, ge=1, le=100)
    webp_effort: int = Field(2, ge=0, le=6)  # see RenderOptions.effort
    variant_version: int = Field(1, ge=1)
    # Records of a batch worked on side by side (each holds one database connection at a time).
    record_concurrency: int = Field(2, ge=1, le=10)
    # Seconds a record needs, at least, to finish once it starts, and to commit once rendered.
    record_budget_seconds: float = Field(20.0, ge=0)
    commit_budget_seconds: float = Field(5.0, ge=0)

    @model_validator(mode="after")
    def _database_configured(self) -> Settings:
        if not self.database_url and not (self.db_secret_arn and self.db_host):
            raise ValueError("set DATABASE_URL, or DB_SECRET_ARN and DB_HOST")
        return self

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        values = {name: env[name.upper()] for name in cls.model_fields if env.get(name.upper())}
        return cls.model_validate(values)

    @property
    def originals_prefix(self) -> str:
        return f"{self.stage}/originals/"

    def backoff_seconds(self, attempt: int) -> int:
        """BullMQ's exponential backoff: base * 2^(attempt-1), attempt counted from 1."""
        return int(self.retry_base_seconds * 2 ** max(attempt - 1, 0))
