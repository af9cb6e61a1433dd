"""The `haico` command: campaign operations on top of the plugin (cost model, staged and
journaled submission). It reads ledgers and configuration, and talks to Slurm through its
client commands; it never starts a stack."""
