"""Unit tests of `pytest_haico/slurm/`, against recording stand-ins for Slurm's commands (no
Slurm needed; `tests/slurm/` holds the tests against real Slurm daemons)."""
