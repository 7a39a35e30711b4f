"""Speed, memory and GPU checks: images/s, peak memory, FLOPs, FSDP memory per rank, native-batch speed and the
attention backends on a GPU (visionpe-bench speed / fsdp-memory / native-speed / gpu-check)."""
