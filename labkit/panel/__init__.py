"""The lab panel, ``lk.Lab``: knobs, Run/Stop, live charts, a run history and the what-if line."""
