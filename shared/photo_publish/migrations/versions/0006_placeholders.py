"""Placeholders (SPEC 13): each published photo's ThumbHash and average colour.

Set by the publish transaction, carried by photo.published (schema version 2). Nullable: photos
published before this migration have none until they are rendered again.

Revision ID: 0006
Revises: 0005
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        ALTER TABLE photos
            ADD COLUMN thumbhash text,
            ADD COLUMN average_color text
                CONSTRAINT photos_average_color_check CHECK (average_color ~ '^#[0-9a-f]{6}$');
    """)
