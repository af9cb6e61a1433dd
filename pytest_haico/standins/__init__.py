"""Stand-ins for vLLM and the HAI-Co² backend, run as separate processes by the local profile."""
