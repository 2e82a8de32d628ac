"""The trust boundary (SPEC 19): albums kept to their users, erasures that reach the CDN.

- albums: under a JWT authorizer an album belongs to the user who first registered into it; one the
  backend (AWS_IAM) registered into first is the backend's (owner null) and no user's to claim, even
  once emptied. Existing albums: the backend's where it registered any of their photos, else the
  subject of their earliest photo.
- album_members: the users the backend shared an album with; they may register into it too.
- cdn_invalidations: the CDN paths (one wildcard a photo) a deletion, hide or rejection still has
  to invalidate; the sweep sends them in batches and deletes the rows CloudFront accepted, so a
  refused call is tried again at its next run.

Revision ID: 0013
Revises: 0012
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE albums (
            id         uuid PRIMARY KEY,
            owner      text CHECK (owner <> ''),
            created_at timestamptz NOT NULL DEFAULT now()
        );
        CREATE TABLE album_members (
            album_id   uuid NOT NULL REFERENCES albums (id) ON DELETE CASCADE,
            member     text NOT NULL CHECK (member <> ''),
            created_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (album_id, member)
        );
        INSERT INTO albums (id, owner, created_at)
        SELECT album_id,
               CASE WHEN bool_or(owner IS NULL OR owner = '') THEN NULL
                    ELSE (array_agg(owner ORDER BY created_at, id))[1] END,
               min(created_at)
          FROM photos
         GROUP BY album_id;
        CREATE TABLE cdn_invalidations (
            path         text PRIMARY KEY,
            requested_at timestamptz NOT NULL DEFAULT now(),
            attempts     integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
            next_try_at  timestamptz NOT NULL DEFAULT now()
        );
        CREATE INDEX cdn_invalidations_due_idx ON cdn_invalidations (next_try_at);
    """)


def downgrade() -> None:
    op.execute("DROP TABLE cdn_invalidations; DROP TABLE album_members; DROP TABLE albums;")
