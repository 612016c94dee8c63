"""What a ledger's schema is, read back from the database: tables, columns, constraints, indexes,
triggers and (PostgreSQL) functions by their full definitions, so two databases compare by value.
Used by the migration tests (an upgrade from empty and one through every revision's round trip give
one schema)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine

#: Every object the ledger's migrations create is named so (its tables, indexes, triggers, functions).
PREFIX = "streamledger_"


def snapshot(engine: Engine) -> dict[str, Any]:
    """The ledger's schema objects (``streamledger_*``), each kind a sorted list of rows."""
    if engine.dialect.name == "postgresql":
        return _postgresql(engine)
    return _sqlite(engine)


def _rows(engine: Engine, sql: str) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return sorted(tuple(row) for row in conn.execute(text(sql), {"like": PREFIX + "%"}))


def _postgresql(engine: Engine) -> dict[str, Any]:
    return {
        "columns": _rows(engine, """
            SELECT table_name, column_name, data_type, character_maximum_length, is_nullable,
                   column_default
              FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name LIKE :like"""),
        "constraints": _rows(engine, """
            SELECT t.relname, c.conname, c.contype, pg_get_constraintdef(c.oid)
              FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid
             WHERE t.relnamespace = current_schema()::regnamespace AND t.relname LIKE :like"""),
        "indexes": _rows(engine, """
            SELECT tablename, indexname, indexdef FROM pg_indexes
             WHERE schemaname = current_schema() AND tablename LIKE :like"""),
        "triggers": _rows(engine, """
            SELECT t.relname, g.tgname, pg_get_triggerdef(g.oid)
              FROM pg_trigger g JOIN pg_class t ON t.oid = g.tgrelid
             WHERE NOT g.tgisinternal AND t.relnamespace = current_schema()::regnamespace
               AND t.relname LIKE :like"""),
        "functions": _rows(engine, """
            SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid)
              FROM pg_proc p
             WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE :like"""),
        "extensions": _rows(engine, "SELECT extname FROM pg_extension"),
    }


def _sqlite(engine: Engine) -> dict[str, Any]:
    tables = [t for (t,) in _rows(
        engine, "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE :like")]
    out: dict[str, Any] = {
        # CREATE TABLE text is left out: SQLite edits it in place on ADD/DROP COLUMN, so its spacing
        # tells the order of the steps, not the schema; the pragmas below say what it holds.
        "indexes_and_triggers": _rows(engine, """
            SELECT type, name, tbl_name, sql FROM sqlite_master
             WHERE type IN ('index', 'trigger') AND tbl_name LIKE :like"""),
    }
    with engine.connect() as conn:
        for table in tables:
            out[f"{table}.columns"] = sorted(
                tuple(r[1:]) for r in conn.exec_driver_sql(f"PRAGMA table_info({table})"))
            out[f"{table}.foreign_keys"] = sorted(
                tuple(r[2:]) for r in conn.exec_driver_sql(f"PRAGMA foreign_key_list({table})"))
            out[f"{table}.indexes"] = sorted(
                (r[1], r[2], r[3], r[4],
                 tuple(i[2] for i in conn.exec_driver_sql(f"PRAGMA index_info('{r[1]}')")))
                for r in conn.exec_driver_sql(f"PRAGMA index_list({table})").all())
            out[f"{table}.checks"] = _checks(conn.exec_driver_sql(
                "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).scalar_one())
    return out


def _checks(create_table: str) -> list[str]:
    """The CHECK clauses of a CREATE TABLE text, spacing folded."""
    found, at = [], create_table.find("CHECK")
    while at >= 0:
        depth, end = 0, at
        for end in range(create_table.index("(", at), len(create_table)):
            depth += {"(": 1, ")": -1}.get(create_table[end], 0)
            if depth == 0:
                break
        found.append(" ".join(create_table[at:end + 1].split()))
        at = create_table.find("CHECK", end)
    return sorted(found)
