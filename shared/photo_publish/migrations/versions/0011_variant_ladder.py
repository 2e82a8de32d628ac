"""The responsive ladder (SPEC 18): photo_variants.kind takes the ladder's steps.

A step's kind is `w{long edge}-{format}` (`w640-webp`, `w640-avif`; keys.py): one row a step and
format, so (photo_id, kind) stays unique with two formats. The long edges are a setting
(VARIANT_WIDTHS), so the CHECK takes the shape, not a list.

Revision ID: 0011
Revises: 0010
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        ALTER TABLE photo_variants DROP CONSTRAINT photo_variants_kind_check;
        ALTER TABLE photo_variants ADD CONSTRAINT photo_variants_kind_check
            CHECK (kind IN ('thumb', 'browse') OR kind ~ '^w[1-9][0-9]{0,4}-(webp|avif)$');
    """)


def downgrade() -> None:
    # The ladder's rows go: the table held thumb and browse alone before.
    op.execute("""
        DELETE FROM photo_variants WHERE kind NOT IN ('thumb', 'browse');
        ALTER TABLE photo_variants DROP CONSTRAINT photo_variants_kind_check;
        ALTER TABLE photo_variants ADD CONSTRAINT photo_variants_kind_check
            CHECK (kind IN ('thumb', 'browse'));
    """)
