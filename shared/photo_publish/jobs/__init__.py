"""The job's life: its state machine (every write to a job), the sweep and the backfill."""
