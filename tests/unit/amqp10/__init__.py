"""Unit tests of the AMQP 1.0 client: frames, URLs, management request shapes (no broker needed)."""
