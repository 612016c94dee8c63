"""Root test configuration: server fixtures live in ``tests/support`` and are loaded as plugins,
so every test directory can ask for a real broker, PostgreSQL or Spark by fixture name."""

pytest_plugins = [
    "tests.support.rabbitmq",
    "tests.support.postgres",
    "tests.support.spark",
]
