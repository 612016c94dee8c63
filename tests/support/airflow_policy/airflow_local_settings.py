"""Airflow cluster policy used by the end-to-end tests only (test double for a SIGKILL).

Airflow imports ``airflow_local_settings`` from ``$AIRFLOW_HOME/config``; the e2e home puts this file
there. When ``STREAMLEDGER_TEST_KILL_AFTER=<step>`` is set, every ``StreamBatchOperator`` gets an
``on_step`` hook that ends the task process with ``os._exit(137)`` right after that batch step on
its first try: exactly what a kill at that moment leaves behind. Product code reads no such switch.
"""

from __future__ import annotations

import logging
import os
from typing import Any


def _kill_after(step: str) -> Any:
    def hook(name: str, batch: Any) -> None:
        if name == step and batch.run.try_number == 1:
            logging.getLogger("streamledger.tests").warning("test policy: killing the task after %s", step)
            for handler in logging.getLogger().handlers:
                handler.flush()
            os._exit(137)

    return hook


def task_policy(task: Any) -> None:
    step = os.environ.get("STREAMLEDGER_TEST_KILL_AFTER")
    if step and type(task).__name__ == "StreamBatchOperator":
        task.on_step = _kill_after(step)
