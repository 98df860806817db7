"""Checks that need a process of their own (a fixed host device count, XLA command buffers,
compute-sanitizer), run from the repository root as `python -m tests.checks.<name>`."""
