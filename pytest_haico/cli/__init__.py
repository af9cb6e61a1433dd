"""The `haico` command line: argument parsing and printing only, one module per command
(`main` builds the parser from them); the work is done by `submit`, `report`, `kept` and the
parts below them."""
