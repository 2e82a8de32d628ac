"""Uploads registered by the product, and photos deleted (SPEC 17).

- photos.keep_location: the upload said its user agreed to keep the photo's location (SPEC 18
  reads it: GPS goes to the row and the payload only then, never to a variant).
- deleted_photos: what a deletion leaves behind on purpose, a tombstone. An event for the photo
  that arrives later (its upload's notification, a retry's message) is acknowledged instead of
  waited for, and the sweep deletes the photo's objects once more after `purge_after` (a worker
  whose render raced the deletion may have written variants after it), then keeps the tombstone
  until no message can still name the photo (the queue's retention).

Revision ID: 0009
Revises: 0008
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        ALTER TABLE photos ADD COLUMN keep_location boolean NOT NULL DEFAULT false;
        CREATE TABLE deleted_photos (
            photo_id     uuid PRIMARY KEY,
            album_id     uuid NOT NULL,
            original_key text NOT NULL,
            deleted_at   timestamptz NOT NULL DEFAULT now(),
            purge_after  timestamptz NOT NULL,
            purged_at    timestamptz
        );
        -- The sweep's scans: tombstones whose objects are due a last purge, and purged ones past
        -- their retention.
        CREATE INDEX deleted_photos_purge_idx ON deleted_photos (purge_after) WHERE purged_at IS NULL;
        CREATE INDEX deleted_photos_purged_idx ON deleted_photos (purged_at) WHERE purged_at IS NOT NULL;
    """)


def downgrade() -> None:
    op.execute("""
        DROP TABLE deleted_photos;
        ALTER TABLE photos DROP COLUMN keep_location;
    """)
