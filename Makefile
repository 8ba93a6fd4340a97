# One command per habit. Each installs what it needs first (scripts/deps.sh).
SHELL := /bin/bash
export PATH := $(HOME)/.local/bin:$(PATH)
PYTEST_ARGS ?=
# pytest-xdist workers: tests wait on sockets, databases and child processes, so more workers
# than cores pays (measured in docs/testing.md).
TEST_WORKERS ?= 4
export TEST_WORKERS

.PHONY: deps up test test-fast lint bench fmt soak screenshots

deps:
	@./scripts/deps.sh

up: deps
	uv run bullpen up

# Everything, both backends and the browser: a parallel phase, then the `serial` tests alone.
test:
	@./scripts/deps.sh --browser
	./scripts/test.sh $(PYTEST_ARGS)

# The inner loop: unit, contract and integration tests on SQLite, in parallel; no test that
# needs PostgreSQL, and none of the timing-bound `serial` ones (make test runs those).
test-fast: deps
	uv run pytest -n $(TEST_WORKERS) --dist worksteal \
		-m "(unit or contract or integration) and not postgres and not serial" $(PYTEST_ARGS)

lint: deps
	uv run ruff check bullpen tests
	uv run ruff format --check bullpen tests
	uv run mypy bullpen
	uv run lint-imports --no-cache
	uv run python scripts/secret_scan.py

fmt: deps
	uv run ruff check --fix bullpen tests
	uv run ruff format bullpen tests

bench: deps
	uv run bullpen bench --backend sqlite
	uv run bullpen bench --backend postgres

# SK-1: a 10-minute mixed soak on PostgreSQL (memory, descriptors, connections, tables flat),
# then SK-2's SSE churn at its full 20,000 cycles of a task's stream (`make test` runs 5,000).
soak: deps
	BULLPEN_SOAK_S=$${BULLPEN_SOAK_S:-600} uv run pytest tests/faults/test_soak.py \
		tests/integration/streams/test_sse_churn.py -s -p no:cacheprovider

# The dashboard's screenshots in docs/screenshots/ (the README shows some): a seeded demo
# workspace in Chromium, one PNG a page (tests/e2e/test_screenshots.py).
screenshots:
	@./scripts/deps.sh --browser
	BULLPEN_SCREENSHOTS=1 uv run pytest tests/e2e/test_screenshots.py -p no:cacheprovider -q
