"""The training runtime: DiLoCo over torch.distributed (or hivemind), virtual GPUs, idle tracking."""
