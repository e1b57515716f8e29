"""Throughput benchmarks: python -m experiments.benchmarks.<name> --help."""
