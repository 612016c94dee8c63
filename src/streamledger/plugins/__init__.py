"""Airflow plugins shipped with the provider: the "Stream ledger" page (:mod:`.ledger_ui`)."""
