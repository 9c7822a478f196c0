"""Backend-agnostic speculative decoding: rounds & stats, verification, the n-gram proposer,
presets & the draft schedule, the NDJSON trace. No MLX, no torch, no Qt."""
