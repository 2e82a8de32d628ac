# Every target does its own set-up: a virtual environment in .venv with the pinned tools.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The layout the Lambda runtime sees (handler folder + /opt/python from the layers), plus devkit.
export PYTHONPATH := functions/process:shared:.
# libvips under glibc fragments memory in long-lived processes; Lambda gets the same setting.
export MALLOC_ARENA_MAX := 2

.PHONY: help venv demo test unit integration e2e test-postgres15 test-localstack lint typecheck migrate bench build clean

help:
	@echo "make demo      the local flow end to end: upload photos, publish them, write a report"
	@echo "make test      lint, types and every test (embedded PostgreSQL, moto's server)"
	@echo "make test-localstack  the S3/SQS tests against a real LocalStack on the host (Python 3.13)"
	@echo "make migrate   apply the migrations to DATABASE_URL"
	@echo "make bench     render benchmark against peers measured in the same run"
	@echo "make build     sam build"

$(BIN)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt -r requirements-dev.txt
	touch $@

venv: $(BIN)/.installed

demo: venv
	$(BIN)/python -m devkit.demo

test: lint typecheck
	$(BIN)/python -m pytest -q --ignore=tests/localstack

unit: venv
	$(BIN)/python -m pytest -q tests/unit

integration: venv
	$(BIN)/python -m pytest -q tests/integration

e2e: venv
	$(BIN)/python -m pytest -q tests/e2e_local

# The database tests again, against the PostgreSQL 15 server these machines run (Aurora runs 15/16).
test-postgres15: venv
	DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres $(BIN)/python -m pytest -q tests/integration

# The publish path, retries, the dead-letter queue and the operator's redrive against a real
# LocalStack (S3 + SQS) started on the host without Docker; scripts/localstack builds its Python 3.13
# environment (.venv-localstack), starts it on 127.0.0.1:4566 and stops it afterwards.
test-localstack: venv
	scripts/localstack $(BIN)/python -m pytest -q -m localstack tests/localstack

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

migrate: venv
	@test -n "$$DATABASE_URL" || (echo "set DATABASE_URL" && exit 2)
	$(BIN)/alembic upgrade head

bench: venv
	$(BIN)/python -m benchmarks.render
	$(BIN)/python -m benchmarks.sweep
	$(BIN)/python -m benchmarks.heic

build: venv
	$(BIN)/python -m pip install --quiet aws-sam-cli
	$(BIN)/sam build

clean:
	rm -rf $(VENV) .aws-sam .local demo-output .pytest_cache .mypy_cache .ruff_cache
