"""Benchmarks: resolution extrapolation, speed/memory/FLOPs, model cards."""
