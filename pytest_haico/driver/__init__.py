"""The conversation driver: one scripted conversation over the backend's SSE wire, its
parser, the snapshot reads, the transcripts and the judge that turns them into a verdict.

May import: `pytest_haico.config`, the ledger's record and verdict types
(`pytest_haico.ledger.records`, `pytest_haico.ledger.verdicts`), `pytest_haico.errors` and
the shared helpers; never the stack, the runner or the stand-ins.
"""
