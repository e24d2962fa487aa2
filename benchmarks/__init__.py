"""Benchmarks of offrecomp against its peers (run them as modules: python -m benchmarks.X)."""
