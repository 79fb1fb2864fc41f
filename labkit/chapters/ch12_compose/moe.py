"""Chapter 12: moe (to be written)."""
