"""The cluster's house-keeping before any GPU job: the pinned vLLM venv, the images' SIFs
(`haico env`), and the GPU check (`haico gpu-check`).

    venv     the lock, its digest, the venv's marker, the build (in the job)
    images   the images the arms and cluster.env name, the token file, the pulls (in the job)
    plan     what one `haico env` job is to do, as a file it reads back
    env      `haico env` on the login node: what is missing, and the job that makes it
    job      the job's entry point (templates/env.sbatch)
    gpu_check   the GPU check on this node: device count, burns, nvidia-smi's log, the floor
    gpu_burn    one device's matmul burn, run by the venv's interpreter (imports no haico)
    gpu_submit  the GPU check as a job (templates/gpu-check.sbatch runs `--here` on its node)

May import: `pytest_haico.config`, `pytest_haico.slurm` and the shared helpers.
"""
