"""template.yaml agrees with the code (SPEC 5, 8, 11), and the linters pass on it.

The template is read with a small loader for CloudFormation's short tags and evaluated for given
parameter values, so each test checks what CloudFormation would deploy, not the text. The linters
(sam, cfn-lint, checkov) live in their own virtual environment, .venv-tools (`make tools`): they
pin many packages the project's own environment must not share.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import json
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, ClassVar
from uuid import uuid4

import pytest
import yaml
from packaging.requirements import Requirement
from sqlalchemy import make_url

from devkit import handlers
from photo_publish.events import from_sqs_body
from photo_publish.image import slots
from photo_publish.keys import original_key, variant_key
from photo_publish.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"
TOOLS = ROOT / ".venv-tools" / "bin"
PACKAGE = ROOT / "shared" / "photo_publish"

# --- the tools -----------------------------------------------------------------------------------


def tool(name: str) -> Path:
    """A linter or SAM from .venv-tools; a missing one fails the test (never a silent skip)."""
    path = TOOLS / name
    if not path.exists():
        pytest.fail(f"{path} is missing: `make tools` installs sam, cfn-lint and checkov into .venv-tools")
    return path


def tool_env(**extra: str) -> dict[str, str]:
    """The environment for the tools: no telemetry, no project PYTHONPATH, no AWS endpoint."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "AWS_ENDPOINT_URL"))}
    env.update(SAM_CLI_TELEMETRY="0", AWS_DEFAULT_REGION=env.get("AWS_DEFAULT_REGION", "us-east-1"))
    return env | extra


@cache
def python312() -> Path:
    """The Lambda runtime's Python (3.12): `python3.12` on PATH, else pyenv's newest 3.12."""
    candidates: list[Path] = []
    if found := shutil.which("python3.12"):
        candidates.append(Path(found))
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += sorted(pyenv_root.glob("versions/3.12.*/bin/python3.12"), reverse=True)
    for candidate in candidates:
        # A pyenv shim exists even where no 3.12 is selected: ask it for the real executable.
        probe = subprocess.run(
            [str(candidate), "-c", "import sys; print(sys.executable)"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0 and probe.stdout.strip():
            return Path(probe.stdout.strip())
    pytest.fail(
        "Python 3.12 (the Lambda runtime's) not found: install it (pyenv install 3.12) or put it on PATH"
    )


# --- reading the template ------------------------------------------------------------------------


class CfnLoader(yaml.SafeLoader):
    """YAML with CloudFormation's short tags (!Ref, !GetAtt, !Sub, ...) as their long forms."""


def _short_tag(loader: CfnLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
        if suffix == "GetAtt":
            value = value.split(".", 1)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    if suffix in ("Ref", "Condition"):
        return {suffix: value}
    return {f"Fn::{suffix}": value}


CfnLoader.add_multi_constructor("!", _short_tag)

NO_VALUE = object()
# Resources whose !Ref is their Name property (the others stay symbolic, `<Resource>`).
REF_IS_NAME = {"AWS::Events::EventBus"}
PSEUDO = {
    "AWS::AccountId": "123456789012",
    "AWS::Region": "eu-west-1",
    "AWS::Partition": "aws",
    "AWS::StackName": "photo-publish-test",
    "AWS::URLSuffix": "amazonaws.com",
    "AWS::NoValue": NO_VALUE,
}
# Required parameters (no default), as a deployment would give them.
REQUIRED = {
    "DbSecretArn": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:photo-db-AbCdEf",
    "DbHost": "photos.proxy-abc.eu-west-1.rds.amazonaws.com",
}


@cache
def document() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.load(TEMPLATE.read_text(), Loader=CfnLoader)  # a SafeLoader
    return loaded


class Stack:
    """The template evaluated for some parameter values: what CloudFormation would deploy.

    A reference to a resource stays symbolic: `<ProcessQueue>` for !Ref, `<ProcessQueue.Arn>` for
    !GetAtt, also inside !Sub strings.
    """

    def __init__(self, **parameters: str) -> None:
        self.doc = document()
        given = REQUIRED | parameters
        self.params: dict[str, Any] = {}
        for name, spec in self.doc["Parameters"].items():
            value = given.get(name, spec.get("Default"))
            assert value is not None, f"parameter {name} has no value"
            self.params[name] = value.split(",") if spec["Type"] == "CommaDelimitedList" else value

    def condition(self, name: str) -> bool:
        return bool(self._condition(self.doc["Conditions"][name]))

    def _condition(self, expr: Any) -> Any:
        if isinstance(expr, dict) and len(expr) == 1:
            ((key, value),) = expr.items()
            if key == "Condition":
                return self.condition(value)
            if key == "Fn::Equals":
                left, right = (self.resolve(v) for v in value)
                return left == right
            if key == "Fn::Not":
                return not self._condition(value[0])
            if key == "Fn::And":
                return all(self._condition(v) for v in value)
            if key == "Fn::Or":
                return any(self._condition(v) for v in value)
        return self.resolve(expr)

    def resolve(self, value: Any) -> Any:
        if isinstance(value, list):
            return [r for r in (self.resolve(v) for v in value) if r is not NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1 and (function := self._FUNCTIONS.get(next(iter(value)))):
            return function(self, next(iter(value.values())))
        return {k: r for k, r in ((k, self.resolve(v)) for k, v in value.items()) if r is not NO_VALUE}

    def _sub_string(self, arg: Any) -> str:
        text, variables = (arg, {}) if isinstance(arg, str) else arg
        variables = {k: self.resolve(v) for k, v in variables.items()}
        return re.sub(r"\$\{([^}!]+)\}", lambda m: self._sub(m.group(1), variables), text)

    def _find_in_map(self, arg: Any) -> Any:
        mapping, top, second = (self.resolve(v) for v in arg)
        return self.doc["Mappings"][mapping][top][second]

    def _if(self, arg: Any) -> Any:
        name, yes, no = arg
        return self.resolve(yes if self.condition(name) else no)

    _FUNCTIONS: ClassVar[dict[str, Any]] = {
        "Ref": lambda self, arg: self._ref(arg),
        "Fn::GetAtt": lambda self, arg: f"<{arg[0]}.{arg[1]}>",
        "Fn::Sub": _sub_string,
        "Fn::FindInMap": _find_in_map,
        "Fn::If": _if,
        "Fn::Join": lambda self, arg: arg[0].join(str(i) for i in self.resolve(arg[1])),
        "Fn::Split": lambda self, arg: self.resolve(arg[1]).split(arg[0]),
        "Fn::Select": lambda self, arg: self.resolve(arg[1])[int(arg[0])],
    }

    def _ref(self, name: str) -> Any:
        if name in self.params:
            return self.params[name]
        if name in PSEUDO:
            return PSEUDO[name]
        assert name in self.doc["Resources"], f"!Ref to nothing: {name}"
        resource = self.doc["Resources"][name]
        if resource["Type"] in REF_IS_NAME:
            # What CloudFormation gives for these: the name the resource was created with.
            return self.resolve(resource["Properties"]["Name"])
        return f"<{name}>"

    def _sub(self, name: str, variables: dict[str, Any]) -> str:
        if name in variables:
            return str(variables[name])
        if "." in name:
            resource, attribute = name.split(".", 1)
            assert resource in self.doc["Resources"], name
            return f"<{resource}.{attribute}>"
        return str(self._ref(name))

    def resources(self) -> dict[str, dict[str, Any]]:
        """The resources this stack creates (their conditions hold), properties resolved."""
        return {
            name: {"Type": r["Type"], **self.resolve({k: v for k, v in r.items() if k != "Type"})}
            for name, r in self.doc["Resources"].items()
            if "Condition" not in r or self.condition(r["Condition"])
        }

    def properties(self, name: str) -> dict[str, Any]:
        return dict(self.resources()[name].get("Properties", {}))

    def function(self, name: str) -> dict[str, Any]:
        """A function's properties with the Globals applied (environment merged, as SAM does)."""
        merged = self.resolve(self.doc["Globals"]["Function"]) | self.properties(name)
        variables = self.resolve(self.doc["Globals"]["Function"]["Environment"]["Variables"])
        variables |= self.properties(name).get("Environment", {}).get("Variables", {})
        merged["Environment"] = {"Variables": {k: str(v) for k, v in variables.items()}}
        return merged

    def functions(self) -> list[str]:
        return [n for n, r in self.resources().items() if r["Type"] == "AWS::Serverless::Function"]


# The settings that are numbers of the template's Mappings, as environment variables.
SHARED_NUMBERS = {
    "MAX_ATTEMPTS": "max_attempts",
    "MAX_RECEIVE_COUNT": "max_receive_count",
    "RETRY_BASE_SECONDS": "retry_base_seconds",
    "STALE_AFTER_SECONDS": "stale_after_seconds",
    "SWEEP_AFTER_SECONDS": "sweep_after_seconds",
    "SWEEP_MAX_BACKLOG": "sweep_max_backlog",
    "MAX_INPUT_PIXELS": "max_input_pixels",
    "MAX_ORIGINAL_BYTES": "max_original_bytes",
    "MAX_INPUT_DIMENSION": "max_input_dimension",
    "MAX_INPUT_ROW_BYTES": "max_input_row_bytes",
    "RENDER_TIMEOUT_SECONDS": "render_timeout_seconds",
    "THUMB_SIZE": "thumb_size",
    "BROWSE_SIZE": "browse_size",
    "WEBP_QUALITY": "webp_quality",
    "WEBP_EFFORT": "webp_effort",
    "AVIF_QUALITY": "avif_quality",
    "AVIF_EFFORT": "avif_effort",
    "BACKFILL_BATCH_SIZE": "backfill_batch_size",
    "BACKFILL_MAX_QUEUE_DEPTH": "backfill_max_queue_depth",
    "BACKFILL_SPREAD_SECONDS": "backfill_spread_seconds",
    "VARIANT_GRACE_SECONDS": "variant_grace_seconds",
    "EVENT_HANDOFF_TIMEOUT_SECONDS": "event_handoff_timeout_seconds",
    "OUTBOX_RETENTION_DAYS": "outbox_retention_days",
}
# Environment the functions get that is not a Settings field: read by Powertools or glibc.
# The defaults Settings falls back on, which the template must agree with.
DEFAULTS = {f.name: f.default for f in dataclasses.fields(Settings)}
NOT_SETTINGS = {"POWERTOOLS_SERVICE_NAME", "POWERTOOLS_METRICS_NAMESPACE", "MALLOC_ARENA_MAX"}
# boto3's own endpoint variables, declared for `sam local` only (SamLocal=true), with DATABASE_URL.
LOCAL_ONLY = {"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_SQS", "DATABASE_URL"}


@pytest.fixture(scope="module")
def stack() -> Stack:
    return Stack()


# --- numbers, timing and prefixes -----------------------------------------------------------------


def test_every_number_the_code_knows_comes_from_the_mappings_with_the_settings_defaults(stack: Stack) -> None:
    globals_env = document()["Globals"]["Function"]["Environment"]["Variables"]
    for variable, setting in SHARED_NUMBERS.items():
        # GIVEN the template's value for it: a lookup in the Mappings, nothing typed twice
        assert "Fn::FindInMap" in globals_env[variable], f"{variable} is not from the Mappings"
        # THEN it is the code's default
        for name in stack.functions():
            value = stack.function(name)["Environment"]["Variables"][variable]
            assert int(value) == DEFAULTS[setting], (name, variable)


def test_what_a_render_may_hold_follows_the_process_functions_memory_which_lambda_passes(
    stack: Stack,
) -> None:
    # GIVEN the process function's memory, a parameter, and the environment the template gives it
    memory = stack.function("ProcessFunction")["MemorySize"]
    variables = stack.function("ProcessFunction")["Environment"]["Variables"]

    # THEN its default is the memory the code assumes where Lambda does not say (a render outside the
    # function, sam local's default), and the template sets no number of its own for the decoders:
    # Lambda passes the memory as AWS_LAMBDA_FUNCTION_MEMORY_SIZE, a variable it reserves
    assert int(memory) == DEFAULTS["aws_lambda_function_memory_size"] == slots.DEFAULT.memory // slots.MIB
    assert "AWS_LAMBDA_FUNCTION_MEMORY_SIZE" not in variables
    assert not {name for name in variables if "DECODE" in name}
    # AND the least memory the parameter allows still holds the default renders at once
    least = int(document()["Parameters"]["ProcessMemorySize"]["MinValue"])
    budget = slots.DecodeBudget.of(
        memory_mb=least, records=DEFAULTS["record_concurrency"], renders=DEFAULTS["render_concurrency"]
    )
    assert budget.slot > 0


# The recipe's parts an operator changes at deploy (SPEC 14, 18): parameters, each a setting.
RECIPE_PARAMETERS = {
    "VariantVersion": "VARIANT_VERSION",
    "VariantWidths": "VARIANT_WIDTHS",
    "VariantFormats": "VARIANT_FORMATS",
}


def test_the_recipe_parameters_default_to_the_settings_defaults_and_allow_only_valid_settings(
    stack: Stack,
) -> None:
    parameters = document()["Parameters"]
    fields = {f"{f.name.upper()}": f.name for f in dataclasses.fields(Settings)}
    deployed = stack.function("ProcessFunction")["Environment"]["Variables"]
    for parameter, variable in RECIPE_PARAMETERS.items():
        # GIVEN the variable every function gets from the parameter
        for name in stack.functions():
            env = stack.function(name)["Environment"]["Variables"]
            # THEN its default is the code's default
            assert getattr(Settings.from_env(env), fields[variable]) == DEFAULTS[fields[variable]], variable
        # ... and each value the parameter allows is one the settings accept
        allowed = parameters[parameter].get("AllowedValues", [])
        for value in allowed:
            Settings.from_env(deployed | {variable: value})
    # the ladder's pattern allows "none" and lists, and refuses what the settings refuse
    pattern = re.compile(parameters["VariantWidths"]["AllowedPattern"])
    for accepted in ("none", "320", "320,640,960,1280", "2048"):
        assert pattern.fullmatch(accepted)
        Settings.from_env(deployed | {"VARIANT_WIDTHS": accepted})
    for refused in ("", "320,", "0,640", "320;640", "abc", " 320"):
        assert not pattern.fullmatch(refused), refused


def test_a_deploy_with_avif_on_gives_every_function_the_same_recipe() -> None:
    # GIVEN the stack deployed with the ladder in both formats under a new version
    stack = Stack(VariantVersion="3", VariantWidths="480,960", VariantFormats="webp,avif")
    # THEN every function (the process function renders it, the operator and the sweep record and
    # backfill to it) reads the same recipe
    recipes = {
        name: (s.variant_version, s.variant_widths, s.variant_formats)
        for name in stack.functions()
        for s in [Settings.from_env(stack.function(name)["Environment"]["Variables"])]
    }
    assert set(recipes.values()) == {(3, (480, 960), ("webp", "avif"))}, recipes


def test_the_redrive_dead_letters_after_max_receive_count(stack: Stack) -> None:
    redrive = stack.properties("ProcessQueue")["RedrivePolicy"]
    assert redrive["deadLetterTargetArn"] == "<DeadLetterQueue.Arn>"
    assert int(redrive["maxReceiveCount"]) == DEFAULTS["max_receive_count"]
    # the DLQ accepts dead letters from the process queue alone
    allow = stack.properties("DeadLetterQueue")["RedriveAllowPolicy"]
    assert allow["redrivePermission"] == "byQueue"
    assert allow["sourceQueueArns"] == [
        f"arn:aws:sqs:{PSEUDO['AWS::Region']}:{PSEUDO['AWS::AccountId']}:{stack.properties('ProcessQueue')['QueueName']}"
    ]


def test_timing_invariant_process_timeout_stale_after_visibility(stack: Stack) -> None:
    timeout = int(stack.function("ProcessFunction")["Timeout"])
    stale = int(stack.function("ProcessFunction")["Environment"]["Variables"]["STALE_AFTER_SECONDS"])
    visibility = int(stack.properties("ProcessQueue")["VisibilityTimeout"])

    assert timeout < stale < visibility
    # a render stopped at its own deadline leaves the invocation time to record the failure
    render = float(stack.function("ProcessFunction")["Environment"]["Variables"]["RENDER_TIMEOUT_SECONDS"])
    assert render + DEFAULTS["commit_budget_seconds"] < timeout
    assert visibility >= 6 * timeout  # AWS's guidance for an SQS event source
    assert stale == DEFAULTS["stale_after_seconds"]
    # the sweep and the relay finish before their next run; the dead letters outlive the queue's messages
    assert int(stack.function("SweepFunction")["Timeout"]) <= 60
    assert int(stack.function("RelayFunction")["Timeout"]) <= 60
    assert int(stack.properties("DeadLetterQueue")["MessageRetentionPeriod"]) > int(
        stack.properties("ProcessQueue")["MessageRetentionPeriod"]
    )


def test_the_queues_are_encrypted_with_sqs_managed_keys(stack: Stack) -> None:
    for queue in ("ProcessQueue", "DeadLetterQueue"):
        properties = stack.properties(queue)
        assert properties["SqsManagedSseEnabled"] is True
        assert "KmsMasterKeyId" not in properties  # S3 cannot send to a queue under alias/aws/sqs


def test_new_originals_notify_the_queue_under_the_settings_originals_prefix(stack: Stack) -> None:
    # GIVEN the stack with its own bucket, for some stage
    stack = Stack(Stage="prod")
    settings = Settings(photo_bucket="b" * 3, stage="prod", database_url="postgresql://x")
    bucket = stack.properties("PhotoBucket")

    # THEN its notification filters on exactly the code's originals prefix, to the queue
    (notification,) = bucket["NotificationConfiguration"]["QueueConfigurations"]
    assert notification["Event"] == "s3:ObjectCreated:*"
    assert notification["Queue"] == "<ProcessQueue.Arn>"
    assert notification["Filter"]["S3Key"]["Rules"] == [
        {"Name": "prefix", "Value": settings.originals_prefix}
    ]
    # and the functions are told the bucket and stage the keys are made with
    for name in stack.functions():
        env = stack.function(name)["Environment"]["Variables"]
        assert env["PHOTO_BUCKET"] == bucket["BucketName"]
        assert env["STAGE"] == "prod"


def test_the_bucket_waits_for_the_queue_policy_built_from_its_explicit_name(stack: Stack) -> None:
    bucket = stack.resources()["PhotoBucket"]
    assert "ProcessQueuePolicy" in bucket["DependsOn"]
    statements = stack.properties("ProcessQueuePolicy")["PolicyDocument"]["Statement"]
    (from_s3,) = [s for s in statements if s.get("Principal") == {"Service": "s3.amazonaws.com"}]
    assert (
        from_s3["Condition"]["ArnLike"]["aws:SourceArn"]
        == f"arn:aws:s3:::{bucket['Properties']['BucketName']}"
    )
    assert from_s3["Condition"]["StringEquals"]["aws:SourceAccount"] == PSEUDO["AWS::AccountId"]
    # no !GetAtt on the bucket anywhere in that policy: it would be a circular dependency
    assert "PhotoBucket" not in str(statements)


def test_an_existing_bucket_is_wired_through_eventbridge_instead() -> None:
    # GIVEN the stack on an existing bucket
    stack = Stack(ExistingBucketName="their-photos", Stage="dev")
    resources = stack.resources()

    # THEN no bucket nor notification is created...
    assert not {"PhotoBucket", "PhotoBucketPolicy", "AccessLogBucket"} & set(resources)
    # ...an EventBridge rule sends "Object Created" under the originals prefix to the queue...
    rule = stack.properties("OriginalsCreatedRule")
    prefix = Settings(
        photo_bucket="their-photos", stage="dev", database_url="postgresql://x"
    ).originals_prefix
    assert rule["EventPattern"] == {
        "source": ["aws.s3"],
        "detail-type": ["Object Created"],
        "detail": {"bucket": {"name": ["their-photos"]}, "object": {"key": [{"prefix": prefix}]}},
    }
    assert [t["Arn"] for t in rule["Targets"]] == ["<ProcessQueue.Arn>"]
    # ...the queue lets EventBridge send from that rule only...
    statements = stack.properties("ProcessQueuePolicy")["PolicyDocument"]["Statement"]
    allowed = [s for s in statements if s["Effect"] == "Allow"]
    assert allowed == [
        {
            "Sid": "OriginalsCreatedByEventBridge",
            "Effect": "Allow",
            "Principal": {"Service": "events.amazonaws.com"},
            "Action": "sqs:SendMessage",
            "Resource": "<ProcessQueue.Arn>",
            "Condition": {"ArnEquals": {"aws:SourceArn": "<OriginalsCreatedRule.Arn>"}},
        }
    ]
    # ...and the functions and their permissions name the existing bucket
    assert stack.function("ProcessFunction")["Environment"]["Variables"]["PHOTO_BUCKET"] == "their-photos"
    assert "arn:aws:s3:::their-photos/dev/originals/*" in str(stack.properties("ProcessRole"))


# --- environment and handlers ---------------------------------------------------------------------


@pytest.mark.parametrize("proxy", ["true", "false"])
def test_the_environment_is_settings_fields_and_validates_as_settings(proxy: str) -> None:
    stack = Stack(DbHostIsRdsProxy=proxy)
    fields = {f.name.upper() for f in dataclasses.fields(Settings)}
    for name in stack.functions():
        env = stack.function(name)["Environment"]["Variables"]
        # every variable is a Settings field, or one that Powertools or glibc reads
        assert set(env) - fields <= NOT_SETTINGS, (
            f"{name}: unknown variables {set(env) - fields - NOT_SETTINGS}"
        )
        # in AWS: no endpoint override, no database URL (those exist for `sam local` alone)
        assert not LOCAL_ONLY & set(env)
        assert set(Stack(SamLocal="true").function(name)["Environment"]["Variables"]) >= LOCAL_ONLY
        # every required field is set, and the whole environment is valid Settings
        required = {f.name.upper() for f in dataclasses.fields(Settings) if f.default is dataclasses.MISSING}
        assert required <= set(env)
        settings = Settings.from_env(env)
        # the owner's secret is the migrate function's; the others log in as the runtime role
        assert settings.db_secret_arn == (
            REQUIRED["DbSecretArn"] if name == "MigrateFunction" else "<DbRuntimeSecret>"
        )
        assert settings.db_host == REQUIRED["DbHost"]
        assert settings.db_prepare_statements is (proxy == "false")  # off behind RDS Proxy
        # RDS Proxy refuses startup options ("doesn't support command-line options"): each
        # transaction sets the timeouts instead
        assert settings.db_session_options is (proxy == "false")
        assert settings.database_url is None  # in AWS: from the secret
        assert (settings.db_sslmode, settings.db_sslrootcert) == ("require", None)


def test_by_default_the_functions_connect_to_a_proxy_and_to_a_database_alike() -> None:
    # GIVEN the template deployed without DbHostIsRdsProxy
    for name in Stack().functions():
        settings = Settings.from_env(Stack().function(name)["Environment"]["Variables"])
        # THEN no startup options (which RDS Proxy refuses) and no prepared statements (which pin):
        # the timeouts come per transaction, which a direct database honours too
        assert (settings.db_session_options, settings.db_prepare_statements) == (False, False)


def test_a_ca_bundle_makes_the_functions_verify_the_database_server() -> None:
    stack = Stack(DbCaBundlePath="/opt/rds/global-bundle.pem")
    for name in stack.functions():
        settings = Settings.from_env(stack.function(name)["Environment"]["Variables"])
        assert (settings.db_sslmode, settings.db_sslrootcert) == ("verify-full", "/opt/rds/global-bundle.pem")


def test_the_attempts_fit_within_the_redrives_receive_count(stack: Stack) -> None:
    # a message at the redrive's count is dead-lettered by the queue: every attempt must come first
    jobs = document()["Mappings"]["Settings"]["Jobs"]
    assert jobs["MaxAttempts"] <= jobs["MaxReceiveCount"]


@pytest.mark.parametrize("name", ["ProcessFunction", "SweepFunction", "RelayFunction", "MigrateFunction"])
def test_each_handler_exists_and_exports_lambda_handler_on_python312(stack: Stack, name: str) -> None:
    function = stack.function(name)
    module, handler = function["Handler"].rsplit(".", 1)
    source = ROOT / function["CodeUri"] / f"{module}.py"
    tree = ast.parse(source.read_text())
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert handler == "lambda_handler" and handler in defined
    assert function["Runtime"] == "python3.12"
    assert function["Architectures"] == ["arm64"]
    # photo_publish and, through it, pyvips: both layers, of the function's architecture
    assert function["Layers"] == ["<SharedLayer>", "<VipsLayerArm64>"]
    assert Stack(Architecture="x86_64").function(name)["Layers"] == ["<SharedLayer>", "<VipsLayerX8664>"]


def test_one_vips_layer_per_architecture_each_built_by_its_own_make_target() -> None:
    makefile = (ROOT / "layers" / "vips" / "Makefile").read_text()
    for architecture, layer in (("arm64", "VipsLayerArm64"), ("x86_64", "VipsLayerX8664")):
        resources = Stack(Architecture=architecture).resources()
        (other,) = {"VipsLayerArm64", "VipsLayerX8664"} - {layer}
        assert layer in resources and other not in resources
        assert resources[layer]["Properties"]["CompatibleArchitectures"] == [architecture]
        assert resources[layer]["Metadata"]["BuildMethod"] == "makefile"
        assert f"build-{layer}:" in makefile
    shared = Stack().resources()["SharedLayer"]
    assert shared["Metadata"]["BuildMethod"] == "makefile"
    assert "build-SharedLayer:" in (ROOT / "shared" / "Makefile").read_text()


def test_the_process_event_source_reports_each_record_and_bounds_concurrency(stack: Stack) -> None:
    (event,) = stack.function("ProcessFunction")["Events"].values()
    assert event["Type"] == "SQS"
    properties = event["Properties"]
    assert properties["Queue"] == "<ProcessQueue.Arn>"
    assert properties["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert int(properties["ScalingConfig"]["MaximumConcurrency"]) >= 2
    assert 1 <= int(properties["BatchSize"]) <= 10
    assert "ReservedConcurrentExecutions" not in stack.function("ProcessFunction")
    for scheduled in ("SweepFunction", "RelayFunction"):
        (schedule,) = stack.function(scheduled)["Events"].values()
        assert schedule["Properties"]["Schedule"] == "rate(1 minute)"
        # a failed run is not retried: the next one is a minute away
        assert stack.function(scheduled)["EventInvokeConfig"]["MaximumRetryAttempts"] == 0


@pytest.mark.parametrize(("value", "snapshot"), [("false", None), ("true", {"ApplyOn": "PublishedVersions"})])
def test_snapstart_is_a_parameter_of_the_process_function_off_by_default(
    value: str, snapshot: dict[str, str] | None
) -> None:
    # GIVEN the stack with ProcessSnapStart left at its default, or turned on
    stack = Stack(ProcessSnapStart=value) if value == "true" else Stack()
    assert document()["Parameters"]["ProcessSnapStart"]["Default"] == "false"

    # THEN only the process function snapshots, and only when asked; its queue invokes its alias
    # (SnapStart applies to published versions, not to $LATEST)
    process = stack.function("ProcessFunction")
    assert process.get("SnapStart") == snapshot
    assert process["AutoPublishAlias"] == "live"
    assert not any("SnapStart" in stack.function(name) for name in ("SweepFunction", "RelayFunction"))


# --- the events' bus (SPEC 12) --------------------------------------------------------------------


@pytest.mark.parametrize("stage", ["dev", "prod"])
def test_the_bus_is_the_stages_own_with_an_archive_and_the_functions_are_told_its_name(stage: str) -> None:
    stack = Stack(Stage=stage)
    bus = stack.properties("EventBus")
    assert bus["Name"] == f"photo-publish-{stage}"
    archive = stack.properties("EventArchive")
    assert archive["SourceArn"] == "<EventBus.Arn>"
    assert "EventPattern" not in archive  # every event, for replays
    assert int(archive["RetentionDays"]) >= 7
    # the hand-off and the relay put their events on that bus, and validate it as Settings
    for name in ("ProcessFunction", "RelayFunction"):
        env = stack.function(name)["Environment"]["Variables"]
        assert Settings.from_env(env).event_bus_name == bus["Name"]
    outputs = {name: stack.resolve(o["Value"]) for name, o in document()["Outputs"].items()}
    assert (outputs["EventBusName"], outputs["EventBusArn"]) == (bus["Name"], "<EventBus.Arn>")


def test_every_put_events_grant_is_for_the_relays_source_on_the_stacks_bus(stack: Stack) -> None:
    from photo_publish.outbox.relay import SOURCE

    for role in ("ProcessRole", "RelayRole", "SweepRole"):
        for policy in stack.properties(role)["Policies"]:
            for statement in policy["PolicyDocument"]["Statement"]:
                if "events:PutEvents" in str(statement["Action"]):
                    assert statement["Resource"] == "<EventBus.Arn>"
                    assert statement["Condition"] == {"StringEquals": {"events:source": SOURCE}}


def test_with_endpoints_the_functions_reach_eventbridge_from_private_subnets() -> None:
    stack = Stack(
        SubnetIds="subnet-1,subnet-2", SecurityGroupIds="sg-1", CreateVpcEndpoints="true", VpcId="vpc-1"
    )
    endpoints = {
        r["Properties"]["ServiceName"].rsplit(".", 1)[-1]
        for r in stack.resources().values()
        if r["Type"] == "AWS::EC2::VPCEndpoint"
    }
    assert endpoints == {"s3", "sqs", "secretsmanager", "events"}


# --- IAM: exactly what the code calls -------------------------------------------------------------

# boto3 client methods -> the IAM action each needs.
AWS_CALLS = {
    "get_object": "s3:GetObject",
    "head_object": "s3:GetObject",
    "download_fileobj": "s3:GetObject",
    "put_object": "s3:PutObject",
    "upload_fileobj": "s3:PutObject",
    "copy_object": "s3:PutObject",
    "delete_object": "s3:DeleteObject",
    "delete_objects": "s3:DeleteObject",
    "list_objects_v2": "s3:ListBucket",
    "list_objects": "s3:ListBucket",
    "head_bucket": "s3:ListBucket",
    "send_message": "sqs:SendMessage",
    "send_message_batch": "sqs:SendMessage",
    "receive_message": "sqs:ReceiveMessage",
    "delete_message": "sqs:DeleteMessage",
    "delete_message_batch": "sqs:DeleteMessage",
    "change_message_visibility": "sqs:ChangeMessageVisibility",
    "change_message_visibility_batch": "sqs:ChangeMessageVisibility",
    "get_queue_attributes": "sqs:GetQueueAttributes",
    "get_queue_url": "sqs:GetQueueUrl",
    "purge_queue": "sqs:PurgeQueue",
    "start_message_move_task": "sqs:StartMessageMoveTask",
    "list_message_move_tasks": "sqs:ListMessageMoveTasks",
    "cancel_message_move_task": "sqs:CancelMessageMoveTask",
    "get_secret_value": "secretsmanager:GetSecretValue",
    "put_events": "events:PutEvents",
    "create_invalidation": "cloudfront:CreateInvalidation",
}
# What each call touches, named as the template's statements resolve: S3 keys by the key layout,
# SQS by the queue URL the call passes, the secret by its ARN.
S3_OBJECTS = {
    "s3:GetObject": "originals",
    "s3:PutObject": "variants",
    "s3:DeleteObject": "variants",
    "s3:ListBucket": "bucket",
}
# Definitions whose objects or actions are not the layout's default for their calls: a deleted
# photo's purge removes its originals too; a registration signs (never sends) a POST of an original,
# which S3 authorizes as the signer; an original read pinned to the version its event names is a
# GetObject with VersionId, which S3 authorizes as GetObjectVersion.
REACHES = {
    ("photo_publish.adapters.storage", "S3Store", "delete_under"): {("s3:DeleteObject", "originals")},
    ("photo_publish.adapters.storage", "S3Store", "open_original"): {("s3:GetObjectVersion", "originals")},
    ("photo_publish.uploads", None, "register"): {("s3:PutObject", "originals")},
}
SIGNING = {"generate_presigned_post"}
# Granted for the code's calls without being calls: a missing original is a 404 only with
# ListBucket on its prefix, and a secret under a customer key needs that key.
IMPLIED = {"s3:GetObject": {"s3:ListBucket"}, "secretsmanager:GetSecretValue": {"kms:Decrypt"}}
# Lambda's SQS poller works with the process function's role.
EVENT_SOURCE = {
    ("sqs:ReceiveMessage", "ProcessQueue"),
    ("sqs:DeleteMessage", "ProcessQueue"),
    ("sqs:GetQueueAttributes", "ProcessQueue"),
}


@dataclass
class Definition:
    module: str
    owner: str | None  # the class, for a method
    node: ast.FunctionDef | ast.AsyncFunctionDef
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)


def _modules() -> dict[str, ast.Module]:
    modules = {_module_name(p): ast.parse(p.read_text()) for p in PACKAGE.rglob("*.py")}
    for function in ("process", "sweep", "relay", "upload", "migrate"):
        modules[f"{function}.app"] = ast.parse((ROOT / "functions" / function / "app.py").read_text())
    return modules


def _definitions() -> dict[tuple[str, str | None, str], Definition]:
    """Every function and method of the package and the handlers, with its module's imports."""
    found: dict[tuple[str, str | None, str], Definition] = {}
    for module, tree in _modules().items():
        imports: dict[str, tuple[str, str | None]] = {}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("photo_publish"):
                for alias in node.names:
                    target = f"{node.module}.{alias.name}"
                    # `from photo_publish import bootstrap` is a module; `from x import Y` a name
                    imports[alias.asname or alias.name] = (
                        (target, None) if target in _module_names() else (node.module, alias.name)
                    )
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found[(module, None, node.name)] = Definition(module, None, node, imports)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        found[(module, node.name, item.name)] = Definition(module, node.name, item, imports)
    return found


@cache
def _module_names() -> frozenset[str]:
    return frozenset(_module_name(p) for p in PACKAGE.rglob("*.py"))


def _module_name(path: Path) -> str:
    """photo_publish.jobs.sweep for shared/photo_publish/jobs/sweep.py (a package by its __init__)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _callees(
    definition: Definition, index: dict[tuple[str, str | None, str], Definition]
) -> Iterator[tuple[str, str | None, str]]:
    """What a definition may run: by name, as precisely as names allow (a method by its name)."""
    for node in ast.walk(definition.node):
        if isinstance(node, ast.Name):
            yield from _named(definition, node.id, index)
        elif isinstance(node, ast.Attribute):
            yield from _attribute(definition, node, index)


def _named(
    definition: Definition, name: str, index: dict[tuple[str, str | None, str], Definition]
) -> Iterator[tuple[str, str | None, str]]:
    if (definition.module, None, name) in index:
        yield (definition.module, None, name)
    elif name in definition.imports:
        module, imported = definition.imports[name]
        if imported is not None:
            yield (module, None, imported)
            yield (module, imported, "__init__")  # a class named: its construction
    else:
        yield (definition.module, name, "__init__")  # a class of the same module


def _attribute(
    definition: Definition, node: ast.Attribute, index: dict[tuple[str, str | None, str], Definition]
) -> Iterator[tuple[str, str | None, str]]:
    owner = node.value.id if isinstance(node.value, ast.Name) else None
    if owner in definition.imports and definition.imports[owner][1] is None:
        yield (definition.imports[owner][0], None, node.attr)  # module.function
    elif owner == "self" and (definition.module, definition.owner, node.attr) in index:
        yield (definition.module, definition.owner, node.attr)
    else:
        yield from (key for key in index if key[2] == node.attr)  # obj.method(): any of that name


def _aws_calls(definition: Definition) -> Iterator[tuple[str, str]]:
    """(IAM action, what it touches) for each boto3 client call in a definition."""
    for node in ast.walk(definition.node):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        method, receiver = node.func.attr, ast.unparse(node.func.value)
        if ("client" not in receiver and receiver not in ("sqs", "s3")) or method in SIGNING:
            continue
        assert method in AWS_CALLS, (
            f"{definition.module}: unknown AWS call {receiver}.{method}: add it to AWS_CALLS"
        )
        action = AWS_CALLS[method]
        if action.startswith("s3:"):
            yield action, S3_OBJECTS[action]
        elif action.startswith("sqs:"):
            (queue,) = [ast.unparse(k.value) for k in node.keywords if k.arg in ("QueueUrl", "SourceArn")]
            yield action, "DeadLetterQueue" if "dead" in queue else "ProcessQueue"
        elif action.startswith("events:"):
            yield action, "EventBus"  # the bus of EVENT_BUS_NAME, the stack's
        elif action.startswith("cloudfront:"):
            yield action, "VariantDistribution"  # the distribution of CDN_DISTRIBUTION_ID, the stack's
        else:
            yield action, "DbSecret"


def code_calls(function: str) -> set[tuple[str, str]]:
    """The AWS calls a handler can reach, through the package, with what each one touches."""
    index = _definitions()
    # The handler, and each route of an API function (reached through its resolver, not a call).
    todo = [(f"{function}.app", None, "lambda_handler")] + [
        key
        for key, definition in index.items()
        if key[0] == f"{function}.app"
        and any(
            isinstance(d, ast.Call)
            and isinstance(d.func, ast.Attribute)
            and ast.unparse(d.func.value) == "app"
            for d in definition.node.decorator_list
        )
    ]
    seen: set[tuple[str, str | None, str]] = set()
    calls: set[tuple[str, str]] = set()
    while todo:
        key = todo.pop()
        if key in seen or key not in index:
            continue
        seen.add(key)
        calls |= set(_aws_calls(index[key])) | REACHES.get(key, set())
        todo.extend(_callees(index[key], index))
    return calls


def role_grants(stack: Stack, role: str) -> set[tuple[str, str]]:
    """(action, what it touches) for each statement of a role's own inline policy (the code's calls;
    the `runtime` policy is what Lambda itself does with the role)."""
    bucket = stack.function("ProcessFunction")["Environment"]["Variables"]["PHOTO_BUCKET"]
    stage = stack.params["Stage"]
    names = {
        f"arn:aws:s3:::{bucket}/{stage}/originals/*": "originals",
        f"arn:aws:s3:::{bucket}": "bucket",
        f"arn:aws:s3:::{bucket}/{stage}/albums/*": "variants",
        "<ProcessQueue.Arn>": "ProcessQueue",
        "<DeadLetterQueue.Arn>": "DeadLetterQueue",
        "<EventBus.Arn>": "EventBus",
        "arn:aws:cloudfront::123456789012:distribution/<VariantDistribution>": "VariantDistribution",
        REQUIRED["DbSecretArn"]: "OwnerSecret",
        stack.function("ProcessFunction")["Environment"]["Variables"]["DB_SECRET_ARN"]: "RuntimeSecret",
        stack.params["DbSecretKmsKeyArn"]: "DbSecretKey",
        "<StackKey.Arn>": "RuntimeSecretKey",
    }
    grants = set()
    (policy,) = [p for p in stack.properties(role)["Policies"] if p["PolicyName"] != "runtime"]
    for statement in policy["PolicyDocument"]["Statement"]:
        assert statement["Effect"] == "Allow"
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        resources = (
            statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        )
        grants |= {(a, names[r]) for a in actions for r in resources}
    return grants


def test_the_operator_commands_are_not_what_the_functions_reach() -> None:
    # the people-run commands call what no function may: they must not leak into the roles' needs
    operator = set().union(
        *(set(_aws_calls(d)) for d in _definitions().values() if d.module.endswith("operator"))
    )
    assert ("sqs:StartMessageMoveTask", "DeadLetterQueue") in operator
    for function in ("process", "sweep", "relay", "upload"):
        reached = code_calls(function)
        assert "sqs:StartMessageMoveTask" not in {a for a, _ in reached}
        # Only the sweep reads a queue: the dead-letter queue, from which it removes the letters of
        # deleted photos (SPEC 19); the process queue is read by Lambda's poller alone.
        receives = {queue for a, queue in reached if a == "sqs:ReceiveMessage"}
        assert receives == ({"DeadLetterQueue"} if function == "sweep" else set())


@pytest.mark.parametrize(
    "key_arn", ["", "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"]
)
@pytest.mark.parametrize(
    ("function", "role"),
    [
        ("process", "ProcessRole"),
        ("sweep", "SweepRole"),
        ("relay", "RelayRole"),
        ("upload", "UploadRole"),
        ("migrate", "MigrateRole"),
    ],
)
def test_each_role_grants_exactly_the_aws_calls_its_code_makes(
    function: str, role: str, key_arn: str
) -> None:
    # GIVEN the calls the handler can reach, found in the source
    stack = Stack(DbSecretKmsKeyArn=key_arn)
    calls = code_calls(function)
    assert calls, "no AWS call found: the scan is broken"

    # WHEN the role's statements are read
    grants = role_grants(stack, role)

    # THEN they are those calls, what the calls imply, and (process) the SQS poller's: no more.
    # A secret read is the runtime role's; the migrate function's are the owner's and the runtime's.
    secrets = {"OwnerSecret", "RuntimeSecret"} if function == "migrate" else {"RuntimeSecret"}
    calls = {c for c in calls if c[1] != "DbSecret"} | {
        (a, secret) for a, what in calls if what == "DbSecret" for secret in secrets
    }
    implied = {(i, "bucket") for a, _ in calls for i in IMPLIED.get(a, ()) if i.startswith("s3:")}
    if any(a == "secretsmanager:GetSecretValue" for a, _ in calls):
        # the generated runtime secret is under the stack's key; given secrets under DbSecretKmsKeyArn
        implied |= {("kms:Decrypt", "RuntimeSecretKey")} | (
            {("kms:Decrypt", "DbSecretKey")} if key_arn else set()
        )
    poller = EVENT_SOURCE if function == "process" else set()
    assert grants == calls | implied | poller
    if function == "sweep":
        # the sweep reads no photo and writes none (it deletes replaced variants and deleted
        # photos' objects, and invalidates their CDN paths), and puts nothing on the bus
        assert {g for g in grants if g[0].startswith(("s3:", "events:"))} == {
            ("s3:DeleteObject", "variants"),
            ("s3:DeleteObject", "originals"),
            ("s3:ListBucket", "bucket"),
        }
    if function == "upload":
        # signing originals' uploads, deleting photos (objects and CDN copies), the secret: no
        # queue, no bus, no reading
        assert {a for a, _ in grants} == {
            "s3:PutObject",
            "s3:DeleteObject",
            "s3:ListBucket",
            "cloudfront:CreateInvalidation",
            "secretsmanager:GetSecretValue",
            "kms:Decrypt",
        }
    if function == "relay":
        assert {a for a, _ in grants} == {"events:PutEvents", "secretsmanager:GetSecretValue", "kms:Decrypt"}
    if function == "migrate":
        # the two secrets and their keys: no bucket, no queue, no bus
        assert {a for a, _ in grants} == {"secretsmanager:GetSecretValue", "kms:Decrypt"}
    if function == "process":
        assert ("events:PutEvents", "EventBus") in grants  # the hand-off after a commit


def test_the_roles_object_prefixes_are_the_key_layout_of_the_code(stack: Stack) -> None:
    (policy,) = [p for p in stack.properties("ProcessRole")["Policies"] if p["PolicyName"] == "process"]
    statements = {s["Sid"]: s for s in policy["PolicyDocument"]["Statement"]}
    bucket = stack.function("ProcessFunction")["Environment"]["Variables"]["PHOTO_BUCKET"]
    album, photo = uuid4(), uuid4()
    original = f"arn:aws:s3:::{bucket}/" + original_key("dev", album, photo, "My photo.jpg")
    variant = f"arn:aws:s3:::{bucket}/" + variant_key(
        "dev", album, photo, version=1, kind="thumb", ext="webp"
    )
    assert fnmatch.fnmatchcase(original, statements["ReadOriginals"]["Resource"])
    assert fnmatch.fnmatchcase(variant, statements["WriteVariants"]["Resource"])
    assert not fnmatch.fnmatchcase(variant, statements["ReadOriginals"]["Resource"])
    assert not fnmatch.fnmatchcase(original, statements["WriteVariants"]["Resource"])
    # A missing original must be a 404 (permanent), not a 403 (transient: three attempts and a
    # page): S3 answers 404 only to a caller allowed s3:ListBucket, checked with no s3:prefix.
    listing = statements["MissingOriginalIs404"]
    assert listing["Action"] == "s3:ListBucket"
    assert listing["Resource"] == f"arn:aws:s3:::{bucket}"
    assert "Condition" not in listing


def test_the_roles_that_list_the_bucket_list_only_a_photos_prefixes() -> None:
    """Issue 22 item 4, least privilege: the upload and sweep functions list the bucket only to find
    a deleted photo's objects, so their s3:ListBucket is held to the originals' and variants' keys
    (the process function's, for a missing original's 404, has no prefix to hold it to)."""
    resources = yaml.load(Path("template.yaml").read_text(), Loader=CfnLoader)["Resources"]
    listing = {}
    for name in ("UploadRole", "SweepRole"):
        for policy in resources[name]["Properties"]["Policies"]:
            for statement in policy["PolicyDocument"]["Statement"]:
                if isinstance(statement, dict) and statement.get("Action") == "s3:ListBucket":
                    listing[name] = statement.get("Condition", {}).get("StringLike", {}).get("s3:prefix")
    assert set(listing) == {"UploadRole", "SweepRole"}
    assert all(prefixes is not None and len(prefixes) == 2 for prefixes in listing.values()), listing


@pytest.mark.parametrize("subnets", ["", "subnet-1,subnet-2"])
@pytest.mark.parametrize(
    ("role", "group"),
    [
        ("ProcessRole", "ProcessLogGroup"),
        ("SweepRole", "SweepLogGroup"),
        ("RelayRole", "RelayLogGroup"),
        ("UploadRole", "UploadLogGroup"),
        ("MigrateRole", "MigrateLogGroup"),
    ],
)
def test_each_role_writes_logs_to_its_own_log_group_only(role: str, group: str, subnets: str) -> None:
    stack = Stack(SubnetIds=subnets, SecurityGroupIds="sg-1" if subnets else "")
    properties = stack.properties(role)
    # no AWS-managed execution policy: those grant the logs actions on every log group
    assert [str(arn).rsplit("/", 1)[-1] for arn in properties["ManagedPolicyArns"]] == [
        "AWSXRayDaemonWriteAccess"
    ]
    (runtime,) = [p for p in properties["Policies"] if p["PolicyName"] == "runtime"]
    statements = {s["Sid"]: s for s in runtime["PolicyDocument"]["Statement"]}
    assert statements["OwnLogGroup"]["Resource"] == f"<{group}.Arn>"
    assert set(statements["OwnLogGroup"]["Action"]) == {"logs:CreateLogStream", "logs:PutLogEvents"}
    # the network interfaces only where the function runs in the VPC
    assert ("NetworkInterfaces" in statements) == bool(subnets)


def test_cloudwatch_may_use_the_key_only_for_this_stacks_alarms(stack: Stack) -> None:
    # Without the source conditions any account's alarm could use the key through CloudWatch
    # (the confused deputy).
    policy = stack.properties("StackKey")["KeyPolicy"]
    (alarms,) = [s for s in policy["Statement"] if s["Principal"] == {"Service": "cloudwatch.amazonaws.com"}]
    assert alarms["Condition"]["StringEquals"] == {"aws:SourceAccount": PSEUDO["AWS::AccountId"]}
    source = alarms["Condition"]["ArnLike"]["aws:SourceArn"]
    account = PSEUDO["AWS::AccountId"]
    assert fnmatch.fnmatchcase(
        f"arn:aws:cloudwatch:{PSEUDO['AWS::Region']}:{account}:alarm:photo-publish-dev-dlq", source
    )
    assert not fnmatch.fnmatchcase(
        f"arn:aws:cloudwatch:{PSEUDO['AWS::Region']}:999999999999:alarm:photo-publish-dev-dlq", source
    )


# --- alarms and outputs ---------------------------------------------------------------------------


def test_the_alarms_watch_dead_letters_queue_age_errors_and_throttles(stack: Stack) -> None:
    alarms = {
        (p["Namespace"], p["MetricName"], p["Dimensions"][0]["Value"]): p
        for name, r in stack.resources().items()
        if r["Type"] == "AWS::CloudWatch::Alarm"
        for p in [r["Properties"]]
    }
    dead_letters = alarms[("AWS/SQS", "ApproximateNumberOfMessagesVisible", "<DeadLetterQueue.QueueName>")]
    assert (dead_letters["Threshold"], dead_letters["ComparisonOperator"]) == (0, "GreaterThanThreshold")
    assert ("AWS/SQS", "ApproximateAgeOfOldestMessage", "<ProcessQueue.QueueName>") in alarms
    assert ("AWS/Lambda", "Errors", "<ProcessFunction>") in alarms
    assert ("AWS/Lambda", "Throttles", "<ProcessFunction>") in alarms
    assert ("AWS/Lambda", "Errors", "<RelayFunction>") in alarms
    for alarm in alarms.values():
        assert alarm["AlarmActions"] == ["<AlarmTopic>"]
        assert alarm["AlarmDescription"]
    # CloudWatch cannot publish to a topic under the AWS-managed alias/aws/sns key
    assert stack.properties("AlarmTopic")["KmsMasterKeyId"] == "<StackKey>"


def test_every_dead_letter_sent_pages_even_while_earlier_ones_wait(stack: Stack) -> None:
    # The depth alarm fires on empty -> non-empty only: a second final failure while the first
    # letter waits unread would notify nobody (SPEC 5, amended). A count of the letters sent each
    # minute goes back to OK a quiet minute later, and so pages again at the next letter.
    (sent,) = [
        r["Properties"]
        for r in stack.resources().values()
        if r["Type"] == "AWS::CloudWatch::Alarm" and r["Properties"]["MetricName"] == "NumberOfMessagesSent"
    ]
    assert sent["Dimensions"] == [{"Name": "QueueName", "Value": "<DeadLetterQueue.QueueName>"}]
    assert (sent["Statistic"], sent["Threshold"], sent["ComparisonOperator"]) == (
        "Sum",
        1,
        "GreaterThanOrEqualToThreshold",
    )
    assert sent["Period"] * sent["EvaluationPeriods"] <= 300  # within minutes
    assert sent["TreatMissingData"] == "notBreaching"
    assert sent["AlarmActions"] == ["<AlarmTopic>"]


def test_the_sweeps_row_errors_alarm_reads_the_count_the_sweep_emits(stack: Stack) -> None:
    sweep = (ROOT / "functions" / "sweep" / "app.py").read_text()
    env = stack.function("SweepFunction")["Environment"]["Variables"]
    (alarm,) = [
        r["Properties"]
        for r in stack.resources().values()
        if r["Type"] == "AWS::CloudWatch::Alarm" and r["Properties"]["MetricName"] == "Sweep_errors"
    ]
    assert '"errors"' in sweep and 'add_dimension(name="stage"' in sweep
    assert alarm["Namespace"] == env["POWERTOOLS_METRICS_NAMESPACE"]
    assert alarm["Dimensions"] == [
        {"Name": "service", "Value": env["POWERTOOLS_SERVICE_NAME"]},
        {"Name": "stage", "Value": stack.params["Stage"]},
    ]
    assert (alarm["Statistic"], alarm["Threshold"]) == ("Sum", 1)


def test_the_outbox_alarm_reads_the_metric_the_relay_emits(stack: Stack) -> None:
    # GIVEN the metric the relay's handler emits, under the namespace and service the template sets
    relay = handlers.load("relay")
    env = stack.function("RelayFunction")["Environment"]["Variables"]
    (alarm,) = [
        r["Properties"]
        for r in stack.resources().values()
        if r["Type"] == "AWS::CloudWatch::Alarm" and r["Properties"]["MetricName"] == relay.OLDEST_UNPUBLISHED
    ]

    # THEN the alarm reads that metric, with the dimensions the handler gives it (its stage's)
    assert alarm["Namespace"] == env["POWERTOOLS_METRICS_NAMESPACE"]
    assert alarm["Dimensions"] == [
        {"Name": "service", "Value": env["POWERTOOLS_SERVICE_NAME"]},
        {"Name": "stage", "Value": stack.params["Stage"]},
    ]
    # and it waits longer than a relay run or two, and pages when the relay stops reporting
    assert int(alarm["Threshold"]) >= 2 * 60
    assert alarm["Statistic"] == "Maximum" and alarm["TreatMissingData"] == "breaching"
    assert alarm["AlarmActions"] == ["<AlarmTopic>"]


def test_every_output_and_parameter_is_described(stack: Stack) -> None:
    doc = document()
    assert all(o.get("Description") for o in doc["Outputs"].values())
    assert all(p.get("Description") for p in doc["Parameters"].values())


# --- the layers' packages --------------------------------------------------------------------------


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for text in path.read_text().splitlines():
        line = text.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            (specifier,) = requirement.specifier
            assert specifier.operator == "==", f"{path.name}: {line} is not pinned"
            pins[re.sub(r"[-_.]+", "-", requirement.name).lower()] = specifier.version
    return pins


def test_the_vips_layer_pins_every_runtime_requirement_of_the_project() -> None:
    layer = ROOT / "layers" / "vips"
    locked = _pins(layer / "requirements.txt")
    # the lock holds every direct pin at the same version (`make -C layers/vips lock` after a change)
    for name, version in _pins(layer / "requirements.in").items():
        assert locked.get(name) == version, (
            f"requirements.txt is stale for {name}: run make -C layers/vips lock"
        )
    assert "pi-heif" in locked  # HEIC decoding
    # the project's runtime requirements are in the layer at versions they accept (boto3: the runtime's)
    for text in (ROOT / "requirements.txt").read_text().splitlines():
        line = text.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        if name == "boto3":
            assert name not in locked
            continue
        assert name in locked, f"{name} (requirements.txt) is not in the vips layer"
        assert requirement.specifier.contains(locked[name]), f"{name}=={locked[name]} is not {requirement}"


def test_checkov_skips_each_carry_their_reason() -> None:
    config = ROOT / ".checkov.yaml"
    lines = config.read_text().splitlines()
    skips = yaml.safe_load(config.read_text())["skip-check"]
    assert set(skips) == {"CKV_AWS_27", "CKV_AWS_116", "CKV_AWS_115", "CKV_AWS_173"}
    for skip in skips:
        index = next(i for i, line in enumerate(lines) if line.strip() == f"- {skip}")
        reason = []
        for line in reversed(lines[:index]):
            if not line.strip().startswith("#"):
                break
            reason.append(line)
        assert len(" ".join(reason)) > 80, f"{skip} has no reason beside it"
    for name, resource in document()["Resources"].items():
        for skip in resource.get("Metadata", {}).get("checkov", {}).get("skip", []):
            assert len(skip.get("comment", "")) > 20, f"{name}: {skip['id']} has no reason"


# --- sam local: env/local.json, events/, docker-compose.yml ------------------------------------

LOCAL_ENV = ROOT / "env" / "local.json"
EVENTS = ROOT / "events"
SAM_LOCAL_ENVIRONMENT = """
import json, sys
from samcli.commands.local.lib.local_lambda import LocalLambdaRunner
from samcli.lib.providers.sam_function_provider import SamFunctionProvider
from samcli.lib.providers.sam_stack_provider import SamLocalStackProvider

template, overrides, env_vars = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
stacks, _ = SamLocalStackProvider.get_stacks(template, parameter_overrides=overrides)
provider = SamFunctionProvider(stacks)
runner = LocalLambdaRunner(None, provider, ".", ".", aws_region="us-east-1", env_vars_values=json.load(open(env_vars)))
print(json.dumps({
    name: {
        "env": runner._make_env_vars(provider.get(name)).resolve(),
        "layers": [layer.name for layer in provider.get(name).layers],
        "architectures": provider.get(name).architectures,
    }
    for name in ("ProcessFunction", "SweepFunction")
}))
"""


def local_env() -> dict[str, str]:
    variables: dict[str, str] = json.loads(LOCAL_ENV.read_text())["Parameters"]
    return variables


def local_invoke_config() -> dict[str, Any]:
    config: dict[str, Any] = tomllib.loads((ROOT / "samconfig.toml").read_text())["default"]["local_invoke"][
        "parameters"
    ]
    return config


def test_sam_local_gives_the_functions_what_env_local_json_says() -> None:
    # GIVEN `sam local invoke`'s configuration (samconfig.toml) and its env file
    config = local_invoke_config()
    assert config["env_vars"] == "env/local.json"
    overrides = dict(item.split("=", 1) for item in config["parameter_overrides"].split())

    # WHEN SAM CLI's own code works out each function's environment, as `sam local invoke` does
    result = _run([tool("python"), "-c", SAM_LOCAL_ENVIRONMENT, TEMPLATE, json.dumps(overrides), LOCAL_ENV])
    assert result.returncode == 0, result.stderr[-3000:]
    functions = json.loads(result.stdout.strip().splitlines()[-1])

    # THEN every variable of env/local.json reaches both functions, and they make valid Settings
    for name, function in functions.items():
        env = function["env"]
        assert {k: env.get(k) for k in local_env()} == local_env(), name
        settings = Settings.from_env(env)
        assert settings.database_url == local_env()["DATABASE_URL"]
        assert settings.db_secret_arn is None  # blanked: the local database needs no secret
        assert env["AWS_ENDPOINT_URL_S3"].startswith("http://minio:")
        vips = {"arm64": "VipsLayerArm64", "x86_64": "VipsLayerX8664"}[overrides["Architecture"]]
        assert function["layers"] == ["SharedLayer", vips]
        assert function["architectures"] == [overrides["Architecture"]]


def test_the_sample_events_name_the_local_bucket_and_stage() -> None:
    env = local_env()
    photos = set()
    for name in ("process-s3-notification", "process-job-message"):
        event = json.loads((EVENTS / f"{name}.json").read_text())
        (record,) = event["Records"]
        assert record["eventSourceARN"].endswith(":photo-publish-local-process")
        (request,) = from_sqs_body(record["body"], bucket=env["PHOTO_BUCKET"], stage=env["STAGE"])
        photos.add(request.photo_id)
    assert len(photos) == 1  # both name the same photo
    sweep = json.loads((EVENTS / "sweep-scheduled.json").read_text())
    assert sweep["detail-type"] == "Scheduled Event" and sweep["source"] == "aws.events"


def test_the_compose_file_serves_what_env_local_json_and_samconfig_name(stack: Stack) -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    env = local_env()
    # the network `sam local` joins, and a service for each endpoint the env file names
    assert compose["networks"]["default"]["name"] == local_invoke_config()["docker_network"]
    assert set(services) == {"localstack", "minio", "postgres", "setup"}
    assert all(service["image"] for service in services.values())
    for variable, service, port in (
        ("AWS_ENDPOINT_URL", "localstack", 4566),
        ("AWS_ENDPOINT_URL_SQS", "localstack", 4566),
        ("AWS_ENDPOINT_URL_S3", "minio", 9000),
    ):
        assert env[variable] == f"http://{service}:{port}"
        assert any(p.endswith(f":{port}") for p in services[service]["ports"]), (service, port)
    database = make_url(env["DATABASE_URL"])
    postgres = services["postgres"]["environment"]
    assert (database.host, database.port) == ("postgres", 5432)
    assert (database.username, database.password, database.database) == (
        postgres["POSTGRES_USER"],
        postgres["POSTGRES_PASSWORD"],
        postgres["POSTGRES_DB"],
    )
    # `setup` makes the bucket and the queues the env file names, the queue as the template does
    script = services["setup"]["command"][0]
    assert f"--bucket {env['PHOTO_BUCKET']}" in script
    for url in (env["PROCESS_QUEUE_URL"], env["DEAD_LETTER_QUEUE_URL"]):
        assert f"--queue-name {url.rsplit('/', 1)[1]}" in script
    assert f"events create-event-bus --name {env['EVENT_BUS_NAME']}" in script
    assert "events" in services["localstack"]["environment"]["SERVICES"].split(",")
    attributes = json.loads(re.search(r"--attributes '(\{.*\})'", script).group(1))  # type: ignore[union-attr]
    assert int(attributes["VisibilityTimeout"]) == int(stack.properties("ProcessQueue")["VisibilityTimeout"])
    redrive = json.loads(attributes["RedrivePolicy"])
    assert int(redrive["maxReceiveCount"]) == DEFAULTS["max_receive_count"]
    assert redrive["deadLetterTargetArn"].endswith(":" + env["DEAD_LETTER_QUEUE_URL"].rsplit("/", 1)[1])
    # AND Docker Compose itself (v2, from .venv-tools: `config` needs no engine) accepts the file
    checked = _run([tool("docker-compose"), "-f", ROOT / "docker-compose.yml", "config", "-q"])
    assert checked.returncode == 0, checked.stderr


# --- the linters ----------------------------------------------------------------------------------


def _run(command: list[str | Path], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=tool_env(**env),
        check=False,
        timeout=300,
    )


def test_sam_validate_lint() -> None:
    result = _run([tool("sam"), "validate", "--lint", "--template-file", TEMPLATE])
    assert result.returncode == 0, result.stdout + result.stderr


def test_cfn_lint() -> None:
    result = _run([tool("cfn-lint"), TEMPLATE])
    assert result.returncode == 0, result.stdout + result.stderr


def test_checkov() -> None:
    result = _run(
        [tool("checkov"), "-f", TEMPLATE, "--framework", "cloudformation", "--skip-download", "--compact"]
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"Failed checks: 0\b", result.stdout), result.stdout


# --- uploads from an app (SPEC 17) ----------------------------------------------------------------

ROUTES = ("RegisterRoute", "StatusRoute", "DeleteRoute")
# The backend's alone, whatever UploadAuthorizer says (SPEC 19).
MEMBER_ROUTES = ("ShareAlbumRoute", "UnshareAlbumRoute")


def test_the_upload_api_is_iam_authorized_by_default_every_route() -> None:
    stack = Stack()
    keys = {stack.properties(route)["RouteKey"] for route in ROUTES}
    assert keys == {"POST /albums/{albumId}/photos", "GET /photos/{photoId}", "DELETE /photos/{photoId}"}
    for route in ROUTES:
        properties = stack.properties(route)
        assert properties["AuthorizationType"] == "AWS_IAM"
        assert "AuthorizerId" not in properties
    assert "UploadJwtAuthorizer" not in stack.resources()
    # the API invokes the function, through a permission scoped to this API
    integration = stack.properties("UploadIntegration")
    assert (integration["IntegrationUri"], integration["PayloadFormatVersion"]) == (
        "<UploadFunction.Arn>",
        "2.0",
    )
    assert "<UploadHttpApi>" in stack.properties("UploadInvokePermission")["SourceArn"]


def test_a_jwt_authorizer_takes_its_issuer_and_audience_from_the_parameters() -> None:
    stack = Stack(UploadAuthorizer="JWT", JwtIssuer="https://issuer.example.com", JwtAudience="app-1,app-2")
    jwt = stack.properties("UploadJwtAuthorizer")["JwtConfiguration"]
    assert jwt == {"Issuer": "https://issuer.example.com", "Audience": ["app-1", "app-2"]}
    for route in ROUTES:
        assert stack.properties(route)["AuthorizationType"] == "JWT"
        assert stack.properties(route)["AuthorizerId"] == "<UploadJwtAuthorizer>"
    # sharing an album stays the backend's: a user's token is no authority for it
    for route in MEMBER_ROUTES:
        assert stack.properties(route)["AuthorizationType"] == "AWS_IAM"
        assert "AuthorizerId" not in stack.properties(route)


def test_the_backend_shares_albums_on_its_own_routes() -> None:
    stack = Stack()
    keys = {stack.properties(route)["RouteKey"] for route in MEMBER_ROUTES}
    assert keys == {"PUT /albums/{albumId}/members/{userId}", "DELETE /albums/{albumId}/members/{userId}"}
    for route in MEMBER_ROUTES:
        assert stack.properties(route)["AuthorizationType"] == "AWS_IAM"
        assert stack.properties(route)["Target"] == stack.properties("RegisterRoute")["Target"]


def test_without_the_upload_api_nothing_of_it_is_created() -> None:
    resources = Stack(UploadApi="false").resources()
    assert not {name for name in resources if name.startswith("Upload") or name in ROUTES + MEMBER_ROUTES}


def test_browsers_may_post_from_the_apps_origins_and_nothing_else() -> None:
    assert "CorsConfiguration" not in Stack().properties("PhotoBucket")
    cors = Stack(AppOrigins="https://app.example.com,https://www.example.com").properties("PhotoBucket")
    (rule,) = cors["CorsConfiguration"]["CorsRules"]
    assert rule["AllowedMethods"] == ["POST"]
    assert rule["AllowedOrigins"] == ["https://app.example.com", "https://www.example.com"]


def test_what_outlives_a_deletion_is_kept_as_long_as_its_parameter_says() -> None:
    stack = Stack(
        ObjectVersionRetentionDays="7",
        AccessLogRetentionDays="14",
        BusArchiveRetentionDays="3",
        LogRetentionDays="5",
    )
    (tidy,) = stack.properties("PhotoBucket")["LifecycleConfiguration"]["Rules"]
    assert tidy["NoncurrentVersionExpiration"]["NoncurrentDays"] == "7"
    (expire,) = stack.properties("AccessLogBucket")["LifecycleConfiguration"]["Rules"]
    assert expire["ExpirationInDays"] == "14"
    assert stack.properties("EventArchive")["RetentionDays"] == "3"
    groups = [r for r in stack.resources().values() if r["Type"] == "AWS::Logs::LogGroup"]
    assert groups and all(g["Properties"]["RetentionInDays"] == "5" for g in groups)
