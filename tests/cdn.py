"""A CloudFront distribution on moto's server, and what was invalidated at it, for assertions."""

from __future__ import annotations

import uuid
from typing import Any

import boto3
from sqlalchemy import Engine, select

from photo_publish.adapters.tables import cdn_invalidations


def cloudfront() -> Any:
    """A CloudFront client for the tests (the functions build their own, with boto3)."""
    return boto3.client("cloudfront")


def distribution(bucket: str) -> str:
    """A new distribution in front of the bucket (as the template's, as far as moto needs): its id."""
    config = {
        "CallerReference": uuid.uuid4().hex,
        "Comment": "photo-publish variants (tests)",
        "Enabled": True,
        "Origins": {
            "Quantity": 1,
            "Items": [
                {
                    "Id": "variants",
                    "DomainName": f"{bucket}.s3.amazonaws.com",
                    "S3OriginConfig": {"OriginAccessIdentity": ""},
                }
            ],
        },
        "DefaultCacheBehavior": {
            "TargetOriginId": "variants",
            "ViewerProtocolPolicy": "https-only",
            # AWS's managed CachingOptimized policy
            "CachePolicyId": "658327ea-f89d-4fab-a63d-7e88639e58f6",
        },
    }
    return str(cloudfront().create_distribution(DistributionConfig=config)["Distribution"]["Id"])


def invalidations(distribution_id: str) -> list[list[str]]:
    """The paths of each invalidation created at the distribution (one list a CreateInvalidation call),
    read back from CloudFront itself."""
    client = cloudfront()
    listed = client.list_invalidations(DistributionId=distribution_id, MaxItems="1000")["InvalidationList"]
    return [
        list(
            client.get_invalidation(DistributionId=distribution_id, Id=item["Id"])["Invalidation"][
                "InvalidationBatch"
            ]["Paths"].get("Items", [])
        )
        for item in listed.get("Items", [])
    ]


def waiting(db: Engine) -> dict[str, int]:
    """The paths still to invalidate, with their attempts so far."""
    with db.connect() as c:
        return {
            row.path: row.attempts
            for row in c.execute(select(cdn_invalidations.c.path, cdn_invalidations.c.attempts))
        }
