# The two commands of README.md: `make run` and `make test`. Both set up the environment first (idempotent).
SHELL := /bin/bash
ENV := . scripts/env.sh
PYTEST_ARGS ?=
ARGS ?=

.PHONY: setup run test lint bench clean
setup:
	@bash scripts/setup_env.sh

run: setup
	@$(ENV) && python -m bolt_ros.bringup --console $(ARGS)

test: setup
	@$(ENV) && ruff check . && python -m pytest -q $(PYTEST_ARGS)

lint: setup
	@$(ENV) && ruff check .

clean:
	rm -rf build install log
