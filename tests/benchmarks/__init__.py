"""Tests of the benchmark harnesses under ``benchmarks/``."""
