"""The job's life has one owner (SPEC 16): its transitions as declared, and nobody else writing.

The scan reads the package's and the handlers' source: a statement that writes `photo_jobs`, or a
photo's processing columns, anywhere but `photo_publish.jobs.machine` fails this test.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from photo_publish.adapters.tables import photo_jobs
from photo_publish.jobs import machine

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "shared" / "photo_publish"
OWNER = PACKAGE / "jobs" / "machine.py"
# The photo's columns its processing decides (the rest are its rendition: size, variants, placeholder).
PROCESSING = {"processing_state", "visibility", "published_at", "error_code"}
JOB_TABLES = {"photo_jobs", "PhotoJob"}
PHOTO_TABLES = {"photos", "Photo"}
RAW_WRITE = re.compile(r"\b(UPDATE|INSERT\s+INTO|DELETE\s+FROM)\s+photo_jobs\b", re.IGNORECASE)


def _sources() -> list[Path]:
    # Not the migrations: they change the schema (and normalise old rows) before any function runs.
    migrations = PACKAGE / "migrations"
    code = [path for path in PACKAGE.rglob("*.py") if migrations not in path.parents]
    return [*code, *(ROOT / "functions").glob("*/app.py")]


def _table_of(node: ast.expr) -> str | None:
    """`photo_jobs` for `update(photo_jobs)`, `insert(PhotoJob)`, `photo_jobs.insert()`, ..."""
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("update", "insert", "delete") and node.args:
            target = node.args[0]
            if isinstance(target, ast.Name):
                return target.id
            if isinstance(target, ast.Attribute):
                return target.attr
        if isinstance(func, ast.Attribute):
            if func.attr in ("insert", "update", "delete") and isinstance(func.value, ast.Name):
                return func.value.id
            return _table_of(func.value)
    return None


def writes(source: str) -> list[str]:
    """Each write to a job, or to a photo's processing columns, in `source`: `line: what`."""
    found = [
        f"{source.count(chr(10), 0, m.start()) + 1}: SQL {m.group(0)}" for m in RAW_WRITE.finditer(source)
    ]
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        table = _table_of(node)
        if table in JOB_TABLES and isinstance(node.func, ast.Name | ast.Attribute):
            is_root = isinstance(node.func, ast.Name) or node.func.attr in ("insert", "update", "delete")
            if is_root:
                found.append(f"{node.lineno}: {table}")
        if (
            table in PHOTO_TABLES
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "values"
            and (columns := {k.arg for k in node.keywords if k.arg} & PROCESSING)
        ):
            found.append(f"{node.lineno}: {table} {sorted(columns)}")
    return found


def test_no_module_but_the_job_machine_writes_a_job_or_a_photos_processing_columns() -> None:
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in _sources()
        if path != OWNER and (found := writes(path.read_text()))
    }
    assert offenders == {}


@pytest.mark.parametrize(
    "snippet",
    [
        "connection.execute(update(photo_jobs).where(x).values(status='done'))",
        "connection.execute(insert(PhotoJob).values(photo_id=p))",
        "connection.execute(photo_jobs.update().values(attempt=0))",
        "connection.execute(update(photos).where(y).values(processing_state='ready'))",
        "connection.execute(text('update photo_jobs set status = 1'))",
    ],
)
def test_the_scan_sees_each_way_of_writing_those_columns(snippet: str) -> None:
    # A control: the scan above passes only because it finds nothing, so it must find these.
    assert writes(snippet)


def test_the_scan_leaves_reads_and_a_photos_rendition_alone() -> None:
    assert not writes("select(photo_jobs.c.status).where(photo_jobs.c.photo_id == p)")
    assert not writes("update(photos).where(p).values(width=1, entity_version=photos.c.entity_version + 1)")


def test_the_machine_writes_both_tables_itself() -> None:
    assert writes(OWNER.read_text())


@pytest.mark.parametrize("transition", machine.TRANSITIONS.values(), ids=lambda t: t.name)
def test_a_transition_to_another_status_sets_every_column_a_status_decides(
    transition: machine.Transition,
) -> None:
    if set(transition.target) != set(transition.source) and "-" not in transition.source + transition.target:
        assert transition.sets >= machine.STATE
    assert transition.sets <= set(photo_jobs.c.keys())


def test_a_statement_that_does_not_set_its_declared_columns_is_refused() -> None:
    with pytest.raises(AssertionError, match="missing"):
        machine._values(machine.RELEASE, status="pending")


# The operators' guide holds the table (docs/operating.md, "The job's life").
GUIDE = ROOT / "docs" / "operating.md"
TABLE_HEAD = "| transition | from | to | when | sets |"


def table_rows() -> list[str]:
    """The guide's rows for the declared transitions, in declaration order."""

    def sets(transition: machine.Transition) -> str:
        extra = sorted(transition.sets - machine.STATE)
        if transition.sets >= machine.STATE:
            return ", ".join(["every state column", *(f"`{c}`" for c in extra)])
        if transition.target == ("-",):
            return "the row is deleted"
        return ", ".join(f"`{c}`" for c in sorted(transition.sets)) or "a new row: every column its default"

    def statuses(names: tuple[str, ...]) -> str:
        return " or ".join("(none)" if n == "-" else f"`{n}`" for n in names)

    return [
        f"| `{t.name}` | {statuses(t.source)} | {statuses(t.target)} | {t.when} | {sets(t)} |"
        for t in machine.TRANSITIONS.values()
    ]


def test_the_guides_table_of_the_job_machine_is_the_code() -> None:
    lines = GUIDE.read_text().splitlines()
    start = lines.index(TABLE_HEAD) + 2
    end = next(i for i in range(start, len(lines) + 1) if i == len(lines) or not lines[i].startswith("|"))
    # Every transition the code declares, as declared, and no row the code does not have.
    assert lines[start:end] == table_rows()


if __name__ == "__main__":
    print(TABLE_HEAD, "| --- | --- | --- | --- | --- |", *table_rows(), sep="\n")
