"""The guides agree with the template and the code: the configuration table with what `Settings`
reads and what template.yaml sets on the functions, the deploying guide's alarm table with the
template's alarms. (Each alarm's runbook: tests/integration/test_operations.py.)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from dataclasses import MISSING
from pathlib import Path
from typing import Any

from photo_publish.settings import Settings
from tests.markdown import slug, table
from tests.template.test_template import PSEUDO, REQUIRED, Stack, document

ROOT = Path(__file__).resolve().parents[2]
CONFIGURATION = ROOT / "docs" / "configuration.md"
DEPLOYING = ROOT / "docs" / "deploying.md"
CONFIG_HEAD = "| variable | default | the template sets | what it changes |"
ALARM_HEAD = "| alarm | fires when | what to do |"
FIELDS = {f.name.upper(): f for f in dataclasses.fields(Settings)}


def config_rows() -> dict[str, tuple[str, str]]:
    """Each variable of the configuration table: (default cell, the template's cell)."""
    rows: dict[str, tuple[str, str]] = {}
    for cells in table(CONFIGURATION, CONFIG_HEAD):
        assert len(cells) == 4, cells
        name = re.fullmatch(r"`([A-Z0-9_]+)`", cells[0])
        assert name, f"one variable a row, in backticks: {cells[0]}"
        assert name.group(1) not in rows, f"{name.group(1)} has two rows"
        rows[name.group(1)] = (cells[1], cells[2])
    return rows


def set_by_template() -> dict[str, list[Any]]:
    """Each variable the template gives any function: its unevaluated expressions (Globals', and
    each function's own)."""
    doc = document()
    found: dict[str, list[Any]] = {}
    for name, value in doc["Globals"]["Function"]["Environment"]["Variables"].items():
        found.setdefault(name, []).append(value)
    for resource in doc["Resources"].values():
        if resource["Type"] == "AWS::Serverless::Function":
            variables = resource.get("Properties", {}).get("Environment", {}).get("Variables", {})
            for name, value in variables.items():
                found.setdefault(name, []).append(value)
    return found


def names(node: Any) -> Iterator[str]:
    """Every name an expression reads: its Refs, !GetAtt's resources, !Sub's ${...}, and for an
    !If the Refs of the condition it names (not the conditions that one names in turn)."""
    if isinstance(node, list):
        for item in node:
            yield from names(item)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key == "Ref":
            yield value
        elif key == "Fn::GetAtt":
            yield value[0]
        elif key == "Fn::Sub":
            text, variables = (value, {}) if isinstance(value, str) else value
            yield from (ref.split(".")[0] for ref in re.findall(r"\$\{([^}!]+)\}", text))
            yield from names(variables)
        elif key == "Fn::If":
            condition = document()["Conditions"][value[0]]
            yield from (n for n in names(condition) if n in document()["Parameters"])
            yield from names(value[1:])
        elif key != "Condition":
            yield from names(value)


def references(expression: Any) -> tuple[set[str], bool]:
    """The template parameters an expression takes its value from, and whether it also reads a
    resource or a pseudo parameter."""
    read = set(names(expression))
    parameters = read & set(document()["Parameters"])
    return parameters, bool(read - parameters)


def shown(value: object) -> str:
    """A default as the table writes it."""
    if value is None or value is MISSING:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "":
        return "empty"
    if isinstance(value, tuple):
        # as the variable is written (Settings.environment): comma-joined, "none" for no item
        return ",".join(map(str, value)) if value else "none"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def test_the_configuration_table_has_a_row_for_every_variable_and_no_other() -> None:
    # GIVEN the variables Settings reads and those the template sets on any function
    expected = set(FIELDS) | set(set_by_template())
    # WHEN the guide's table is read
    documented = set(config_rows())
    # THEN each has its row, and no row names a variable nothing reads or sets
    assert not expected - documented, (
        f"rows missing from docs/configuration.md: {sorted(expected - documented)}"
    )
    assert not documented - expected, f"rows for nothing: {sorted(documented - expected)}"


def test_the_configuration_tables_defaults_are_the_codes() -> None:
    template = Stack()
    for variable, (default, _) in config_rows().items():
        stated = default.replace("`", "")
        if variable in FIELDS:
            # THEN the default is Settings' own (a required or optional setting's is "-")
            assert stated == shown(FIELDS[variable].default), (variable, stated)
            continue
        # a variable Settings does not read (Powertools', glibc's, boto3's): the template's value
        # where every function has it under the default parameters, else "-"
        values = {
            template.function(f)["Environment"]["Variables"].get(variable) for f in template.functions()
        }
        literal = values.pop() if len(values) == 1 else None
        assert stated == ("-" if literal is None else literal), (variable, stated)


def test_the_configuration_table_says_where_the_template_takes_each_value_from() -> None:
    template = Stack()
    given = set_by_template()
    for variable, (default, source) in config_rows().items():
        if variable not in given:
            # THEN a variable the template leaves unset says so
            assert source == "-", f"{variable}: the template does not set it, the row says {source!r}"
            continue
        assert source != "-", f"{variable}: the template sets it, the row says it does not"
        for expression in given[variable]:
            parameters, reads_more = references(expression)
            # THEN each parameter the value comes from is named
            for parameter in parameters:
                assert f"`{parameter}`" in source, f"{variable}: {parameter} decides it, the row does not say"
            if isinstance(expression, dict) and "Fn::FindInMap" in expression:
                _, group, key = expression["Fn::FindInMap"]
                assert f"`{group}.{key}`" in source, f"{variable}: from Mappings {group}.{key}"
            # AND where a default deploy gives a plain value other than the code's default, the
            # row shows it
            if reads_more or set(parameters) & set(REQUIRED) or variable not in FIELDS:
                continue
            values = {
                template.function(f)["Environment"]["Variables"].get(variable) for f in template.functions()
            } - {None}
            for value in values:
                if any(str(p) in value for p in PSEUDO.values()):
                    continue
                if shown(value) != default.replace("`", ""):
                    assert f"`{value}`" in source or (value == "" and "empty" in source), (
                        f"{variable}: a default deploy sets {value!r}, the row does not show it"
                    )


def test_the_deploying_guide_lists_every_alarm_with_its_runbook() -> None:
    # GIVEN the template's alarms, by the name a stage gives them
    stack = Stack()
    alarms = sorted(
        r["Properties"]["AlarmName"].replace(stack.params["Stage"], "{stage}", 1)
        for r in stack.resources().values()
        if r["Type"] == "AWS::CloudWatch::Alarm"
    )
    # WHEN the deploying guide's alarm table is read
    rows = {cells[0]: cells for cells in table(DEPLOYING, ALARM_HEAD)}
    # THEN each alarm has its row, linked to its runbook, and no row names an alarm that is not there
    listed = {re.sub(r"^\[`(.+)`\]\(.*\)$", r"\1", cell): cell for cell in rows}
    assert set(listed) == set(alarms), f"deploying.md's alarms {sorted(listed)} != the template's {alarms}"
    for alarm, cell in listed.items():
        assert cell.endswith(f"(runbooks.md#{slug(alarm)})"), f"{cell}: link it to its runbook"


PARAMETER_HEAD = "| parameter | default | meaning |"


def test_the_deploying_guide_has_every_parameter_with_its_default() -> None:
    # GIVEN the template's parameters
    parameters = document()["Parameters"]
    # WHEN the guide's parameter table is read (a row may name several parameters)
    named: dict[str, str] = {}
    for cells in table(DEPLOYING, PARAMETER_HEAD):
        names = re.findall(r"`([A-Za-z0-9]+)`", cells[0])
        for name in names:
            assert name not in named, f"{name} has two rows"
            named[name] = cells[1] if len(names) == 1 else ""
    # THEN each parameter has a row, and no row names something the template does not take
    assert not set(parameters) - set(named), (
        f"missing from deploying.md: {sorted(set(parameters) - set(named))}"
    )
    assert not set(named) - set(parameters), f"not parameters: {sorted(set(named) - set(parameters))}"
    # AND a row of its own states the template's default ("required" where there is none)
    for name, stated in named.items():
        if not stated:
            continue
        default = parameters[name].get("Default")
        expected = "required" if default is None else ("empty" if default == "" else str(default))
        assert stated.replace("`", "") == expected, (name, stated, expected)
