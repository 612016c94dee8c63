"""streamledger: bounded, auditable batch reads from message streams.

Protocol clients live in :mod:`streamledger.protocol`, the offset ledger in
:mod:`streamledger.ledger`, the Spark data plane in :mod:`streamledger.spark`, and the
framework-neutral batch run in :mod:`streamledger.batch`; Airflow hooks and operators are thin
adapters over those.
"""

__version__ = "0.1.0"
