# One command per habit. Each installs what it needs first (scripts/deps.sh).
SHELL := /bin/bash
export PATH := $(HOME)/.local/bin:$(PATH)
PYTEST_ARGS ?=

.PHONY: deps up test lint bench fmt soak

deps:
	@./scripts/deps.sh

up: deps
	uv run bullpen up

test:
	@./scripts/deps.sh --browser
	uv run pytest $(PYTEST_ARGS)

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

# SK-1: a 10-minute mixed soak on PostgreSQL (memory, descriptors, connections, tables flat).
soak: deps
	BULLPEN_SOAK_S=$${BULLPEN_SOAK_S:-600} uv run pytest tests/faults/test_soak.py -s -p no:cacheprovider
