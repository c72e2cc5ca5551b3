"""mpgpu-edu: multi-GPU training, built from scratch."""
