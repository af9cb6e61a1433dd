"""Slurm: the only caller of sbatch, squeue, sacct, scontrol and sinfo, with one timeout and
one environment policy, and the time limits and partitions they speak of."""
