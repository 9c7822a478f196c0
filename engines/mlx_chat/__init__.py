"""The MLX chat engine: any mlx-lm model as target, speculative rounds with n-gram, draft-model
and Gemma 4 MTP (mtp.py) proposers. Start reading at engine.py (the round loop)."""
