"""`specscope serve`: the project's engines behind an OpenAI-compatible HTTP API (no Qt)."""
