"""The preflight gates: ordered checks, each a small function returning a `GateResult`.

    result       GateResult, running gates in order (timed, stop at the first failure),
                 gates.json, the failure line, the --haico-gates-only table
    static       gates 2-7, 10, 11 over an environment mapping, the arm, measured numbers
    filesystem   gates 8-9: inputs present and readable (and frozen, for a job of haico
                 submit), results directory writable
    vllm_venv    what a vLLM venv holds, read from its files (never imported)
    dynamic      the model server's gates, over HTTP once the stack is up
    backend      the backend's gates: authenticated health, the canary turn
    probes       bounded HTTP exchanges with retries after a 5xx; vLLM's error bodies
    gpu          the GPU check an arm asks for ([run] gpu_check), before the model loads

May import: `pytest_haico.config`, `pytest_haico.ledger` (files, earlier ledgers),
`pytest_haico.slurm` (the job's nodes), `pytest_haico.site` (the GPU check) and the shared
helpers `errors` and `redact`. Never
the stack, runner, driver, campaign or the stand-ins: whoever wires the gates in passes the
URLs, keys, paths, numbers and small callables they check.
"""
