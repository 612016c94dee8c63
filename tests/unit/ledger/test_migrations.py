"""Alembic migrations: upgrade and downgrade step by step, own version table, foreign tables left alone.
(Re-run on PostgreSQL by tests/integration/ledger/test_migrations_pg.py.)"""

from __future__ import annotations

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from streamledger.ledger import Ledger, LedgerError, migrate
from streamledger.ledger.engine import make_engine
from streamledger.migrations.revisions import SQL
from tests.unit.ledger.schema import snapshot
from tests.unit.ledger.util import SRC, run

LEDGER_TABLES = {"streamledger_pipeline", "streamledger_source", "streamledger_range"}


def tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_and_downgrade_step_by_step(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        # a foreign tenant (think: Airflow's metadata) with its own alembic_version table
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
            conn.execute(text("INSERT INTO alembic_version VALUES ('airflow_head')"))
            conn.execute(text("CREATE TABLE dag_run (id INTEGER PRIMARY KEY)"))
        assert migrate.current(engine) is None
        migrate.upgrade(engine, "0001_ledger_tables")
        assert migrate.current(engine) == "0001_ledger_tables"
        assert tables(db_url) >= LEDGER_TABLES
        migrate.upgrade(engine)
        assert migrate.current(engine) == migrate.head() == "0020_source_seen_chunk"
        migrate.upgrade(engine)  # idempotent
        with engine.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "airflow_head"
            assert conn.execute(text("SELECT version_num FROM streamledger_ledger_version")).scalar() == (
                "0020_source_seen_chunk"
            )
        led = Ledger(db_url)
        r = led.claim("p", SRC, 10, run(1), initial_start=0, max_span=5)
        assert (r.start, r.end) == (0, 5) and r.heartbeat_at is not None
        led.close()
        migrate.downgrade(engine, "0003_pg_claim_function")  # the 0003 claim works again
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM streamledger_range"))
        migrate.upgrade(engine)  # 0004, 0005, 0006 and 0008 again
        led = Ledger(db_url)
        r = led.claim("p", SRC, 10, run(1), initial_start=0)
        led.close()
        migrate.downgrade(engine, "0002_range_invariants")
        assert migrate.current(engine) == "0002_range_invariants"
        migrate.downgrade(engine, "0001_ledger_tables")  # drops the guards, keeps the data
        assert migrate.current(engine) == "0001_ledger_tables"
        with pytest.raises(LedgerError, match="at revision 0001_ledger_tables"):
            Ledger(db_url)
        with engine.begin() as conn:  # without the guards the database accepts a span change
            conn.execute(text("UPDATE streamledger_range SET end_offset = 11 WHERE id = :id"), {"id": r.id})
        migrate.upgrade(engine)
        with pytest.raises(Exception, match="immutable"), engine.begin() as conn:
            conn.execute(text("UPDATE streamledger_range SET end_offset = 12 WHERE id = :id"), {"id": r.id})
        migrate.downgrade(engine, "base")
        left = tables(db_url)
        assert not (LEDGER_TABLES & left)
        assert {"alembic_version", "dag_run"} <= left  # never touched
    finally:
        engine.dispose()


def test_upgrade_from_empty_and_through_the_chain_give_one_schema(db_url: str) -> None:
    """``upgrade head`` on an empty database, and a database brought to head one revision at a time
    with each revision undone and done again on the way (so every downgrade's restored function and
    trigger text is installed once and replaced again), hold one schema: tables, columns,
    constraints, indexes, triggers and the full definition of every function."""
    engine = make_engine(db_url)
    try:
        migrate.upgrade(engine)
        from_empty = snapshot(engine)
        migrate.downgrade(engine, "base")
        script = ScriptDirectory.from_config(migrate.alembic_config())
        for rev in reversed(list(script.walk_revisions())):
            migrate.upgrade(engine, rev.revision)
            if rev.down_revision is not None:
                migrate.downgrade(engine, str(rev.down_revision))
                migrate.upgrade(engine, rev.revision)
        assert migrate.current(engine) == migrate.head()
        assert snapshot(engine) == from_empty
    finally:
        engine.dispose()


def test_the_database_runs_the_newest_file_of_each_function(db_url: str) -> None:
    """Each PostgreSQL function at head is the newest version file of it (sql/<function>/NNNN.sql),
    character for character between its ``$$``; on SQLite each trigger is its newest file."""
    engine = make_engine(db_url)
    try:
        migrate.upgrade(engine)
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                names = sorted(d.name for d in SQL.iterdir() if d.name != "sqlite")
                rows = conn.execute(text("SELECT proname, prosrc FROM pg_proc WHERE proname = ANY(:names)"),
                                    {"names": names}).all()
                newest = {n: max((SQL / n).glob("*.sql")).read_text().split("$$")[1] for n in names}
            else:
                names = sorted(d.name for d in (SQL / "sqlite").iterdir())
                rows = conn.execute(text("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'")).all()
                newest = {n: max((SQL / "sqlite" / n).glob("*.sql")).read_text().strip() for n in names}
        assert {str(name): str(body) for name, body in rows} == newest
    finally:
        engine.dispose()


def test_0015_keeps_the_idle_runs_and_their_try(db_url: str) -> None:
    """0015 down and up again: the idle rows stay (rows of 0014 get try 1, the least any attempt
    had), and the claim of 0015 raises the try of an idle run answered "nothing new" again."""
    led = Ledger(db_url, create=True)
    try:
        first = led.claim("p", SRC, 3, run(1), initial_start=0)
        led.commit(first.id, records=3, first_seen=0, last_seen=2, output=None)
        assert not led.claim("p", SRC, 3, run(2, try_number=3)).recorded
        assert led.last_try("p", run(2)) == 3
    finally:
        led.close()
    engine = make_engine(db_url)
    try:
        migrate.downgrade(engine, "0014_idle_claims_unrecorded")
        migrate.upgrade(engine)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT run_id, try_number FROM streamledger_idle_run")).all() == [
                ("run-2", 1)]
    finally:
        engine.dispose()
    led = Ledger(db_url)
    try:
        assert not led.claim("p", SRC, 9, run(2, try_number=4)).recorded  # nothing again, try kept
        assert led.last_try("p", run(2)) == 4
    finally:
        led.close()


def test_0016_adds_and_drops_the_one_broker_records(db_url: str) -> None:
    """0016 down and up again: its table goes with its records (nothing else holds them) and comes
    back empty; a new record is written and read on the upgraded ledger, and a verdict on it."""
    led = Ledger(db_url, create=True)
    try:
        assert led.record_same_broker("p", "s", ["rabbitmq://a/%2F", "rabbitmq://b/%2F"], "found") == 2
    finally:
        led.close()
    engine = make_engine(db_url)
    try:
        migrate.downgrade(engine, "0015_idle_run_try")
        assert "streamledger_one_broker" not in tables(db_url)
        migrate.upgrade(engine)
    finally:
        engine.dispose()
    led = Ledger(db_url)
    try:
        assert led.same_broker() == []
        assert led.record_same_broker("p", "s", ["rabbitmq://a/%2F", "rabbitmq://b/%2F"], "again") == 2
        assert [r.why for r in led.same_broker("p")] == ["again", "again"]
        assert len(led.record_distinct_brokers("rabbitmq://a/%2F", "rabbitmq://b/%2F", pipeline="p")) == 1
        assert [(r.distinct, r.why) for r in led.same_broker("p")] == 2 * [(True, "")]
    finally:
        led.close()


def test_0017_records_the_try_a_committed_range_was_handed_back_to(db_url: str) -> None:
    """0017 down and up again: a later try handed back its run's committed range is counted by
    ``last_try`` (the range keeps the try that committed it) before and after the round trip."""
    led = Ledger(db_url, create=True)
    try:
        first = led.claim("p", SRC, 3, run(1), initial_start=0)
        led.commit(first.id, records=3, first_seen=0, last_seen=2, output=None)
        assert led.claim("p", SRC, 9, run(1, try_number=2)).id == first.id
        assert led.last_try("p", run(1)) == 2
        assert led.get(first.id).run.try_number == 1
    finally:
        led.close()
    engine = make_engine(db_url)
    try:
        migrate.downgrade(engine, "0016_one_broker_names")
        migrate.upgrade(engine)
    finally:
        engine.dispose()
    led = Ledger(db_url)
    try:
        assert led.claim("p", SRC, 9, run(1, try_number=3)).id == first.id
        assert led.claim("p", SRC, 9, run(1, try_number=2)).id == first.id  # a zombie lowers nothing
        assert led.last_try("p", run(1)) == 3
    finally:
        led.close()


def test_concurrent_create_is_safe(db_url: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def open_ledger(_: int) -> str | None:
        led = Ledger(db_url, create=True)
        try:
            return migrate.current(led.engine)
        finally:
            led.close()

    with ThreadPoolExecutor(4) as pool:
        assert set(pool.map(open_ledger, range(4))) == {migrate.head()}


def test_models_match_the_migrations(db_url: str) -> None:
    """Autogenerate against the migrated schema finds nothing to do: models and scripts agree."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from streamledger.ledger.models import LedgerBase

    Ledger(db_url, create=True).close()
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": False})
            diff = [d for d in compare_metadata(ctx, LedgerBase.metadata) if d[0] != "remove_table"]
        assert diff == []
    finally:
        engine.dispose()


def test_alembic_check_ignores_foreign_tables(db_url: str) -> None:
    """`alembic check` through the shipped env finds nothing to do although another tenant's tables
    (Airflow's, say) share the database: the include_object filter keeps them out of autogenerate."""
    from alembic import command

    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE task_instance (id INTEGER PRIMARY KEY, state VARCHAR(20))"))
        migrate.upgrade(engine)
        cfg = migrate.alembic_config()
        with engine.connect() as conn:
            cfg.attributes["connection"] = conn
            command.check(cfg)  # raises AutogenerateDiffsDetected on any difference
        assert "task_instance" in tables(db_url)
    finally:
        engine.dispose()
