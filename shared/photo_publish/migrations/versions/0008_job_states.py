"""The job's life in one place (SPEC 16): the tables refuse what no state allows.

- photo_jobs: a claimed time exactly on an active job (attempt >= 1), a retry time and a sweep's
  stamp only on a pending one, a failure time and an error code on every failed one, an owed dead
  letter only on a failed one. Rows written before this revision are brought into those shapes
  first: a letter recorded as owed on a job that is no longer failed is for a failure that was
  taken back (a retry, a reopening upload, a resumed backfill) and would page for a photo that is
  not failed, so it is dropped.
- photos: an error code exactly on a `processing_failed` photo; `ready` exactly when `published`.
- photo_jobs.upload_sequencer: stored left-padded to 40 characters until now, which is not S3's
  order (the shorter sequencer is right-padded). Their original length cannot be recovered (S3's
  sequencers begin with real zeros), so they are cleared: until a job's next upload, the eTag and
  the failure's time tell a new upload from a repeated one.
- photo_jobs.upload_at: the newest upload's event time, beside its sequencer and eTag.
- photo_jobs.attempt_sequencer / attempt_etag / attempt_upload_at / attempt_started_at: the upload
  the last claimed attempt worked from, and when it started. A failed job is reopened only by an
  upload newer than its failed attempt's (not than the newest upload seen: one announced while the
  attempt was rendering older bytes must still reopen it). Filled from the newest upload seen.
- retired_variants.event_id: the photo.variants_updated event that told consumers of the new keys;
  the old objects are deleted only once it has left the outbox, a grace period ago.

Revision ID: 0008
Revises: 0007
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        UPDATE photo_jobs SET claimed_at = NULL WHERE status <> 'active';
        UPDATE photo_jobs SET claimed_at = updated_at WHERE status = 'active' AND claimed_at IS NULL;
        UPDATE photo_jobs SET attempt = 1 WHERE status = 'active' AND attempt = 0;
        UPDATE photo_jobs SET next_retry_at = NULL, enqueued_at = NULL WHERE status <> 'pending';
        UPDATE photo_jobs SET dead_letter_owed_at = NULL, failed_at = NULL WHERE status <> 'failed';
        UPDATE photo_jobs j SET failed_at = coalesce(j.failed_at, j.updated_at),
            last_error_code = coalesce(j.last_error_code, p.error_code, 'UNEXPECTED_ERROR')
            FROM photos p WHERE p.id = j.photo_id AND j.status = 'failed';
        UPDATE photo_jobs SET upload_sequencer = NULL;
        ALTER TABLE photo_jobs ADD COLUMN upload_at timestamptz, ADD COLUMN attempt_sequencer text,
            ADD COLUMN attempt_etag text, ADD COLUMN attempt_upload_at timestamptz,
            ADD COLUMN attempt_started_at timestamptz;
        UPDATE photo_jobs SET attempt_etag = upload_etag,
            attempt_started_at = CASE WHEN attempt > 0 THEN coalesce(claimed_at, failed_at) END;
        ALTER TABLE photo_jobs
            ADD CONSTRAINT photo_jobs_claimed_check
                CHECK ((status = 'active') = (claimed_at IS NOT NULL) AND (status <> 'active' OR attempt >= 1)),
            ADD CONSTRAINT photo_jobs_pending_check
                CHECK (status = 'pending' OR (next_retry_at IS NULL AND enqueued_at IS NULL)),
            ADD CONSTRAINT photo_jobs_failed_check
                CHECK ((status = 'failed') = (failed_at IS NOT NULL)
                       AND (status <> 'failed' OR last_error_code IS NOT NULL)),
            ADD CONSTRAINT photo_jobs_dead_letter_check
                CHECK (dead_letter_owed_at IS NULL OR status = 'failed');

        UPDATE photos SET error_code = NULL WHERE processing_state <> 'processing_failed';
        UPDATE photos SET error_code = 'UNEXPECTED_ERROR'
            WHERE processing_state = 'processing_failed' AND error_code IS NULL;
        ALTER TABLE photos
            ADD CONSTRAINT photos_error_code_state_check
                CHECK ((processing_state = 'processing_failed') = (error_code IS NOT NULL)),
            ADD CONSTRAINT photos_published_check
                CHECK ((processing_state = 'ready') = (visibility = 'published')
                       AND (processing_state <> 'ready' OR published_at IS NOT NULL));

        ALTER TABLE retired_variants ADD COLUMN event_id uuid;
    """)


def downgrade() -> None:
    op.execute("""
        ALTER TABLE retired_variants DROP COLUMN event_id;
        ALTER TABLE photo_jobs DROP COLUMN attempt_started_at, DROP COLUMN attempt_upload_at,
            DROP COLUMN attempt_etag, DROP COLUMN attempt_sequencer, DROP COLUMN upload_at;
        ALTER TABLE photos DROP CONSTRAINT photos_published_check,
            DROP CONSTRAINT photos_error_code_state_check;
        ALTER TABLE photo_jobs DROP CONSTRAINT photo_jobs_dead_letter_check,
            DROP CONSTRAINT photo_jobs_failed_check, DROP CONSTRAINT photo_jobs_pending_check,
            DROP CONSTRAINT photo_jobs_claimed_check;
    """)
