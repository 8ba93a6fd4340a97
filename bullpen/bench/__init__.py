"""Benchmark tooling: load stages and the `bullpen bench` runner, measured from outside."""
