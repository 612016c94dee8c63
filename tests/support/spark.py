"""Fixtures for spark (filled in by its owner)."""
