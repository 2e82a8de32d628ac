"""The edges: S3, SQS, the database engine, the tables."""
