"""Tensor parallel over mx.distributed (mlx.launch ranks): the target sharded over the ranks,
the batch loop and the drafters on rank 0, the other ranks following its forwards."""
