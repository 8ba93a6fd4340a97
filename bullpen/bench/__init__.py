"""Benchmark tooling: load stages, the simulated provider and the `bullpen bench` runner."""
