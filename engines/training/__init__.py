"""Drafter training by self-distillation (MLX): data, the loop, checkpoints, model cards."""
