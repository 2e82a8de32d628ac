"""Pinned originals (SPEC 19): which object version (or ETag) of its original a rendition was read from.

A form re-posted before it expires writes the original's key again. The process function reads the
upload its event names (the version, or the ETag with If-Match) and records what it read with the
published rendition, so that a later write to the key is seen as a new picture, rendered and
published as one, never taken for the picture already shown.

- photos.original_etag / original_version: the ETag (without quotes) and, in a versioned bucket, the
  version id of the original the published rendition was read from. Photos published before this
  migration get the ETag of the upload their publishing attempt worked from, where the job knows it.
- photo_jobs.upload_version / attempt_version: the version id of the newest upload that reached the
  job, and of the one its last claimed attempt worked from (beside their sequencer and ETag).

Revision ID: 0014
Revises: 0013
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        ALTER TABLE photos ADD COLUMN original_etag text, ADD COLUMN original_version text;
        ALTER TABLE photo_jobs ADD COLUMN upload_version text, ADD COLUMN attempt_version text;
        UPDATE photos SET original_etag = photo_jobs.attempt_etag
            FROM photo_jobs
            WHERE photo_jobs.photo_id = photos.id AND photos.processing_state = 'ready'
        ;
    """)


def downgrade() -> None:
    op.execute("""
        ALTER TABLE photo_jobs DROP COLUMN attempt_version, DROP COLUMN upload_version;
        ALTER TABLE photos DROP COLUMN original_version, DROP COLUMN original_etag;
    """)
