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

# Tests that assert wall-clock rates/deadlines (marker `realtime`) run in a process of their own: in a process that
# has loaded a model, the ROS timers of the simulated robot were seen to fall from 100 Hz to ~28 Hz.
test: setup
	@$(ENV) && ruff check . && python -m pytest -q -m "not realtime" $(PYTEST_ARGS) \
		&& python -m pytest -q -m realtime $(PYTEST_ARGS)

lint: setup
	@$(ENV) && ruff check .

clean:
	rm -rf build install log
