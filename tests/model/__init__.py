"""The independent checker (issue 30): a model-based test that composes the features the way users do
(publish, batches on every sink, pinned intervals, kills, retries, clears, concurrency, retention,
re-created streams and new epochs, URL spellings, release-stale, ledger-recorded streaming queries
run to an available-now trigger between the batches, on every sink, on pinned pipelines (whose
refusal is checked: nothing claimed, nothing written) and SIGKILLed mid-batch then restarted from
their checkpoint, the user's transforms inside the batch: filter, explode, aggregate per range,
each range's rows predicted by the oracle in plain Python) and judges the result by the DATA: the ids
the test published and the outputs read back with pyarrow / pyiceberg / deltalake (and the
streaming queries' own rows, Parquet or a Delta or Iceberg table of each query: one count of every
id across batch and streaming outputs).

The project's audit is only ever the *suspect*: the checker reports a disagreement when the audit
says CLEAN while the data shows a record doubled or missing, or (after the final drain) says
something is wrong while the data is exactly once.

Modules: ``ops`` (the operations, a replayable JSON list), ``generator`` (seeded draws),
``oracle`` (reads the data, never the ledger's verdict), ``world`` (the servers and the driving of
one scenario), ``streaming`` (the query and its idempotent sinks, in process or in a child),
``runner`` (replay, checks, shrinking, the report). ``python -m tests.model`` soaks.
"""
