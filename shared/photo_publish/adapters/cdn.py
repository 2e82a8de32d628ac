"""CloudFront, the CDN: invalidating what a deletion took away (SPEC 19).

CloudFront's limits, which the callers keep to (photo_publish.jobs.invalidations, docs/cost.md):
at most 15 wildcard paths in progress per distribution at one time, and 3,000 paths in one call
(3,000 file paths in progress). Every path this project sends is a wildcard, so the 15 binds.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from photo_publish.observability import logger

if TYPE_CHECKING:
    from mypy_boto3_cloudfront import CloudFrontClient

MAX_WILDCARD_PATHS = 15
MAX_PATHS_PER_CALL = 3000

# Refusals that pass by themselves: the next try may be accepted. Any other code (NoSuchDistribution,
# AccessDenied, InvalidArgument, ...) is the configuration's or the code's, and logged as an error.
_TRANSIENT = frozenset(
    {
        "TooManyInvalidationsInProgress",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "ServiceUnavailable",
        "InternalError",
        "InternalFailure",
    }
)


class CloudFrontCdn:
    def __init__(self, client: CloudFrontClient, distribution_id: str) -> None:
        self._client = client
        self._distribution_id = distribution_id

    def invalidate(self, paths: Sequence[str]) -> bool:
        """One CreateInvalidation call for all the paths; whether CloudFront accepted it."""
        if not paths:
            return True
        if len(paths) > MAX_PATHS_PER_CALL:
            raise ValueError(f"{len(paths)} paths in one invalidation: CloudFront takes {MAX_PATHS_PER_CALL}")
        try:
            answer = self._client.create_invalidation(
                DistributionId=self._distribution_id,
                InvalidationBatch={
                    "Paths": {"Quantity": len(paths), "Items": list(paths)},
                    # One a call, not a try: botocore's retry of this call is then one invalidation.
                    "CallerReference": uuid.uuid4().hex,
                },
            )
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            log = logger.warning if code in _TRANSIENT else logger.error
            log(
                "cdn invalidation refused",
                code=code,
                distribution_id=self._distribution_id,
                paths=len(paths),
            )
            return False
        except BotoCoreError as error:
            logger.warning(
                "cdn unreachable",
                reason=type(error).__name__,
                distribution_id=self._distribution_id,
                paths=len(paths),
            )
            return False
        logger.info(
            "cdn invalidation created",
            invalidation_id=answer["Invalidation"]["Id"],
            distribution_id=self._distribution_id,
            paths=len(paths),
        )
        return True
