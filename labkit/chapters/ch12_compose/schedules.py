"""Chapter 12: schedules (to be written)."""
