"""The one Logger and Metrics of a container, shared by the handlers and the services.

No X-Ray SDK (Powertools' Tracer): its recorder builds two botocore clients at import, about
450 ms of every cold start, and the SDK is in maintenance mode since February 2026. The template's
`Tracing: Active` still gives each invocation its X-Ray segment (init, invocation, overhead), and
each record's log line carries its step timings (claim, render, store, commit).
"""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics

# Keys of one record (photo_id, album_id, message_id, attempt) are thread-local: the records of a
# batch may be worked on side by side.
logger = Logger()
metrics = Metrics()
