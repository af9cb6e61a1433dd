"""The campaign's life in a pytest session: the hooks pytest calls, and what they decide.

`setup` turns resolved settings into the session's plugin objects (or refuses the run with
a usage error before anything starts); `checks` holds those refusals; `selection` picks the
items this run owes (arm, stratum, shard, limit, resume); `hooks` carries them through
running and recording; `summary` writes the haico section and maps the session to an exit
code; `signals` installs the INT, USR1 and TERM handlers for the session; `progress`
writes the job log (a line per finished conversation when the output is not a terminal);
`failures` shortens a haico item's failure to its explanation.

This is the switchboard: it may import every part but the stand-ins.
"""
