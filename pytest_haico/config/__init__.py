"""The campaign's configuration: options resolved once into `Settings`, arms and scripts,
their validation, cluster.env, the Slurm job's identity, the items with their item_ids
and shards, --haico-items lists, and the digest of a submission's frozen inputs.

May import: `pytest_haico.errors` and the shared helpers only (nothing of the ledger,
the driver, the runner or the stack).
"""
