"""The model: DDP and FSDP2 wrapping, the strategy of a wrapped model, and the gradient exchange options."""
