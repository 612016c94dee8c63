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


def pytest_runtest_logreport(report: object) -> None:
    """With STREAMLEDGER_TEST_TIMES=FILE, each phase's time is appended as the suite goes
    ("seconds phase nodeid"), so a profile of the suite's wall time survives a run cut short."""
    import os

    path = os.environ.get("STREAMLEDGER_TEST_TIMES")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(f"{getattr(report, 'duration', 0.0):.2f} {getattr(report, 'when', '?')} "
                      f"{getattr(report, 'nodeid', '?')}\n")


def pytest_sessionstart(session: object) -> None:
    """Import Airflow once, before any test runs. Its first import configures logging for the whole
    process (a root handler bound to whatever ``sys.stderr`` is at that moment): made inside a test
    that captures its output (``capfd``, an in-process CLI call that imports the operators), that
    handler outlives the capture and every later test's log line fails with "I/O operation on closed
    file" in its captured stderr. At session start it binds to the session's own capture instead."""
    import importlib.util

    if importlib.util.find_spec("airflow") is not None:
        import airflow  # noqa: F401
