"""Operations (SPEC 17): the dashboard shows only metrics that exist, every alarm has its runbook,
and the cost table counts what the template creates.

The template is read and evaluated as in test_template.py (its Stack); the metrics the code emits
are read from the source (every `add_metric` call, its name resolved to the strings it can take),
so a widget over a metric nobody emits, or with dimensions its emitter does not add, fails here
rather than showing an empty graph to someone in the middle of an incident.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shlex
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from photo_publish import operator
from photo_publish.errors import ErrorCode
from photo_publish.publish.outcomes import Outcome
from tests.markdown import slug
from tests.template.test_template import ROOT, Stack

RUNBOOKS = ROOT / "docs" / "runbooks.md"
COST = ROOT / "docs" / "cost.md"

# --- what the code emits --------------------------------------------------------------------------

# The f-string placeholders of metric names, and the values each can take.
PLACEHOLDERS: dict[str, type[StrEnum]] = {"result.outcome": Outcome, "result.code": ErrorCode}
# Modules outside functions/ that emit metrics, and the function whose handler flushes them.
EMITTED_BY = {"shared/photo_publish/publish/delivery.py": "process"}


@dataclass(frozen=True)
class Emitted:
    name: str
    function: str


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level NAME = "string" assignments."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    found[target.id] = node.value.value
    return found


def _loop_values(tree: ast.Module, call: ast.Call, variable: str) -> set[str]:
    """The strings a loop variable takes, where the call sits in `for variable[, ...] in (...)`."""
    for loop in ast.walk(tree):
        if not isinstance(loop, ast.For) or not any(n is call for n in ast.walk(loop)):
            continue
        target = loop.target
        position = 0
        if isinstance(target, ast.Tuple):
            names = [t.id for t in target.elts if isinstance(t, ast.Name)]
            if variable not in names:
                continue
            position = names.index(variable)
        elif not (isinstance(target, ast.Name) and target.id == variable):
            continue
        assert isinstance(loop.iter, ast.Tuple | ast.List), ast.unparse(loop.iter)
        values = set()
        for item in loop.iter.elts:
            element = item.elts[position] if isinstance(item, ast.Tuple) else item
            assert isinstance(element, ast.Constant), ast.unparse(element)
            values.add(str(element.value))
        return values
    pytest.fail(f"no loop binds {variable} around {ast.unparse(call)}")


def _names(tree: ast.Module, call: ast.Call) -> set[str]:
    (name,) = [k.value for k in call.keywords if k.arg == "name"]
    if isinstance(name, ast.Constant):
        return {str(name.value)}
    if isinstance(name, ast.Name):
        return {_constants(tree)[name.id]}
    assert isinstance(name, ast.JoinedStr), ast.unparse(name)
    names = {""}
    for part in name.values:
        if isinstance(part, ast.Constant):
            names = {n + str(part.value) for n in names}
            continue
        assert isinstance(part, ast.FormattedValue)
        expression = ast.unparse(part.value)
        if expression in PLACEHOLDERS:
            values = {m.value for m in PLACEHOLDERS[expression]}
        else:
            assert isinstance(part.value, ast.Name), f"unknown placeholder {expression}"
            values = _loop_values(tree, call, part.value.id)
        names = {n + v for n in names for v in values}
    return names


def _calls(tree: ast.Module, method: str) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method
    ]


@cache
def emitted() -> frozenset[Emitted]:
    """Every metric name the code can emit, with the function that flushes it."""
    found = set()
    for path in [*sorted((ROOT / "shared").rglob("*.py")), *sorted((ROOT / "functions").glob("*/app.py"))]:
        tree = ast.parse(path.read_text())
        calls = _calls(tree, "add_metric")
        if not calls:
            continue
        relative = path.relative_to(ROOT).as_posix()
        function = path.parent.name if relative.startswith("functions/") else EMITTED_BY.get(relative)
        assert function, f"{relative} emits metrics: say which function's handler flushes them (EMITTED_BY)"
        found |= {Emitted(n, function) for call in calls for n in _names(tree, call)}
    return frozenset(found)


def dimensions_of(function: str, service: str, stage: str) -> dict[str, str]:
    """The dimensions a function's metrics carry: Powertools' `service`, and what its handler adds."""
    tree = ast.parse((ROOT / "functions" / function / "app.py").read_text())
    added = {}
    for call in _calls(tree, "add_dimension"):
        (name,) = [k.value for k in call.keywords if k.arg == "name"]
        assert isinstance(name, ast.Constant), ast.unparse(call)
        assert name.value == "stage", f"a new dimension {name.value!r}: give the dashboard its value"
        added[str(name.value)] = stage
    return {"service": service} | added


def test_the_source_scan_finds_what_the_handlers_emit() -> None:
    names = {e.name for e in emitted()}
    # the scan is not vacuous: literal names, constants, enum-valued and loop-valued f-strings
    assert {"RenderDuration", "OutboxOldestUnpublishedSeconds", "Sweep_errors", "Relay_published"} <= names
    assert {f"Failures_{code.value}" for code in ErrorCode} <= names
    assert {f"Photos_{outcome.value}" for outcome in Outcome} <= names


# --- the dashboard --------------------------------------------------------------------------------

# AWS's metrics the dashboard may use, per namespace, and the dimension that names this stack's
# resource (the value must be one of the stack's, below).
AWS_METRICS = {
    "AWS/SQS": (
        {
            "ApproximateAgeOfOldestMessage",
            "ApproximateNumberOfMessagesVisible",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
            "NumberOfMessagesSent",
        },
        {"QueueName"},
    ),
    "AWS/Lambda": (
        {"Duration", "Errors", "Throttles", "Invocations", "ConcurrentExecutions"},
        {"FunctionName"},
    ),
    "AWS/RDS": (
        {"DatabaseConnections", "ClientConnections"},
        {"ProxyName", "DBClusterIdentifier", "DBInstanceIdentifier"},
    ),
}


def dashboard(stack: Stack) -> dict[str, Any]:
    body = stack.properties("Dashboard")["DashboardBody"]
    assert "${" not in body, "an unresolved placeholder"
    parsed: dict[str, Any] = json.loads(body)
    return parsed


def metric_rows(widget: dict[str, Any]) -> list[tuple[str, str, dict[str, str]]]:
    """(namespace, name, dimensions) of each of a metric widget's rows (no shorthand rows)."""
    rows = []
    for row in widget["properties"]["metrics"]:
        fields = [f for f in row if not isinstance(f, dict)]
        assert "..." not in fields and "." not in fields, f"spell each row out: {row}"
        namespace, name, *pairs = fields
        assert len(pairs) % 2 == 0, row
        rows.append((namespace, name, dict(zip(pairs[::2], pairs[1::2], strict=True))))
    return rows


def widgets(stack: Stack, kind: str = "metric") -> dict[str, dict[str, Any]]:
    return {w["properties"].get("title", ""): w for w in dashboard(stack)["widgets"] if w["type"] == kind}


@pytest.mark.parametrize("proxy", ["true", "false"])
def test_every_dashboard_metric_is_emitted_by_the_code_or_by_aws_for_this_stack(proxy: str) -> None:
    # GIVEN the stack, the code's metrics and the dimensions each function's handler gives them
    stack = Stack(DbHostIsRdsProxy=proxy)
    env = stack.function("ProcessFunction")["Environment"]["Variables"]
    namespace, service, stage = (
        env["POWERTOOLS_METRICS_NAMESPACE"],
        env["POWERTOOLS_SERVICE_NAME"],
        env["STAGE"],
    )
    ours = {(e.name, tuple(sorted(dimensions_of(e.function, service, stage).items()))) for e in emitted()}
    db_label = stack.params["DbHost"].split(".")[0]
    resources = {"<ProcessQueue.QueueName>", "<DeadLetterQueue.QueueName>", db_label} | {
        f"<{f}>" for f in stack.functions()
    }

    # WHEN each row of each metric widget is read
    rows = [row for w in widgets(stack).values() for row in metric_rows(w)]
    assert rows

    # THEN each is a metric the code emits, with exactly its dimensions, or AWS's for this stack
    for row_namespace, name, dimensions in rows:
        if row_namespace == namespace:
            assert (name, tuple(sorted(dimensions.items()))) in ours, (name, dimensions)
            continue
        assert row_namespace in AWS_METRICS, row_namespace
        names, dimension_names = AWS_METRICS[row_namespace]
        assert name in names, (row_namespace, name)
        assert set(dimensions) <= dimension_names and len(dimensions) == 1, dimensions
        assert set(dimensions.values()) <= resources, dimensions


def test_the_dashboard_has_the_widgets_operations_asked_for() -> None:
    stack = Stack()
    shown = {title: metric_rows(w) for title, w in widgets(stack).items()}

    def names(title: str) -> set[str]:
        return {name for _, name, _ in shown[title]}

    assert "Photos_published" in names("Photos published")
    # every code, so a new code that is not on the dashboard fails here
    assert {f"Failures_{code.value}" for code in ErrorCode} <= names("Failed by error code")
    assert ("AWS/SQS", "ApproximateAgeOfOldestMessage", {"QueueName": "<ProcessQueue.QueueName>"}) in shown[
        "Queue age (oldest message)"
    ]
    assert (
        "AWS/SQS",
        "ApproximateNumberOfMessagesVisible",
        {"QueueName": "<ProcessQueue.QueueName>"},
    ) in shown["Queue depth"]
    dead = {(name, d["QueueName"]) for _, name, d in shown["Dead letters"] if "QueueName" in d}
    assert dead == {
        ("ApproximateNumberOfMessagesVisible", "<DeadLetterQueue.QueueName>"),
        ("NumberOfMessagesSent", "<DeadLetterQueue.QueueName>"),
    }
    assert "RenderDuration" in names("Render duration (ms, one photo)")
    assert {"Duration", "EventHandOffDuration"} <= names("Delivery duration (ms)")
    assert "OutboxOldestUnpublishedSeconds" in names("Outbox age (oldest waiting event, s)")
    assert "DatabaseConnections" in names("Database connections")


def test_the_dashboard_marks_the_alarms_thresholds_and_lists_every_alarm() -> None:
    stack = Stack()
    resources = stack.resources()
    alarms = {n for n, r in resources.items() if r["Type"] == "AWS::CloudWatch::Alarm"}
    (listed,) = widgets(stack, "alarm").values()
    assert sorted(listed["properties"]["alarms"]) == sorted(f"<{a}.Arn>" for a in alarms)
    by_metric = {
        r["Properties"]["MetricName"]: r["Properties"]["Threshold"]
        for n, r in resources.items()
        if n in alarms
    }
    lines = {
        title: [a["value"] for a in w["properties"].get("annotations", {}).get("horizontal", [])]
        for title, w in widgets(stack).items()
    }
    assert lines["Queue age (oldest message)"] == [by_metric["ApproximateAgeOfOldestMessage"]]
    assert lines["Outbox age (oldest waiting event, s)"] == [by_metric["OutboxOldestUnpublishedSeconds"]]


# --- runbooks -------------------------------------------------------------------------------------


def runbook_sections() -> dict[str, str]:
    """Each `### ` section of docs/runbooks.md by its anchor."""
    text = RUNBOOKS.read_text()
    parts = re.split(r"^### (.+)$", text, flags=re.MULTILINE)
    return {slug(parts[i]): parts[i + 1] for i in range(1, len(parts), 2)}


def test_every_alarm_has_a_runbook_and_its_description_points_to_it() -> None:
    sections = runbook_sections()
    alarms = {
        n: r["Properties"] for n, r in Stack().resources().items() if r["Type"] == "AWS::CloudWatch::Alarm"
    }
    assert len(alarms) >= 9
    for logical_id, alarm in alarms.items():
        anchor = slug(alarm["AlarmName"].replace(Stack().params["Stage"], "{stage}", 1))
        assert anchor in sections, f"no runbook heading for {alarm['AlarmName']}"
        section = sections[anchor]
        assert logical_id in section, f"the runbook of {anchor} does not name {logical_id}"
        for part in ("**Symptom**", "**Check**", "**Fix**"):
            assert part in section, f"{anchor}: {part} missing"
        assert f"docs/runbooks.md#{anchor}" in alarm["AlarmDescription"], logical_id
        assert len(alarm["AlarmDescription"]) <= 1024


def test_the_runbooks_say_how_to_reach_a_private_database_and_link_it() -> None:
    sections = runbook_sections()
    reach = sections["reach-a-private-database"]
    assert "AWS-StartPortForwardingSessionToRemoteHost" in reach
    for anchor, section in sections.items():
        if "operator retry" in section or "operator redrive" in section:
            assert anchor == "reach-a-private-database" or "(#reach-a-private-database)" in section, anchor


class Parsed(Exception):  # carries the parsed arguments out of main()
    pass


def operator_commands() -> list[str]:
    text = RUNBOOKS.read_text()
    commands = re.findall(r"python -m photo_publish\.operator ([^\n`|#]+)", text)
    return sorted({c.strip() for c in commands})


@pytest.mark.parametrize("command", operator_commands())
def test_every_operator_command_in_the_runbooks_is_one_the_operator_parses(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the runbook's command line, its placeholders filled in
    argv = shlex.split(
        command.replace("PHOTO_ID", "0b9f2d4e-8c61-4f6a-b2a3-6d5e4c3b2a10").replace(
            "ALBUM_ID", "5e0c7a1b-3d2f-4e6a-9b8c-7d6e5f4a3b21"
        )
    )
    original = argparse.ArgumentParser.parse_args

    def parse_only(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        raise Parsed(original(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)

    # WHEN the operator's own parser reads it THEN it parses (an unknown flag exits with 2)
    with pytest.raises(Parsed):
        operator.main(argv)


# --- the cost table -------------------------------------------------------------------------------


def test_the_cost_table_counts_what_the_template_creates() -> None:
    text = COST.read_text()
    stack = Stack()
    resources = stack.resources()
    alarms = sum(r["Type"] == "AWS::CloudWatch::Alarm" for r in resources.values())
    keys = sum(r["Type"] == "AWS::KMS::Key" for r in resources.values())
    dashboards = sum(r["Type"] == "AWS::CloudWatch::Dashboard" for r in resources.values())
    assert f"{alarms} standard alarms" in text
    assert f"{keys} customer managed key" in text
    assert f"{dashboards} dashboard" in text
    # the metrics the scheduled functions emit every run: billed every hour of the month
    scheduled = sorted(e.name for e in emitted() if e.function in ("sweep", "relay"))
    assert f"{len(scheduled)} custom metrics" in text, scheduled
    with_endpoints = Stack(
        CreateVpcEndpoints="true", SubnetIds="subnet-a,subnet-b", VpcId="vpc-1", RouteTableIds="rtb-1"
    ).resources()
    interface = sum(
        r["Type"] == "AWS::EC2::VPCEndpoint" and r["Properties"]["VpcEndpointType"] == "Interface"
        for r in with_endpoints.values()
    )
    assert f"{interface} interface endpoints" in text
    for function in ("SweepFunction", "RelayFunction"):
        events = stack.properties(function)["Events"]
        assert [e["Properties"]["Schedule"] for e in events.values()] == ["rate(1 minute)"]
        assert stack.properties(function)["MemorySize"] == 512
    assert re.search(r"prices (read|checked)\s+on\s+\d{4}-\d{2}-\d{2}", text), (
        "the table says when its prices are from"
    )


def test_the_readme_links_the_runbooks_and_the_cost() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "docs/runbooks.md" in readme and "docs/cost.md" in readme
    assert Path(RUNBOOKS).exists() and Path(COST).exists()
