"""Generators of the tiny random-weight checkpoints of each served architecture (see __main__.py)."""
