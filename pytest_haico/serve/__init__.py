"""A model served for others as a Slurm job (`haico serve`), and the catalogue clients
resolve it in.

    catalogue    the entry format, its writer and guarded reader, the key files
    resolver     name -> endpoint, served name, identity and key file, checked against Slurm
    submission   the model job's sbatch command line, for `haico serve` and a successor
    renewal      a chain of model jobs until a deadline: the successor's plan, the drain
    job          the model job itself; control: --list, status, stop

May import: `config`, `ledger`, `stack`, `provenance`, `slurm` and the shared helpers.
"""
