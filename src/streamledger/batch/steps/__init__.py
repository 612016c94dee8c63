"""The batch's steps, one module each, following the crash table of docs/ledger.md ("The batch's steps
and where it can crash"): :mod:`.survey` (plan: the ledger's positions, the broker's tails and stored
offsets, the identity checks), :mod:`.claim`, :mod:`.read` (the job, under a heartbeat), :mod:`.verify`,
:mod:`.commit` (and what a failed attempt leaves), :mod:`.publish` (a stranded commit, the table
commit), :mod:`.reread` (the retry that finds an output gone) and :mod:`.store` (the broker offset).

They exist so that a reader finds "what happens at this step, and what a crash there leaves" in one
short module. Each step is a mixin over :class:`.state.BatchState` (the one batch's state), and
:class:`streamledger.batch.run.BatchRun` runs them in order; their methods keep the names and bodies
they had on ``BatchRun``. A step that calls another step's method derives from it, so each module
type-checks on its own: the claim from the survey, which publishes what a refused stream left
stranded; the publish from the reread, which runs the job again and verifies it; the read from the
verify.
"""
