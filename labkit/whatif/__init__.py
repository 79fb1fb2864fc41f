"""The what-if model: a roofline of one training step -- what a configuration *would* do on a given device,
predicted, never measured.

    p = lk.predict(lk.Config(model="base", precision="bf16", micro_batch=32), device="h100-sxm")
    p.step_time_s, p.tokens_per_s, p.mfu, p.memory_bytes, p.fits
    p.groups["matmul"].bound                  # "compute" or "memory"
    print(p.table())

How it works
------------
1. **Trace the step once, on fake tensors.** The course's GPT runs one forward and backward pass, the
   gradient clip and the optimizer step under ``FakeTensorMode`` (shapes only: no memory, no arithmetic,
   any model size), with CPU autocast (also for a GPU prediction: CUDA autocast's cast lists differ, so
   the casts it counts are those CPU autocast inserts) and the same attention choice a real run makes.
   A dispatch mode sees every ATen operation and records its FLOPs (``FlopCounterMode``'s own formulas, as
   ``measure.count_flops`` uses) and the bytes it moves (every input plus every output; a view moves
   none), and which tensors are still alive when the forward pass ends (the activations).
2. **Group the operations** for display: matmul, attention, element-wise/normalisation, optimizer;
   communication (DDP's gradient buckets and a ring AllReduce) and data (the loader) are modelled, not
   traced. A model deeper than two blocks is not traced block by block: its blocks are identical, so
   the trace of one and two blocks (and, for checkpointing every k-th block, of a two-block model with
   one block checkpointed) gives the cost of each kind of block exactly, and the step is the sum.
   A prediction costs about the same for 2 blocks as for 256.
3. **A roofline per operation**::

       op time = max(FLOPs / (peak x flops_fraction), bytes / (bandwidth x bandwidth_fraction))
       group time = sum of its ops' times + n_ops x per-op overhead
       overhead group = the fixed cost of one update (its own Python: the loop, contexts, optimizer wrappers)

   Each operation is charged the slower of its own arithmetic and its own memory traffic, and the
   times are added. Taking the max once per group instead (its summed FLOPs against its summed bytes)
   would let a memory-bound small kernel hide behind a compute-bound large one, as if the two ran at
   the same time; on a GPU they run one after the other. A group's ``bound`` says which kind of op
   took most of its time.
   The step time is the **sum** of the groups: nothing overlaps (no compute during the AllReduce,
   no kernel hiding another's launch). The one exception: loader *workers* run beside the step, so
   only the part of their time the step cannot hide is added. Real GPUs overlap more than this, so
   the model leans slow where communication or launches matter.

   **The overhead term** (``Prediction.overhead_s``, the table's "of which overhead" column and its
   "overhead (fixed, per update)" row) is what eager PyTorch costs around the arithmetic: a fixed cost per
   update plus a cost per op (Python, autograd, the optimizer's loop, the dispatcher, a kernel launch).
   On "this" both are measured (``probe_op_overhead``: labkit's own update loop on two tiny models, a line
   through their times over their traced op counts); on a GPU they are documented assumptions
   (``DEFAULTS``). It is what makes a small model slower than its FLOPs say.

The peaks, bandwidths and memory sizes come from ``devices.json`` (datasheets, each number with its
source). ``device="this"`` measures instead: the bounded, cached matmul probe of ``engine.device``, a
memory-bandwidth probe and the overhead probe (per update and per op) (``probes``; at most ~1 s, cached), and each
matmul and fused-attention shape of the step timed alone, each call right after the caches were swept as the
step's other work sweeps them (bounded, cached): the achievable FLOP/s at the model's own shapes; and each element-wise call of the micro-batch rebuilt at its traced shapes and timed
alone, charged the slower of that kernel time and its bytes (a GELU or a LayerNorm backward does far more
arithmetic per byte than the ``c = a + b`` the bandwidth curve is measured on). A probe is watched
while it runs: when other programs used the cores it needed, or
its repeats disagree, its figures are kept for this process only (never cached), measured again on a
later prediction, and the prediction carries a ``caveat`` saying so. On a CPU the bandwidth is a curve
over the op's size: a small op's data stays in cache and streams several times faster than memory, so
an activation op's bytes are charged at the bandwidth of its size, while the weights, gradients and
optimizer state -- touched once per update -- stream at the bandwidth of their total size.
A GPU entry has one figure, its datasheet bandwidth.

The modules, in the order they build on each other:

    devices   the catalogue (``devices.json``, read by ``engine.gpus``) and the model's assumptions;
              each element-wise call of the step rebuilt at its own shapes
    trace     the step traced on fake tensors, on the one dispatch tracer (``engine.tracer``)
    probes    "this" machine measured: bandwidth, per-op overhead, matmul shapes, element-wise calls (cached)
    roofline  the arithmetic: each group's cost, one op kind at a time; DDP's buckets and ring
    report    ``predict`` itself (``lk.predict``: checks every argument, then the four above),
              ``Prediction``, and predicted against measured (``error_rows``, ``error_sentence``)
    layouts   layout formulas from shapes and datasheets: ZeRO bytes, activations, the bubble, a (dp, tp) mesh
"""
from .devices import DEFAULTS, GROUPS, catalogue, device_names, op_keys, probe_ops
from .probes import (probe_bandwidth, probe_op_overhead, probe_shapes, shape_keys, this_device,
                     this_op_times, this_probes, this_shape_rates)
from .report import PREDICT_OPTIONS, Prediction, error_rows, error_sentence, predict
from .roofline import (GroupCost, bandwidth_at, data_time_s, ddp_buckets, memory_s, op_roofline_s, ring_allreduce_s,
                       roofline_s)
from .trace import StepTrace, size_class, trace_step

__all__ = ["predict", "Prediction", "GroupCost", "catalogue", "device_names", "trace_step", "StepTrace",
           "roofline_s", "ring_allreduce_s", "ddp_buckets", "data_time_s", "size_class", "bandwidth_at",
           "memory_s", "probe_bandwidth", "probe_op_overhead", "this_probes", "shape_keys", "probe_shapes",
           "this_shape_rates", "op_keys", "probe_ops", "this_op_times", "op_roofline_s", "this_device", "DEFAULTS",
           "GROUPS", "PREDICT_OPTIONS", "error_rows", "error_sentence"]
