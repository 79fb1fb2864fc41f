"""Chapter 12: moelayout (to be written)."""
