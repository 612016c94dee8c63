"""Fixtures for postgres (filled in by its owner)."""
