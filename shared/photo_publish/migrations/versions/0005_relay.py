"""The outbox relay (SPEC 12): its two scans follow the rows due, not the table.

- outbox_events_unpublished_photo_idx (aggregate_id, created_at) WHERE published_at IS NULL: a
  photo's waiting events, oldest first. The relay sends an event only once every older event of
  its photo was accepted (consumers see a photo's events in order, whatever failed in between),
  and the process function's hand-off finds its photo's waiting event by it.
- outbox_events_published_idx (published_at) WHERE published_at IS NOT NULL: the published rows
  past the retention, deleted in bounded batches, found without reading the rest.

The relay's main scan, unpublished rows oldest first, uses outbox_events_unpublished_idx (0001).

Revision ID: 0005
Revises: 0004
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE INDEX outbox_events_unpublished_photo_idx ON outbox_events (aggregate_id, created_at)
            WHERE published_at IS NULL;
        CREATE INDEX outbox_events_published_idx ON outbox_events (published_at)
            WHERE published_at IS NOT NULL;
    """)
