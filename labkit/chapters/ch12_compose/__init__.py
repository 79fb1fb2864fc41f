"""Chapter 12's room (composing the layout as at work): a DeviceMesh, FSDP2 over tensor parallelism, HSDP,
mixture-of-experts with expert parallelism, pipeline schedules beyond 1F1B, and a layout chooser with EP.

The notebook imports the modules it teaches from by name:

    from labkit.chapters.ch12_compose import twod, hsdp, moe, schedules, moelayout
"""
