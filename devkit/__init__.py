"""Local running: an S3 + SQS endpoint, a PostgreSQL, the event-source poller and the demo."""
