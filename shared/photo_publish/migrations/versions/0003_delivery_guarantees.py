"""Delivery guarantees: a dead letter owed until one is accepted, and the upload a job last saw.

- photo_jobs.dead_letter_owed_at: set in the transaction that marks a final failure and cleared
  once the dead-letter queue accepted its message; a redelivery, or the sweep, sends an owed one
  (SPEC 5: a failing send or a run that dies in between never loses a dead letter). It is also
  the lease of whoever is sending it. The partial index keeps the sweep's scan to owed rows.
- photo_jobs.upload_sequencer / upload_etag: the newest upload of the original that reached the
  job; a failed job is reopened only by a newer upload, never by a duplicate of the same event.
- photo_jobs.failed_at: when the job failed; where the job has seen no upload yet, an upload
  event from before its failure is no new proof (the failed attempts read that object).

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        ALTER TABLE photo_jobs
            ADD COLUMN dead_letter_owed_at timestamptz,
            ADD COLUMN upload_sequencer text,
            ADD COLUMN upload_etag text,
            ADD COLUMN failed_at timestamptz;
        CREATE INDEX photo_jobs_dead_letter_owed_idx ON photo_jobs (dead_letter_owed_at)
            WHERE dead_letter_owed_at IS NOT NULL;
    """)
