"""Benchmarks and measurements run from a checkout (`python -m benchmarks ...`); not part of the installed package."""
