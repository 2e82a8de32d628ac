"""Indexes for the sweep: its cost follows the work due, not the size of the tables.

Both are partial: a table of millions of finished jobs keeps them out of the index entirely, and
each index is ordered the way the sweep reads it (oldest due first, oldest claim first).

Revision ID: 0002
Revises: 0001
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE INDEX photo_jobs_pending_due_idx ON photo_jobs ((coalesce(next_retry_at, created_at)))
            WHERE status = 'pending';
        CREATE INDEX photo_jobs_active_claimed_idx ON photo_jobs (claimed_at)
            WHERE status = 'active';
    """)
