# The two commands of README.md: `make run` and `make test`. Both set up the environment first (idempotent).
SHELL := /bin/bash
ENV := . scripts/env.sh
PYTEST_ARGS ?=
ARGS ?=

.PHONY: setup run test test-cpu-kinds lint bench clean
setup:
	@bash scripts/setup_env.sh

run: setup
	@$(ENV) && python -m bolt_ros.bringup --console $(ARGS)

# Tests that assert wall-clock rates/deadlines (marker `realtime`) run in fresh processes, one per file: in a process
# where other ROS or model tests had run, the simulated robot's 100 Hz timer was seen to fall to 20-28 Hz.
test: setup
	@$(ENV) && ruff check . && python -m pytest -q -m "not realtime" $(PYTEST_ARGS) \
		&& for f in $$(grep -l "mark.realtime" test/test_*.py); do python -m pytest -q -m realtime $$f || exit 1; done

# The numeric tests under the BLAS code paths other CPUs get: MKL picks its kernels by CPU (AMD and Intel differ), and
# MKL_CBWR makes this machine take another CPU's branch. Not part of `make test` (it runs those files 6 times).
NUMERIC_TESTS := test/test_engine.py test/test_fidelity.py test/test_gemma4_model.py test/test_dflash.py \
	test/test_linear.py test/test_quants.py test/test_kquant_pack.py test/test_kernels.py test/test_engine_triton.py \
	test/test_qwen2.py
CPU_KINDS := unset COMPATIBLE SSE4_2 AVX2 AVX512 AVX512_E1
test-cpu-kinds: setup
	@$(ENV) && for kind in $(CPU_KINDS); do \
		echo "[test-cpu-kinds] MKL_CBWR=$$kind"; \
		if [ $$kind = unset ]; then env -u MKL_CBWR python -m pytest -q $(NUMERIC_TESTS) $(PYTEST_ARGS) || exit 1; \
		else MKL_CBWR=$$kind python -m pytest -q $(NUMERIC_TESTS) $(PYTEST_ARGS) || exit 1; fi; \
	done

lint: setup
	@$(ENV) && ruff check .

clean:
	rm -rf build install log
