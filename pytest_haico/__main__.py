"""`python -m pytest_haico`: the `haico` command."""

import sys

from pytest_haico.cli.main import main

sys.exit(main())
