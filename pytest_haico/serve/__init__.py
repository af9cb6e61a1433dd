"""A model served for others as a Slurm job (`haico serve`), and the catalogue clients
resolve it in.

    catalogue    the entry format, its writer and guarded reader, the key files
    resolver     name -> endpoint, served name, identity and key file, checked against Slurm

May import: `config`, `ledger`, `stack`, `provenance`, `slurm` and the shared helpers.
"""
