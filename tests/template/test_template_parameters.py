"""The recipe's parameters refuse at deploy what the functions' settings would refuse at cold start.

A stack deployed with a ladder `Settings` refuses (VariantWidths 10, 4096 or 640,640; none beside
VariantFormats webp,avif) creates fine, and then every invocation of every function fails at cold
start. So the template's verdict on each value, and on each pair of them, is evaluated here as
CloudFormation evaluates it, and compared with Settings' verdict on the environment the template
gives the functions:

- a parameter's own constraints: AllowedPattern, AllowedValues, MinLength, MaxLength (any other
  fails the test). CloudFormation matches AllowedPattern against the whole value with
  java.util.regex; the template's patterns keep to what Java and Python read alike (`[0-9]`, not
  `\\d`, which Python's re reads as any Unicode digit; groups, lookahead and backreferences), so
  Python's re.fullmatch is a faithful evaluation of them (Java 17's Matcher.matches() gave the
  same verdict as re.fullmatch on every ladder here, those of the last test included);
- the template's Rules: each assertion whose rule's condition holds, for the pair of values.

Settings also reads spellings of a ladder an operator might type in an environment file (blanks,
capitals, leading zeros, an empty variable for the default). The template takes each value in
Settings' own spelling only (`Settings.environment()`, what a function's settings read back as):
another spelling of the same ladder is refused at deploy, with the rule in the error, which costs
nothing but the retyping; no spelling Settings refuses is taken.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from typing import Any, Literal

import pytest

from photo_publish.settings import InvalidSettings, Settings
from tests.template.test_template import Stack, document

Verdict = Literal["takes", "respelled", "refuses"]

# VariantWidths, and what Settings does with it beside VariantFormats webp: takes it as written,
# reads it but writes it otherwise (the template wants that spelling), or refuses it.
WIDTHS: dict[str, Verdict] = {
    "640,1280,2048": "takes",  # the default
    "none": "takes",
    "320,640,1280,2048": "takes",
    "320,640,960,1280": "takes",
    "480,960": "takes",
    "16": "takes",  # the least long edge
    "2048": "takes",  # the browse's, the most
    "1280,640": "takes",  # any order: the recipe sorts the ladder (Recipe.from_settings)
    "2048,640,1280": "takes",
    # each band of the pattern's numbers, at its edges
    "17,99,100,999,1000,1999,2000,2039,2040,2047": "takes",
    "10": "refuses",  # below 16
    "15": "refuses",
    "0": "refuses",
    "8,640": "refuses",
    "2049": "refuses",  # over the browse's 2048
    "4096": "refuses",
    "640,4096": "refuses",
    "9999": "refuses",
    "10000": "refuses",
    "640,640": "refuses",  # a size twice
    "640,1280,640": "refuses",
    "2048,640,2048": "refuses",
    "16,1600,160": "takes",  # no size twice, though one's digits begin another's
    "1600,160,16": "takes",
    "640,0640": "refuses",  # twice, once with a leading zero
    "640,": "refuses",  # trailing comma
    ",640": "refuses",
    "640,,1280": "refuses",
    "640;1280": "refuses",
    "abc": "refuses",
    "none,640": "refuses",
    "-640": "refuses",
    "1e3": "refuses",
    "": "respelled",  # an empty variable: the default
    "0640": "respelled",  # leading zeros
    "0640,1280": "respelled",
    " 640": "respelled",  # spaces
    "640 ": "respelled",
    "640, 1280": "respelled",
    "NONE": "respelled",
    "+640": "respelled",
    "6_40": "respelled",  # int() reads 640
    "\u0661\u0666\u0660\u0660": "respelled",  # Arabic-Indic 1600: int() reads it, Java's regex not
}
# VariantFormats, and what Settings does with it beside the default ladder.
FORMATS: dict[str, Verdict] = {
    "webp": "takes",  # the default
    "webp,avif": "takes",
    "avif": "refuses",  # the thumb and browse stay WebP: WebP comes first
    "avif,webp": "refuses",
    "jpeg": "refuses",
    "webp,jpeg": "refuses",
    "webp,avif,avif": "refuses",
    "webp,": "refuses",
    "": "respelled",  # an empty variable: the default
    "WEBP": "respelled",
    "webp, avif": "respelled",
    "WebP,AVIF": "respelled",
}
# The spellings above of no ladder, and of AVIF on: AVIF needs a ladder (Settings' cross-rule).
NO_LADDER = {"none", "NONE"}
WITH_AVIF = {"webp,avif", "webp, avif", "WebP,AVIF"}
# Every pair the tables' values make with these: each cross-parameter rule of Settings is in them.
PAIRS = sorted(
    {(w, f) for w in WIDTHS for f in ("webp", "webp,avif")}
    | {(w, f) for w in ("640,1280,2048", "none", "NONE") for f in FORMATS}
)


def expected(widths: str, formats: str) -> Verdict:
    """The tables' verdict on a pair: its values', and the ladder AVIF needs."""
    verdicts = {WIDTHS[widths], FORMATS[formats]}
    if "refuses" in verdicts or (widths in NO_LADDER and formats in WITH_AVIF):
        return "refuses"
    return "respelled" if "respelled" in verdicts else "takes"


# --- the template's verdict -----------------------------------------------------------------------


def constraint_broken(name: str, value: str) -> list[str]:
    """What CloudFormation says of a String parameter's value, from its own constraints."""
    spec = document()["Parameters"][name]
    holds: dict[str, Callable[[Any], bool]] = {
        "AllowedValues": lambda allowed: value in [str(v) for v in allowed],
        "AllowedPattern": lambda pattern: re.fullmatch(pattern, value) is not None,
        "MinLength": lambda length: len(value) >= int(length),
        "MaxLength": lambda length: len(value) <= int(length),
    }
    # A constraint this does not evaluate fails the test, rather than pass unread.
    assert spec["Type"] == "String", name
    assert set(spec) <= {"Type", "Default", "Description", "ConstraintDescription", *holds}, spec
    return [
        f"{name} {key} {spec[key]!r}" for key, test in holds.items() if key in spec and not test(spec[key])
    ]


# The functions CloudFormation allows in Rules, on their arguments' values.
RULE_FUNCTIONS: dict[str, Callable[[list[Any]], bool]] = {
    "Fn::Equals": lambda args: args[0] == args[1],
    "Fn::Not": lambda args: not args[0],
    "Fn::And": all,
    "Fn::Or": any,
    "Fn::Contains": lambda args: args[1] in args[0],
    "Fn::EachMemberEquals": lambda args: all(member == args[1] for member in args[0]),
    "Fn::EachMemberIn": lambda args: all(member in args[1] for member in args[0]),
}


def rule_value(expr: Any, params: dict[str, Any]) -> Any:
    """A Rules expression's value; a function not evaluated here fails the test."""
    if not isinstance(expr, dict):
        return expr
    ((function, arg),) = expr.items()
    if function == "Ref":
        return params[arg]
    assert function in RULE_FUNCTIONS, f"{function} in the template's Rules is not evaluated here"
    assert isinstance(arg, list), f"{function}'s argument is a list: {arg!r}"
    return RULE_FUNCTIONS[function]([rule_value(a, params) for a in arg])


def rules_broken(**parameters: str) -> list[str]:
    """The AssertDescription of each Rules assertion the parameters break."""
    params = Stack(**parameters).params
    broken = []
    for rule in document().get("Rules", {}).values():
        if "RuleCondition" in rule and not rule_value(rule["RuleCondition"], params):
            continue
        for assertion in rule["Assertions"]:
            if not rule_value(assertion["Assert"], params):
                broken.append(assertion["AssertDescription"])
    return broken


def template_takes(widths: str, formats: str) -> bool:
    if constraint_broken("VariantWidths", widths) + constraint_broken("VariantFormats", formats):
        return False
    # Refused by its own constraints, a value is refused whatever the Rules say.
    return not rules_broken(VariantWidths=widths, VariantFormats=formats)


# --- Settings' verdict ----------------------------------------------------------------------------


@cache
def environments() -> list[dict[str, str]]:
    """Each function's environment as the template gives it, the two variables the parameters'
    values as given (checked: a sentinel of each, passed through verbatim)."""
    stack = Stack(VariantWidths="<widths>", VariantFormats="<formats>")
    found = []
    for name in stack.functions():
        variables = stack.function(name)["Environment"]["Variables"]
        assert (variables["VARIANT_WIDTHS"], variables["VARIANT_FORMATS"]) == ("<widths>", "<formats>"), name
        found.append(variables)
    return found


def settings_verdict(widths: str, formats: str, environs: list[dict[str, str]] | None = None) -> Verdict:
    """What every function's settings (or those of `environs`) make of the pair, at cold start."""
    written = set()
    for environ in environments() if environs is None else environs:
        try:
            settings = Settings.from_env(environ | {"VARIANT_WIDTHS": widths, "VARIANT_FORMATS": formats})
        except InvalidSettings:
            return "refuses"
        back = settings.environment()
        written.add((back["VARIANT_WIDTHS"], back["VARIANT_FORMATS"]))
    assert len(written) == 1, written  # every function reads the same recipe
    return "takes" if written == {(widths, formats)} else "respelled"


# --- the verdicts compared ------------------------------------------------------------------------


@pytest.mark.parametrize(("widths", "formats"), PAIRS)
def test_the_template_takes_exactly_the_recipe_parameters_settings_take_as_written(
    widths: str, formats: str
) -> None:
    # GIVEN a pair of VariantWidths and VariantFormats, and the table's verdict on it
    verdict = expected(widths, formats)
    # WHEN the functions' settings read it, from the environment the template gives them
    # THEN they take it as written, read another spelling of it, or refuse it as the table says
    assert settings_verdict(widths, formats) == verdict
    # AND the template takes it exactly when the settings take it as written: never a stack whose
    # every cold start fails (nor one whose parameters say otherwise than its functions read)
    assert template_takes(widths, formats) == (verdict == "takes")


def test_the_recipe_parameters_say_their_rules_in_words() -> None:
    # GIVEN the recipe's parameters whose values the template constrains beyond a list
    parameters = document()["Parameters"]
    # THEN an operator who gives a refused value is told the rule, not a regular expression
    for name in ("VariantWidths",):
        assert parameters[name].get("ConstraintDescription"), name
    # AND each Rules assertion says what it refuses and why
    for rule in document()["Rules"].values():
        for assertion in rule["Assertions"]:
            assert len(assertion["AssertDescription"]) > 20, assertion


def test_a_ladder_with_avif_needs_widths_and_the_rule_says_so() -> None:
    # GIVEN AVIF on without a ladder
    # THEN the template's Rules refuse the pair, and only that pair of the formats' two values
    (description,) = rules_broken(VariantWidths="none", VariantFormats="webp,avif")
    assert "VariantWidths" in description and "VariantFormats" in description
    assert rules_broken(VariantWidths="none", VariantFormats="webp") == []
    assert rules_broken(VariantWidths="640", VariantFormats="webp,avif") == []


def test_every_long_edge_up_to_twice_the_browse_alone_and_twice_over() -> None:
    # GIVEN each number from 0 to twice the browse's size, as a ladder of one step, and twice in a
    # ladder (the pattern's bands of numbers and its lookahead for a size given twice)
    process = environments()[0]  # every function's the same (the table's test reads them all)
    browse = int(process["BROWSE_SIZE"])
    for number in range(2 * browse + 1):
        for widths in (str(number), f"{number},640,{number}"):
            # THEN the template takes it exactly when the settings take it as written
            verdict = settings_verdict(widths, "webp", [process])
            assert template_takes(widths, "webp") == (verdict == "takes"), widths
