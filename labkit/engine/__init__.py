"""One training run, measured: config -> device -> numerics -> model, data -> the training loop, DDP.
``lk.run`` and ``lk.Config`` live here; nothing here knows about notebooks or widgets."""
