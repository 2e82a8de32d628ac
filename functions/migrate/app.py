"""The migrate function (SPEC 11, 17): the schema's migrations, from inside the VPC.

A CloudFormation custom resource (Custom::Migrations) calls it on Create and Update, and every
request is answered at its ResponseURL (photo_publish.deploy); Delete changes nothing. Invoked
directly (`aws lambda invoke`, `sam local invoke` with `{}`), it migrates and returns the revision.
A second run is a no-op: Alembic applies only what the version table lacks. A run that would
outlast the function is stopped first (its statement cancelled, its transaction rolled back, the
advisory lock released: photo_publish.migrate.within), then answered FAILED: nothing of it runs or
commits after the answer.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from photo_publish import bootstrap, deploy, migrate
from photo_publish.budget import Remaining
from photo_publish.observability import logger


def migrations(remaining: Remaining) -> dict[str, str]:
    """Apply the migrations with the owner's login and grant the runtime role: the head revision.
    A run not finished within `remaining` is stopped and rolled back before this raises."""
    try:
        revision = migrate.upgrade_as_configured(bootstrap.settings(), bootstrap.read_secret, remaining)
    except Exception as error:
        # Never the exception's own text: a database error carries its statement (migrate.describe),
        # and Lambda reports a raised error's text as the invocation's errorMessage, and logs it.
        reason = migrate.describe(error)
        logger.error("migrations failed", error_type=type(error).__name__, reason=reason)
        if isinstance(error, migrate.MigrationFailed):
            raise
        raise migrate.MigrationFailed(f"{type(error).__name__}: {reason}") from None
    logger.info("migrations applied", revision=revision)
    return {"Revision": revision}


@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    def remaining() -> float:
        # The time until the function must answer (CloudFormation's PUT, or its own return).
        return context.get_remaining_time_in_millis() / 1000 - deploy.ANSWER_SECONDS

    if not deploy.is_request(event):
        return {"revision": migrations(remaining)["Revision"]}
    stage = event.get("ResourceProperties", {}).get("Stage", "")
    logger.info("custom resource request", request_type=event["RequestType"], stage=stage)
    answer = deploy.handle(
        event,
        context,
        lambda: migrations(remaining),
        # The same at every run: a new id on Update would make CloudFormation delete the "old" one.
        physical_id=f"photo-publish-migrations-{stage}",
        describe=migrate.describe,
    )
    logger.info("answered CloudFormation", status=answer["Status"], reason=answer["Reason"])
    return answer
