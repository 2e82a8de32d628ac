"""The one Logger, Tracer and Metrics of a container, shared by the handlers and the services."""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics, Tracer

# Keys of one record (photo_id, album_id, message_id, attempt) are thread-local: the records of a
# batch may be worked on side by side.
logger = Logger()
tracer = Tracer()
metrics = Metrics()
