"""Measured matmul choices per GPU class: none measured yet."""

MEASURED: dict[str, tuple[tuple[int, int, int, bool, bool], ...]] = {}
