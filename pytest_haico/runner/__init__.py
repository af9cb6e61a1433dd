"""The runner: the event-loop thread that keeps an arm's conversations in flight, the
circuit breaker, and the arm runs (one stack + runner per arm, started once, stopped once)
with their observer (what the job log is told as it happens).

May import: `pytest_haico.config`, `pytest_haico.ledger`, `pytest_haico.driver`,
`pytest_haico.stack`, `pytest_haico.errors` and the shared helpers.
"""
