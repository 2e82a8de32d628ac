"""The payload other services read from the outbox (SPEC 4.2): typed, validated on write."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

PHOTO_PUBLISHED = "photo.published"


class _Contract(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)


class VariantRef(_Contract):
    key: str = Field(min_length=1)
    width: int = Field(gt=0)
    height: int = Field(gt=0)
    size: int = Field(gt=0, alias="bytes")
    content_type: str


class PublishedVariants(_Contract):
    thumb: VariantRef
    browse: VariantRef


class PhotoPublishedPayload(_Contract):
    schema_version: Literal[1] = 1
    photo_id: UUID
    album_id: UUID
    # Post-increment: a photo starts at 1, so a published one is at least 2.
    entity_version: int = Field(ge=2)
    published_at: datetime
    width: int = Field(gt=0)
    height: int = Field(gt=0)
    variants: PublishedVariants

    @field_validator("published_at")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            raise ValueError("publishedAt must carry a time zone")
        return value.astimezone(UTC)

    def to_json(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True)
