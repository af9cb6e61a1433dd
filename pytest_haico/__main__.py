"""`python -m pytest_haico`: the `haico` command."""

from pytest_haico.cli.main import console

console()
