"""The process function: an SQS batch (or an S3 event) in, a partial batch response out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from photo_publish import bootstrap
from photo_publish.errors import PhotoError
from photo_publish.events import is_s3_event
from photo_publish.image.memory import trimmed
from photo_publish.observability import logger, metrics

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


def record_handler(record: dict[str, Any], lambda_context: LambdaContext) -> None:
    """One SQS record (the event's JSON as Lambda gives it)."""
    logger.thread_safe_clear_keys()
    logger.thread_safe_append_keys(message_id=record["messageId"])
    bootstrap.delivery(metrics).sqs_record(
        message_id=record["messageId"],
        body=record["body"],
        receipt_handle=record["receiptHandle"],
        receive_count=int(record["attributes"]["ApproximateReceiveCount"]),
        remaining=lambda: lambda_context.get_remaining_time_in_millis() / 1000,
    )


# Once per invocation, after the batch: the warm container's heap stays flat (issue 17).
@trimmed
@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    if not event.get("Records"):
        return {"batchItemFailures": []}
    # The stage names the stack whose dashboard reads these (one account may hold several).
    metrics.add_dimension(name="stage", value=bootstrap.settings().stage)
    try:
        # A recipe that differs from its version's recorded one fails the invocation, loudly.
        bootstrap.delivery(metrics).ensure_recipe()
    except PhotoError as error:
        # The database is unreachable: each record finds out, and comes back after its backoff.
        logger.warning("recipe not checked", error_code=error.code)
    if is_s3_event(event):
        results = bootstrap.delivery(metrics).s3_records(
            event["Records"], remaining=lambda: context.get_remaining_time_in_millis() / 1000
        )
        return {"results": [{"photoId": str(r.photo_id), "outcome": r.outcome} for r in results]}
    # Powertools' process_partial_response contract (photo_publish.publish.delivery says why not its own).
    return bootstrap.batch_processor().process(
        event["Records"], lambda record: record_handler(record, context)
    )
