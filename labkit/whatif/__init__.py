"""The what-if model: a roofline of one training step -- what a configuration *would* do on a given
device, predicted, never measured (chapter 09's notebook teaches it: per-op roofline, summed, no
overlap).

    p = lk.predict(lk.Config(model="base", precision="bf16", micro_batch=32), device="h100-sxm")
    p.step_time_s, p.tokens_per_s, p.mfu, p.memory_bytes, p.fits
    p.groups["matmul"].bound                  # "compute" or "memory"
    print(p.table())

1. **Trace the step once, on fake tensors** (``FakeTensorMode``: shapes only, any model size): a
   forward and backward pass, the gradient clip and the optimizer step, under CPU autocast (also for
   a GPU prediction: the casts counted are those CPU autocast inserts) and the attention a real run
   picks. Each ATen op's FLOPs (``FlopCounterMode``'s formulas, as ``measure.count_flops``) and
   bytes (inputs plus outputs; a view moves none) are recorded, and the tensors alive when the
   forward ends (activations). Its blocks being identical, a deep model is traced as one and two
   blocks (and a two-block model with one block checkpointed): 2 blocks or 256 cost about the same
   to predict.
2. **Group the ops** for display (matmul, attention, element-wise, optimizer); communication
   (DDP's buckets, a ring AllReduce) and data (the loader) are modelled, not traced.
3. **A roofline per op**: op time = max(FLOPs / (peak x fraction), bytes / (bandwidth x
   fraction)); a group's time is its ops' times plus n_ops x the per-op overhead; the step is the
   sum of the groups, loader workers' time only where the step cannot hide it.

**The overhead term** (``Prediction.overhead_s``): a fixed cost per update plus a cost per op --
measured on "this" (``probe_op_overhead``), documented assumptions on a GPU (``DEFAULTS``).

The peaks, bandwidths and memory sizes come from ``devices.json`` (datasheets, each number with its
source). ``device="this"`` measures instead (``probes``; bounded, cached): the matmul peak, a
bandwidth curve over the op's size (a small op's data stays in cache; the weights, gradients and
optimizer state stream at the bandwidth of their total size), the overhead, each matmul and
fused-attention shape of the step timed alone after a cache sweep, and each element-wise call
rebuilt at its traced shapes. A probe run while other programs used its cores, or whose repeats
disagree, is kept for this process only, measured again later, and the prediction carries a
``caveat``.

The modules, in the order they build on each other:

    devices   the catalogue (``devices.json``) and the model's assumptions; element-wise calls timed
    trace     the step traced on fake tensors, on the one dispatch tracer (``engine.tracer``)
    probes    "this" machine measured: bandwidth, overhead, matmul shapes, element-wise calls
    roofline  the arithmetic: each group's cost, one op kind at a time; DDP's buckets and ring
    report    ``predict`` (``lk.predict``), ``Prediction``, predicted vs measured (``error_rows``)
    layouts   layout formulas from shapes and datasheets: ZeRO bytes, the bubble, a (dp, tp) mesh
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
