"""The relay leases the rows it sends instead of locking them across PutEvents (SPEC 19).

- outbox_events.leased_until: set, in a short transaction that commits before the call, on the rows
  a relay (or a hand-off) is about to send; another relay skips them until then. Accepted rows are
  marked published and unleased after the call, refused ones unleased; a relay that dies between
  the two leaves its rows to be sent again once the lease has passed (a duplicate with the same
  eventId, never a loss). No network call is made while a transaction holds a row lock.

Revision ID: 0015
Revises: 0014
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        ALTER TABLE outbox_events
            ADD COLUMN leased_until timestamptz,
            ADD CONSTRAINT outbox_events_lease_check CHECK (leased_until IS NULL OR published_at IS NULL);
    """)


def downgrade() -> None:
    op.execute("ALTER TABLE outbox_events DROP COLUMN leased_until")
