"""Events leave the database: the writer adds their rows with the change, the relay sends them."""
