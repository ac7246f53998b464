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

# Tests that assert wall-clock rates/deadlines (marker `realtime`) run in fresh processes, one per file: in a process
# where other ROS or model tests had run, the simulated robot's 100 Hz timer was seen to fall to 20-28 Hz.
test: setup
	@$(ENV) && ruff check . && python -m pytest -q -m "not realtime" $(PYTEST_ARGS) \
		&& for f in $$(grep -l "mark.realtime" test/test_*.py); do python -m pytest -q -m realtime $$f || exit 1; done

lint: setup
	@$(ENV) && ruff check .

clean:
	rm -rf build install log
