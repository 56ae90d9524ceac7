"""Benchmarks: every figure is a ratio or distribution measured side by side in one run."""
