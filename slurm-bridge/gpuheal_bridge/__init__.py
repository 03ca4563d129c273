"""gpuheal Slurm bridge: drain, requeue and resume Slurm nodes over an authenticated HTTP API."""
