"""A new error code, RENDER_TIME_EXCEEDED: a render stopped at its own time limit (SPEC 3).

The CHECK constraints of photos.error_code and photo_jobs.last_error_code are recreated with it.

Revision ID: 0004
Revises: 0003
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# Frozen here on purpose, as in 0001: a new error code is a migration of its own (SPEC 4).
BEFORE = (
    "ORIGINAL_NOT_FOUND",
    "ORIGINAL_TOO_LARGE",
    "UNSUPPORTED_FORMAT",
    "DECODE_FAILED",
    "DIMENSIONS_EXCEEDED",
    "ENCODE_FAILED",
    "STORAGE_READ_FAILED",
    "STORAGE_WRITE_FAILED",
    "DATABASE_UNAVAILABLE",
    "TIME_BUDGET_EXCEEDED",
    "PHOTO_NOT_FOUND",
    "UNEXPECTED_ERROR",
    "WORKER_LOST",
)
AFTER = (*BEFORE, "RENDER_TIME_EXCEEDED")
CONSTRAINTS = (
    ("photos", "photos_error_code_check", "error_code"),
    ("photo_jobs", "photo_jobs_last_error_code_check", "last_error_code"),
)


def upgrade() -> None:
    listed = ", ".join(f"'{code}'" for code in AFTER)
    for table, name, column in CONSTRAINTS:
        # One statement per table: the old constraint goes and the new one comes in one lock.
        op.execute(
            f"ALTER TABLE {table} DROP CONSTRAINT {name}, ADD CONSTRAINT {name} CHECK ({column} IN ({listed}))"
        )
