"""Chaos under a real scheduler (``make chaos``, ``python -m tests.chaos``): see ``harness.py``."""
