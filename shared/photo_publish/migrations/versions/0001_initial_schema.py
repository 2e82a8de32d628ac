"""The tables of SPEC 4: photos, photo_variants, photo_jobs, outbox_events.

Revision ID: 0001
Revises:
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Frozen here on purpose: a new error code is a migration of its own (SPEC 4).
ERROR_CODES = """(
    'ORIGINAL_NOT_FOUND', 'ORIGINAL_TOO_LARGE', 'UNSUPPORTED_FORMAT', 'DECODE_FAILED',
    'DIMENSIONS_EXCEEDED', 'ENCODE_FAILED', 'STORAGE_READ_FAILED', 'STORAGE_WRITE_FAILED',
    'DATABASE_UNAVAILABLE', 'TIME_BUDGET_EXCEEDED', 'PHOTO_NOT_FOUND', 'UNEXPECTED_ERROR',
    'WORKER_LOST')"""


def upgrade() -> None:
    op.execute(f"""
        CREATE TABLE photos (
            id               uuid PRIMARY KEY,
            album_id         uuid NOT NULL,
            original_key     text NOT NULL,
            processing_state text NOT NULL DEFAULT 'uploaded',
            visibility       text NOT NULL DEFAULT 'unpublished',
            published_at     timestamptz,
            width            integer,
            height           integer,
            error_code       text,
            entity_version   integer NOT NULL DEFAULT 1,
            created_at       timestamptz NOT NULL DEFAULT now(),
            updated_at       timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT photos_original_key_key UNIQUE (original_key),
            CONSTRAINT photos_processing_state_check
                CHECK (processing_state IN ('uploaded', 'ready', 'processing_failed')),
            CONSTRAINT photos_visibility_check CHECK (visibility IN ('unpublished', 'published')),
            CONSTRAINT photos_error_code_check CHECK (error_code IN {ERROR_CODES})
        );
        CREATE INDEX ix_photos_album_id ON photos (album_id);

        CREATE TABLE photo_variants (
            photo_id        uuid NOT NULL REFERENCES photos (id) ON DELETE CASCADE,
            kind            text NOT NULL,
            storage_key     text NOT NULL,
            width           integer NOT NULL,
            height          integer NOT NULL,
            bytes           integer NOT NULL,
            content_type    text NOT NULL,
            variant_version integer NOT NULL,
            created_at      timestamptz NOT NULL DEFAULT now(),
            updated_at      timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (photo_id, kind),
            CONSTRAINT photo_variants_kind_check CHECK (kind IN ('thumb', 'browse'))
        );

        CREATE TABLE photo_jobs (
            photo_id        uuid PRIMARY KEY REFERENCES photos (id) ON DELETE CASCADE,
            status          text NOT NULL DEFAULT 'pending',
            attempt         integer NOT NULL DEFAULT 0,
            next_retry_at   timestamptz,
            claimed_at      timestamptz,
            enqueued_at     timestamptz,
            last_error_code text,
            created_at      timestamptz NOT NULL DEFAULT now(),
            updated_at      timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT photo_jobs_status_check CHECK (status IN ('pending', 'active', 'done', 'failed')),
            CONSTRAINT photo_jobs_last_error_code_check CHECK (last_error_code IN {ERROR_CODES}),
            CONSTRAINT photo_jobs_attempt_check CHECK (attempt >= 0)
        );

        CREATE TABLE outbox_events (
            id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
            aggregate_type text NOT NULL,
            aggregate_id   uuid NOT NULL,
            event_type     text NOT NULL,
            payload        jsonb NOT NULL,
            created_at     timestamptz NOT NULL DEFAULT now(),
            published_at   timestamptz
        );
        CREATE INDEX ix_outbox_events_aggregate_id ON outbox_events (aggregate_id);
        CREATE INDEX outbox_events_unpublished_idx ON outbox_events (created_at) WHERE published_at IS NULL;
    """)
