"""The ledger: its line format and tolerant reader, record and verdict models, the durable
one-line append, the resume index, the recorder and the run directories.

May import: `pytest_haico.config`, `pytest_haico.errors` and the shared helpers; it knows
nothing of the driver, the runner or the stack.
"""
