"""Events leave the database: the payloads (contracts) and the relay to EventBridge."""
