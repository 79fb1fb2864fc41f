"""Chapter 12's room (composing the layout as at work): a DeviceMesh, FSDP2 over tensor parallelism, HSDP,
mixture-of-experts with expert parallelism, pipeline schedules beyond 1F1B, and a layout chooser with EP.

The notebook imports the modules it teaches from by name:

    from labkit.chapters.ch12_compose import hsdp, moe, moelayout, order, schedules, twod

* ``twod``      -- the named 2 x 2 mesh; TP (with sequence parallelism) then FSDP2 on the GPT, its collectives
  counted by kind and bytes, memory per rank against 1-D FSDP and 1-D TP, loss-parallel cross-entropy
  (the pure formulas: ``labkit.whatif.layouts``)
* ``hsdp``      -- FSDP2 on a (replicate, shard) mesh: which collective crosses the "node" dimension; HSDP
  against FSDP for 2 nodes x 8 GPUs, predicted
* ``order``     -- torchtitan's order (TP, checkpointing, compile, FSDP) and what another order breaks
* ``moe``       -- a top-k router with capacity and the balancing loss; expert parallelism's two all-to-alls
* ``schedules`` -- interleaved 1F1B and zero-bubble schedules as data, replayed, and run by torch's pipelining
* ``moelayout`` -- chapter 10's layout chooser with expert parallelism, for public MoE shapes (``moe_shapes.json``)
"""
