"""Root test configuration: server fixtures live in ``tests/support`` and are loaded as plugins,
so every test directory can ask for a real broker, PostgreSQL or Spark by fixture name."""

pytest_plugins = [
    "tests.support.rabbitmq",
    "tests.support.postgres",
    "tests.support.spark",
    "tests.support.s3",
    "tests.support.ledgers",
]


_CLUSTER_TESTS = __import__("pathlib").Path(__file__).resolve().parent / "cluster"


def pytest_ignore_collect(collection_path: object, config: object) -> bool | None:
    """Leave tests/cluster (three extra broker nodes) out of the default run: ``make cluster-test``
    runs it, as does naming the directory on the command line."""
    import os
    from pathlib import Path

    path = Path(str(collection_path)).resolve()
    if path != _CLUSTER_TESTS or os.environ.get("STREAMLEDGER_CLUSTER_TESTS"):
        return None
    named = [Path(str(a).split("::")[0]).resolve() for a in getattr(config, "args", [])]
    return not any(a == path or path in a.parents for a in named)
