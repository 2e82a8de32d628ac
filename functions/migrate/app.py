"""The migrate function (SPEC 11, 17): the schema's migrations, from inside the VPC.

A CloudFormation custom resource (Custom::Migrations) calls it on Create and Update, and every
request is answered at its ResponseURL (photo_publish.deploy); Delete changes nothing. Invoked
directly (`aws lambda invoke`, `sam local invoke` with `{}`), it migrates and returns the revision.
A second run is a no-op: Alembic applies only what the version table lacks.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from photo_publish import bootstrap, deploy, migrate
from photo_publish.observability import logger


def migrations() -> dict[str, str]:
    """Apply the migrations with the owner's login and grant the runtime role: the head revision."""
    try:
        revision = migrate.upgrade_as_configured(bootstrap.settings(), bootstrap.read_secret)
    except Exception as error:
        # Never the exception's own text: a database error carries its statement (migrate.describe),
        # and Lambda reports a raised error's text as the invocation's errorMessage, and logs it.
        reason = migrate.describe(error)
        logger.error("migrations failed", error_type=type(error).__name__, reason=reason)
        raise migrate.MigrationFailed(f"{type(error).__name__}: {reason}") from None
    logger.info("migrations applied", revision=revision)
    return {"Revision": revision}


@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    if not deploy.is_request(event):
        return {"revision": migrations()["Revision"]}
    stage = event.get("ResourceProperties", {}).get("Stage", "")
    logger.info("custom resource request", request_type=event["RequestType"], stage=stage)
    answer = deploy.handle(
        event,
        context,
        migrations,
        # The same at every run: a new id on Update would make CloudFormation delete the "old" one.
        physical_id=f"photo-publish-migrations-{stage}",
        describe=migrate.describe,
    )
    logger.info("answered CloudFormation", status=answer["Status"], reason=answer["Reason"])
    return answer
