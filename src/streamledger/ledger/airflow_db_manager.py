"""Former home of the Airflow db-manager, kept so that a ``[database] external_db_managers`` setting
naming ``streamledger.ledger.airflow_db_manager.LedgerDBManager`` keeps working. The ledger package
itself is framework-neutral: the manager lives in :mod:`streamledger.hooks.airflow_db_manager`, and
the provider registers it there. Nothing in streamledger imports this module."""

from streamledger.hooks.airflow_db_manager import LedgerDBManager

__all__ = ["LedgerDBManager"]
