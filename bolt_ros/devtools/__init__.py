"""Tools for tests and benchmarks (test-model writers); never imported by the runtime."""
