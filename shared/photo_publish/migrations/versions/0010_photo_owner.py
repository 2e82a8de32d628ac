"""Who registered a photo, where the caller is an end user (SPEC 17, "Who may call").

- photos.owner: the JWT subject of the user whose token registered the photo, when the upload API
  runs behind a JWT authorizer; null when the app's backend registered it (AWS_IAM: the backend
  checked its user). Behind a JWT authorizer only the owner may read the photo's status or delete
  it: a photo's id is in every URL of its variants, and seeing an image must not be enough.

Revision ID: 0010
Revises: 0009
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE photos ADD COLUMN owner text")


def downgrade() -> None:
    op.execute("ALTER TABLE photos DROP COLUMN owner")
