"""Tests on the 3-node RabbitMQ 4.3 cluster (``make cluster-test``; not part of ``make test``)."""
