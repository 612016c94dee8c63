"""Fixtures for rabbitmq (filled in by its owner)."""
