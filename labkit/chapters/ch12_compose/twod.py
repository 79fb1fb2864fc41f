"""Chapter 12: twod (to be written)."""
from ...tools.collectives import backend, gpu_count  # noqa: F401  (the set-up cell says where the ranks run)
