"""The leaves: what every other folder uses and that imports nothing of labkit's own -- errors, the one-run
slot and interrupts, files written atomically, progress lines, the number format, what a run reports."""
