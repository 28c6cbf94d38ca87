"""Checkpoints: the API (save, load, latest, verify), the atomic file format, and sharded (FSDP) state through torch.distributed.checkpoint."""
