"""`make mutants` reads its patches' headers and its runs' reports and logs (devkit/mutants.py): what
it says of a run is what the run showed."""

from __future__ import annotations

import pytest

from devkit import mutants
from devkit.mutants import BROKEN, FOUND, NOT_APPLIED, NOT_FOUND, Run


def report(*phases: tuple[str, str | None], collect: tuple[str, ...] = ()) -> dict[str, object]:
    return {
        "collect": list(collect),
        "phases": [{"when": when, "type": kind, "message": "m"} for when, kind in phases],
        "exitstatus": 1,
    }


def test_a_header_gives_its_fields_and_a_field_goes_on_over_the_lines_that_name_none() -> None:
    # GIVEN a patch's header, one field over two lines, one holding a colon
    text = (
        "Put back: a defect, said over\n"
        "two lines: the second with a colon\n"
        "Test: tests/x.py::test_y\n"
        "Seeded: no\n"
        "diff --git a/f b/f\n"
        "Test: not a header line\n"
    )
    # WHEN it is read  THEN each field is whole, and nothing after the diff's start counts
    assert mutants.header(text) == {
        "put back": "a defect, said over two lines: the second with a colon",
        "test": "tests/x.py::test_y",
        "seeded": "no",
    }


def test_every_patch_names_its_defect_its_record_and_a_test_file_that_exists() -> None:
    # GIVEN / WHEN every patch under tests/mutants  THEN its header is complete
    patches = mutants.chosen(None)
    assert len(patches) >= 6
    for m in patches:
        assert m.put_back and m.recorded, m.name
        assert (mutants.ROOT / m.test.split("::")[0]).is_file(), m.test
        assert "diff --git" in m.patch.read_text(), m.name


@pytest.mark.parametrize(
    ("run", "timed_out", "outcome"),
    [
        pytest.param(report(("setup", None), ("call", "AssertionError")), False, FOUND, id="an-invariant"),
        pytest.param(
            report(("setup", None), ("call", "RecursionError")), False, FOUND, id="the-product-raises"
        ),
        pytest.param(
            report(("setup", None), ("call", None), ("teardown", "Failed")), False, FOUND, id="teardown"
        ),
        pytest.param(report(("setup", None), ("call", None)), False, NOT_FOUND, id="passed"),
        pytest.param(report(("setup", None)), True, NOT_FOUND, id="interrupted"),
        pytest.param(
            report(("setup", None), ("teardown", "Failed")), True, NOT_FOUND, id="interrupted-teardown"
        ),
        pytest.param(None, True, NOT_FOUND, id="killed"),
        pytest.param(report(("setup", None), ("call", "NameError")), False, BROKEN, id="a-name-error"),
        pytest.param(report(("setup", "OperationalError")), False, BROKEN, id="setup"),
        pytest.param(report(collect=("ImportError: x",)), False, BROKEN, id="collection"),
        pytest.param(report(), False, BROKEN, id="no-such-test"),
        pytest.param(None, False, BROKEN, id="no-report"),
    ],
)
def test_a_run_is_found_only_when_its_test_failed_in_its_body(
    run: dict[str, object] | None, timed_out: bool, outcome: str
) -> None:
    # GIVEN what a run's plugin reported, and whether it was stopped at the bound
    # WHEN it is judged  THEN found, not found or broken
    assert mutants.verdict(run, timed_out)[0] == outcome


def test_the_checks_and_examples_are_read_from_the_log() -> None:
    # GIVEN a find run's log: the fixture's count, Hypothesis' statistics in two versions' words
    log = (
        "state machine: 2972 checks run in 50 s\n"
        "  - during generate phase (50.12 seconds):\n"
        "    - 61 passing examples, 1 failing examples, 3 invalid examples\n"
        "  - during reuse phase (0.00 seconds):\n"
        "    - 0 passing examples, 0 failing examples, 0 invalid examples\n"
        "  - during generate phase (14.02 seconds):\n"
        "    - 500 passing, 0 failing, and 60 invalid test cases\n"
    )
    # WHEN read  THEN the checks and the examples run
    assert mutants.checks_run(log) == 2972
    assert mutants.examples_run(log) == 562
    assert mutants.checks_run("") is mutants.examples_run("") is None


def test_a_mutant_passes_when_found_on_two_of_its_runs_or_on_its_only_one() -> None:
    def runs(*outcomes: str) -> list[Run]:
        return [Run("m", seed, outcome) for seed, outcome in enumerate(outcomes, start=1)]

    assert mutants.passes(runs(FOUND, NOT_FOUND, FOUND))
    assert not mutants.passes(runs(FOUND, NOT_FOUND, NOT_FOUND))
    assert mutants.passes([Run("m", None, FOUND)])
    assert not mutants.passes(runs(NOT_APPLIED))
    assert not mutants.passes(runs(FOUND, FOUND, BROKEN))


def test_the_table_puts_a_run_without_a_seed_under_the_first_seed() -> None:
    # GIVEN a seeded mutant found on one seed of two, and a test that draws nothing, found
    runs = [
        Run("a", 1, FOUND, seconds=50, checks=2972),
        Run("a", 2, NOT_FOUND, "interrupted at the bound", seconds=301, checks=12783),
        Run("b", None, FOUND, seconds=19),
    ]
    ms = [mutants.Mutant(n, mutants.PATCHES / n, "", "", "t", None, n == "a") for n in ("a", "b")]
    # WHEN tabled
    lines = mutants.table(ms, [1, 2], runs).splitlines()
    # THEN each cell says what its run showed; a fails (one seed of two), b passes on its one run
    assert lines[2] == (
        "| a | 2,972 checks, 50 s | not found (12,783 checks, 301 s; interrupted at the bound) | FAIL |"
    )
    assert lines[3] == "| b | 19 s (one run, no seed) | - | ok |"
