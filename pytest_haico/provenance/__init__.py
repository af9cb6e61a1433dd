"""What a run leaves behind about itself besides its records: the backend database's
periodic and final pg_dumps (and, later, the run's configuration).

May import: `pytest_haico.config`, `pytest_haico.stack`, `pytest_haico.errors` and the
shared helpers.
"""
