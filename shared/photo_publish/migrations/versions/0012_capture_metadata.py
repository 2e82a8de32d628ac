"""Capture metadata (SPEC 18): when, with what and, where its user agreed, where a photo was taken.

Read from the photo's EXIF by its render and set by the publish (or re-render) transaction, carried
by photo.published (schema version 3). Every column is nullable: a photo says what it says, and
photos published before this migration have none until they are rendered again (a backfill).

- taken_at: the instant (DateTimeOriginal with OffsetTimeOriginal), only where the camera recorded
  its offset from UTC; taken_at_local: the camera's clock, with no zone, whenever it recorded a time.
- camera_make, camera_model, lens_model; f_number, exposure_time (seconds), iso, focal_length (mm).
- latitude, longitude (signed decimal degrees), altitude (metres, below sea level negative): only
  on a photo whose upload said its user agreed (keep_location, migration 0009); the table refuses
  them on any other.

Revision ID: 0012
Revises: 0011
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        ALTER TABLE photos
            ADD COLUMN taken_at       timestamptz,
            ADD COLUMN taken_at_local timestamp,
            ADD COLUMN camera_make    text,
            ADD COLUMN camera_model   text,
            ADD COLUMN lens_model     text,
            ADD COLUMN f_number       double precision,
            ADD COLUMN exposure_time  double precision,
            ADD COLUMN iso            integer,
            ADD COLUMN focal_length   double precision,
            ADD COLUMN latitude       double precision,
            ADD COLUMN longitude      double precision,
            ADD COLUMN altitude       double precision,
            ADD CONSTRAINT photos_taken_at_check CHECK (taken_at IS NULL OR taken_at_local IS NOT NULL),
            ADD CONSTRAINT photos_exposure_check
                CHECK (f_number > 0 AND exposure_time > 0 AND iso > 0 AND focal_length > 0),
            ADD CONSTRAINT photos_location_check CHECK (
                (latitude IS NULL) = (longitude IS NULL)
                AND (altitude IS NULL OR latitude IS NOT NULL)
                AND (latitude IS NULL OR (keep_location AND abs(latitude) <= 90 AND abs(longitude) <= 180))
            );
    """)


def downgrade() -> None:
    op.execute("""
        ALTER TABLE photos
            DROP COLUMN taken_at,
            DROP COLUMN taken_at_local,
            DROP COLUMN camera_make,
            DROP COLUMN camera_model,
            DROP COLUMN lens_model,
            DROP COLUMN f_number,
            DROP COLUMN exposure_time,
            DROP COLUMN iso,
            DROP COLUMN focal_length,
            DROP COLUMN latitude,
            DROP COLUMN longitude,
            DROP COLUMN altitude;
    """)
