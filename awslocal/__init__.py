"""Run it as AWS runs it: `sam local invoke` in Lambda containers and `sam deploy` into LocalStack."""
