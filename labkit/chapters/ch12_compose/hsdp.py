"""Chapter 12: hsdp (to be written)."""
