"""Recipes and backfill (SPEC 14).

- variant_recipes: each VARIANT_VERSION's fingerprint (and the recipe it hashes), recorded by the
  first function that renders it; a function whose settings hash differently refuses to render.
- photos.variant_version: the version of the photo's published variants (from its rows, here).
- photo_jobs.rerender_to: a backfill's mark on a published photo's finished job; the sweep turns a
  bounded number of marked jobs back into pending ones while the queue is short.
- retired_variants: a replaced version's objects, deleted by the sweep after a grace period (never
  before the transaction that replaced them committed: they are written by it).

Revision ID: 0007
Revises: 0006
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE variant_recipes (
            version     integer PRIMARY KEY CHECK (version >= 1),
            fingerprint text NOT NULL,
            recipe      jsonb NOT NULL,
            created_at  timestamptz NOT NULL DEFAULT now()
        );
        ALTER TABLE photos ADD COLUMN variant_version integer;
        UPDATE photos SET variant_version = v.variant_version
            FROM photo_variants v WHERE v.photo_id = photos.id AND v.kind = 'browse';
        ALTER TABLE photo_jobs ADD COLUMN rerender_to integer;
        -- The sweep's backfill scan: marked jobs waiting to be sent, and the count of those left.
        CREATE INDEX photo_jobs_rerender_idx ON photo_jobs (photo_id)
            WHERE rerender_to IS NOT NULL AND status = 'done';
        CREATE TABLE retired_variants (
            storage_key  text PRIMARY KEY,
            photo_id     uuid NOT NULL,
            delete_after timestamptz NOT NULL
        );
        CREATE INDEX retired_variants_due_idx ON retired_variants (delete_after);
    """)
