"""Slurm: the only caller of sbatch, squeue, sacct, scontrol and sinfo, with one timeout and
one environment policy, and typed answers.

    client       how a command runs: the allow-listed environment, the two timeouts, its
                 answer and errors; the Slurm version
    records      one parser per command output: job records, task states, end times, ids
    jobs         submit a job, find one by name, its tasks' states, its end time, its end
    hostlist     Slurm host lists expanded into node names (scontrol's, else our own)
    timelimits   time limits as sbatch --time takes them; partitions and their caps (sinfo)
    nodes        the nodes of each partition (sinfo)

May import: `pytest_haico.config` and the shared helpers.
"""
