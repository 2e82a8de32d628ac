"""The relay function: on its schedule, publish the outbox's waiting events to the bus (SPEC 12)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from photo_publish import bootstrap
from photo_publish.observability import logger, metrics

# The alarm on the oldest waiting event reads this metric, with these dimensions (template.yaml).
OLDEST_UNPUBLISHED = "OutboxOldestUnpublishedSeconds"


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    relay = bootstrap.relay()
    summary = relay.publish_pending(lambda: context.get_remaining_time_in_millis() / 1000)
    result = summary.as_dict()
    logger.info("relay finished", **result)
    # Per stage: stages may share an account, and each has its own alarm.
    metrics.add_dimension(name="stage", value=bootstrap.settings().stage)
    for name, value in (
        ("published", summary.published),
        ("notAccepted", summary.not_accepted),
        ("tooLarge", summary.too_large),
        ("deleted", summary.deleted),
    ):
        metrics.add_metric(name=f"Relay_{name}", unit=MetricUnit.Count, value=value)
    metrics.add_metric(
        name=OLDEST_UNPUBLISHED, unit=MetricUnit.Seconds, value=summary.oldest_unpublished_seconds
    )
    return result
