"""The sweep function: on its schedule, re-send lost work and fail jobs whose worker died."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from photo_publish import bootstrap
from photo_publish.observability import logger, metrics


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    # The stage names the stack whose alarms read these (SweepRowErrorsAlarm).
    metrics.add_dimension(name="stage", value=bootstrap.settings().stage)
    summary = bootstrap.sweeper().run(lambda: context.get_remaining_time_in_millis() / 1000)
    result = summary.as_dict()
    logger.info("sweep finished", **result)
    for name in (
        "resentPending",
        "resentStale",
        "workerLost",
        "deadLettersSent",
        "sendFailed",
        "backfillSent",
        "backfillLeft",
        "retiredDeleted",
        "deletedPurged",
        # Rows or steps a run could not handle (logged): the run goes on, an alarm watches this.
        "errors",
    ):
        metrics.add_metric(name=f"Sweep_{name}", unit=MetricUnit.Count, value=int(result[name]))
    return result
