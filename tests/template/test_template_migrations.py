"""The migrations at deploy and the runtime role in template.yaml (SPEC 11, 17): the custom resource
follows the migrations' head, the functions are deployed after it, and only the migrate function
holds the owner's secret. Read from the template evaluated as CloudFormation would (test_template)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from photo_publish import deploy, migrate
from photo_publish.migrate import RuntimeRole
from photo_publish.settings import Settings
from tests.template.test_template import REQUIRED, ROOT, Stack, _pins, document

OWNER = REQUIRED["DbSecretArn"]
GIVEN_RUNTIME = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:photo-runtime-XyZ123"
RUNTIME_FUNCTIONS = ("ProcessFunction", "SweepFunction", "RelayFunction", "UploadFunction")


def statements(stack: Stack, role: str) -> list[dict[str, object]]:
    return [s for p in stack.properties(role)["Policies"] for s in p["PolicyDocument"]["Statement"]]


def roles(stack: Stack) -> list[str]:
    return [n for n, r in stack.resources().items() if r["Type"] == "AWS::IAM::Role"]


def test_the_custom_resources_head_is_the_migrations_head() -> None:
    # A new migration without a new Head would not be applied at deploy: this fails CI instead.
    assert Stack().properties("Migrations")["Head"] == migrate.head()


@pytest.mark.parametrize("runtime", ["", GIVEN_RUNTIME])
def test_no_function_but_migrate_can_read_the_owners_secret(runtime: str) -> None:
    # GIVEN the stack with its own runtime secret, or one given
    stack = Stack(DbRuntimeSecretArn=runtime)
    expected_runtime = runtime or "<DbRuntimeSecret>"

    # THEN only the migrate function is told the owner's secret, and only its role may read it
    for name in stack.functions():
        env = stack.function(name)["Environment"]["Variables"]
        if name == "MigrateFunction":
            assert (env["DB_SECRET_ARN"], env["DB_RUNTIME_SECRET_ARN"]) == (OWNER, expected_runtime)
        else:
            assert env["DB_SECRET_ARN"] == expected_runtime
            assert OWNER not in json.dumps(env)
    for role in roles(stack):
        readers = [s for s in statements(stack, role) if OWNER in json.dumps(s.get("Resource"))]
        assert bool(readers) == (role == "MigrateRole"), role
        runtime_reads = [
            s
            for s in statements(stack, role)
            if s["Action"] == "secretsmanager:GetSecretValue" and s["Resource"] == expected_runtime
        ]
        assert len(runtime_reads) == 1, role
    # AND a given secret replaces the generated one and its key grant
    resources = stack.resources()
    assert ("DbRuntimeSecret" in resources) == (not runtime)
    assert all(
        "RuntimeSecretKey" not in json.dumps(statements(stack, role)) for role in roles(stack) if runtime
    )


def test_the_generated_runtime_secret_is_a_role_login_under_the_stacks_key() -> None:
    secret = Stack().properties("DbRuntimeSecret")
    generated = secret["GenerateSecretString"]
    username = json.loads(generated["SecretStringTemplate"])["username"]
    # One login per stage (roles are the server's), a valid role name whatever the stage
    assert RuntimeRole(username).name == f"photo_publish_{Stack().params['Stage']}_runtime"
    assert RuntimeRole("photo_publish_Prod-2_runtime")
    assert generated["GenerateStringKey"] == "password"
    assert generated["ExcludePunctuation"] is True and int(generated["PasswordLength"]) >= 32
    assert secret["KmsKeyId"] == "<StackKey>"


def test_the_functions_are_deployed_after_the_migrations_and_the_migrate_function_before() -> None:
    stack = Stack()
    migrations = stack.properties("Migrations")
    assert stack.resources()["Migrations"]["Type"] == "Custom::Migrations"
    assert migrations["ServiceToken"] == "<MigrateFunction.Arn>"
    # a new schema or runtime secret re-runs the migrations' grants
    assert (migrations["Schema"], migrations["RuntimeSecret"]) == ("photo_publish", "<DbRuntimeSecret>")
    for name in RUNTIME_FUNCTIONS:
        env = stack.function(name)["Environment"]["Variables"]
        assert env["DB_SCHEMA_REVISION"] == "<Migrations.Revision>", name
    # the migrate function itself cannot wait for its own resource (a cycle)
    assert "DB_SCHEMA_REVISION" not in stack.function("MigrateFunction")["Environment"]["Variables"]
    assert "Migrations" not in json.dumps(stack.resources()["MigrateFunction"])


@pytest.mark.parametrize("parameters", [{"MigrateAtDeploy": "false"}, {"SamLocal": "true"}])
def test_without_migrations_at_deploy_nothing_waits_for_them(parameters: dict[str, str]) -> None:
    stack = Stack(**parameters)
    assert "Migrations" not in stack.resources()
    assert "MigrateFunction" in stack.resources()  # still there, for an operator's invoke
    for name in RUNTIME_FUNCTIONS:
        assert "DB_SCHEMA_REVISION" not in stack.function(name)["Environment"]["Variables"]


@pytest.mark.parametrize(("schema", "expected"), [(None, "photo_publish"), ("", "")])
def test_db_schema_reaches_every_function_as_settings(schema: str | None, expected: str) -> None:
    stack = Stack() if schema is None else Stack(DbSchema=schema)
    for name in stack.functions():
        assert Settings.from_env(stack.function(name)["Environment"]["Variables"]).db_schema == expected
    pattern = document()["Parameters"]["DbSchema"]["AllowedPattern"]
    assert re.fullmatch(pattern, "photo_publish") and re.fullmatch(pattern, "")
    assert not re.fullmatch(pattern, "Photo-Publish")


def test_the_migrate_function_answers_before_its_timeout_and_is_not_retried() -> None:
    function = Stack().function("MigrateFunction")
    assert (function["CodeUri"], function["Handler"]) == ("functions/migrate/", "app.lambda_handler")
    # a migration waiting for a lock gives up, with time left to answer CloudFormation
    assert int(function["Timeout"]) > migrate.LOCK_TIMEOUT_SECONDS + deploy.ANSWER_SECONDS
    assert int(function["Timeout"]) <= 900
    assert function["EventInvokeConfig"]["MaximumRetryAttempts"] == 0
    assert function["Layers"] == ["<SharedLayer>", "<VipsLayerArm64>"]


def test_the_migrate_functions_own_packages_agree_with_the_layer() -> None:
    # GIVEN what the function bundles (alembic and mako, in no layer) and the layer's lock
    bundled = _pins(ROOT / "functions" / "migrate" / "requirements.txt")
    layer = _pins(ROOT / "layers" / "vips" / "requirements.txt")
    assert {"alembic", "mako", "markupsafe"} <= set(bundled)
    # THEN every package both hold is the same version (pip bundles alembic's requirements too)
    for name in set(bundled) & set(layer):
        assert bundled[name] == layer[name], name
    # AND the versions are the ones the project is tested with
    from importlib.metadata import version

    assert bundled["alembic"] == version("alembic") and bundled["mako"] == version("mako")


def test_the_deploying_guide_documents_every_new_parameter() -> None:
    guide = (ROOT / "docs" / "deploying.md").read_text()
    for parameter in ("DbSchema", "DbRuntimeSecretArn", "MigrateAtDeploy"):
        assert f"`{parameter}`" in guide, parameter
    assert "aws lambda invoke" in guide


def test_the_other_functions_requirements_still_bundle_nothing() -> None:
    for name in ("process", "sweep", "relay", "upload"):
        text = Path(ROOT / "functions" / name / "requirements.txt").read_text()
        assert not [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
