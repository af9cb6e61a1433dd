"""Ledger lines exactly as earlier releases wrote them, for the readers' compatibility tests."""

from __future__ import annotations

# A schema-1 record as pytest-haico 0.1.0 (before schema 2) wrote it for the demo arm on
# the local profile: identities are strings, no tags, settings or expectations.
SCHEMA_1_LINE = (
    b'{"schema":1,"run_id":"local-20261130T101500Z-4242.0","campaign":"default","arm":'
    b'"demo","stratum":"default","item_id":"9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f9f'
    b'9f9f9f9f9f9f9f9f9f9f9f","nodeid":"experiments/test_conversations.py::test_conver'
    b'sation[demo-greet-r0]","script":"greet","script_sha256":"abababababababababababa'
    b'babababababababababababababababababababab","repeat":0,"attempt":1,"outcome":"pas'
    b'sed","verdict":"completed","started_at":"2026-11-30T10:15:02.120000+00:00","fini'
    b'shed_at":"2026-11-30T10:15:02.540000+00:00","duration_s":0.42,"in_flight_at_star'
    b't":3,"model_identity":"standin:{\\"latency_ms\\":20,\\"load_s\\":0.0,\\"persona\\":\\"h'
    b'elpful\\",\\"rate_limit_rpm\\":0,\\"recursion_flag\\":true,\\"seed\\":0,\\"substitute_mo'
    b'del\\":\\"\\"}","backend_identity":"standin:pytest_haico.standins.backend@0.1.0","t'
    b'urns":[{"index":0,"thread_id":"5b0e7f3c-9a0e-5f7e-8d0f-2f1b7c3e9a11","branch_fro'
    b'm":null,"latency_s":0.412,"first_event_s":0.051,"steps":1,"tool_calls":0,"tool_e'
    b'rrors":0,"tokens_in":96,"tokens_out":18,"provider":"vllm","model_id":"demo","sna'
    b'pshot_id":"17"}],"error":null,"slurm":null,"harness_version":"0.1.0"}\n'
)
