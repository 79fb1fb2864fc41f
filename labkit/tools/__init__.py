"""What runs the engine more than once or draws it: honest comparisons with intervals, interleaved timing,
sweeps, charts (the one figure maker) and the shipped reference measurements."""
