"""The interview question bank: one source for the self-quiz widget (``labkit.quiz``) and for the plain
markdown (``notebooks/interview_questions.md``).

Every question is tied to the measurement that backs it: a cell tag (``measure-NN-topic``) in a chapter
notebook. ``tests/test_questions.py`` checks that each tag exists in the notebook it names, and that the
markdown file is exactly what ``to_markdown()`` produces. After editing a question here, regenerate it:

    python -m labkit.content.questions --write          # rewrites notebooks/interview_questions.md
    python -m labkit.content.questions --topic precision  # print one topic
"""
from __future__ import annotations

import argparse
import html
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ..drills.cases import CASES

MARKDOWN_PATH = Path(__file__).resolve().parents[2] / "notebooks" / "interview_questions.md"

# Chapter number -> notebook file (the tags say the chapter: measure-02-... lives in chapter 02).
CHAPTER_NOTEBOOKS = {
    "00": "00_start_here.ipynb",
    "01": "01_measure_first.ipynb",
    "02": "02_mixed_precision.ipynb",
    "03": "03_gradient_accumulation.ipynb",
    "04": "04_activation_checkpointing.ipynb",
    "05": "05_data_loader.ipynb",
    "06": "06_ddp_allreduce.ipynb",
    "07": "07_kernels_and_compile.ipynb",
    "08": "08_memory_in_practice.ipynb",
    "09": "09_fixed_gpus_playbook.ipynb",
    "10": "10_when_the_model_does_not_fit.ipynb",
    "11": "11_long_runs_and_failures.ipynb",
}

TOPICS = {
    "measure": "Measuring: timing, FLOPs, MFU and HFU",
    "precision": "Mixed precision and loss scaling: bf16 against fp16",
    "accumulation": "Gradient accumulation and its pitfalls",
    "checkpointing": "Activation checkpointing trade-offs",
    "loader": "Data loading",
    "ddp": "DDP: synchronisation and buckets",
    "network": "Collectives and network cost",
    "kernels": "Kernels, shapes and torch.compile",
    "memory": "Memory: arithmetic at LLM scale and in practice",
    "playbook": "Putting it together on a fixed number of GPUs",
    "parallel": "When the model does not fit: tensor, pipeline and sharded data parallelism",
    "longrun": "A long run: checkpoints, exact resumes, failures and loss spikes",
}


@dataclass(frozen=True)
class Question:
    id: str
    topic: str
    question: str
    answer: str          # markdown; the "backed by" line is added from ``tags``
    tags: tuple          # measurement cells that back the answer, most direct first

    def notebook(self, tag: str) -> str:
        return CHAPTER_NOTEBOOKS[tag.split("-")[1]]

    def backed_by(self) -> list:
        """[(tag, notebook file)] for every measurement this answer points at."""
        return [(t, self.notebook(t)) for t in self.tags]


def _q(id, topic, question, answer, *tags):
    return Question(id, topic, question, " ".join(answer.split()), tuple(tags))


QUESTIONS = [
    # ---- measuring ----------------------------------------------------------------------------------
    _q("timing-gpu", "measure",
       "You wrap a CUDA matmul in `time.perf_counter()` and it looks impossibly fast. What went wrong?",
       """CUDA calls are asynchronous: the Python call returns once the kernel is queued, and the GPU runs it
       later. The timer measured the launch. Call `torch.cuda.synchronize()` before reading the clock at both
       ends (or use CUDA events), warm up first, and report a median over repeats. On a CPU every operation
       finishes before the next line, so both ways agree there.""",
       "measure-00-sync-timing"),
    _q("flops-6n", "measure",
       "Roughly how many FLOPs does it take to train a 1 B-parameter transformer on 100 B tokens?",
       """About 6·N·D = 6 × 1e9 × 1e11 = 6e20 FLOPs: each weight costs 2 FLOPs per token forward and 4
       backward. Attention adds 12·L·d·T per token, small unless the context is long. On 8 GPUs with a dense
       bf16 peak near 1e15 FLOP/s at 40% MFU that is 6e20 / (8 × 1e15 × 0.4) ≈ 1.9e5 s, a little over two
       days.""",
       "measure-01-flops-formula", "measure-01-linear-flops"),
    _q("backward-twice", "measure",
       "Why does the backward pass cost about twice the forward pass?",
       """For each matmul Y = X·W, backward computes two products of the same size as the forward one: dX =
       dY·Wᵀ (to pass the gradient on) and dW = Xᵀ·dY (for the update). The first layer needs no dX.
       Elementwise operations add little.""",
       "measure-01-linear-flops"),
    _q("mfu-hfu", "measure",
       "Define MFU and HFU. When do they differ, and which one do you report?",
       """MFU = FLOPs the model needs per second (6·N + attention per token, times tokens/s) ÷ the peak FLOP/s
       of all devices. HFU counts the FLOPs the hardware actually ran, including recomputation, so with
       activation checkpointing HFU > MFU. Report MFU when comparing setups: recomputed FLOPs are not useful
       work.""",
       "measure-01-baseline", "measure-04-hfu-mfu"),
    _q("which-peak", "measure",
       "Which peak FLOP/s do you divide by when computing MFU?",
       """The dense peak of the number format the matmuls run in (bf16 tensor-core peak for bf16 training,
       fp32 for fp32), times the number of devices. fp32 matmuls use the tf32 tensor-core peak only when
       tf32 is enabled (`torch.backends.cuda.matmul.fp32_precision = "tf32"` or
       `torch.set_float32_matmul_precision("high")`): PyTorch's default keeps full-fp32 matmuls (cuDNN
       convolutions do default to tf32). Never the 2:4-sparse headline figure, which is twice the dense one.
       Without a datasheet (a CPU), measure a large matmul and say it was measured.""",
       "measure-00-env", "measure-01-baseline", "measure-07-tf32"),
    _q("low-mfu", "measure",
       "Your job reaches only fifteen per cent MFU. Where do you look first?",
       """At the step-time breakdown: time blocked on the data loader and time waiting for communication that
       backward does not hide. "MFU of 10–20 % means the accelerator waits" is a rule of thumb, not a law:
       making data preparation expensive made the loop wait and MFU fall (the breakdown shows whether compute
       itself also changed), but with data wait at zero, MFU still rose with the micro-batch in chapter 01's sweep, because small matmuls and kernel-launch
       overhead, memory-bound element-wise operations (norms, activations, residual adds), the optimizer step
       and operations left in fp32 all take time without adding model FLOPs. So check the wait first, then
       profile the compute itself (chapter 07 starts from a run with nothing to wait for and reads a
       profiler table of one step).""",
       "measure-01-data-cost", "measure-01-mfu-sweep", "measure-05-starving", "measure-07-nothing-waits",
       "measure-07-profile-table", "measure-01-low-mfu-suspect"),
    _q("mfu-small-model", "measure",
       "A 124 M-parameter model with zero data wait reaches 25 % MFU. Why, and what do you try?",
       """With the input pipeline ruled out, the time goes to work that is not large matmuls (first check
       that the FLOP count includes attention, 12·L·d·T per token, and that MFU divides by the dense peak
       of the format you run). At d = 768 and
       a small micro-batch × sequence the matmuls are too small to fill the tensor cores, and hundreds of
       short kernels per step leave the GPU idle between launches (Python and launch overhead). Element-wise
       operations (layer norm, GELU, softmax, residual adds, dropout) are memory-bound and add no model FLOPs;
       so does an unfused AdamW step over every parameter, and any operation left in fp32 runs at the fp32
       peak. Then, measuring each change:
       profile one step (`torch.profiler`) to see gaps and the top kernels; raise the micro-batch (or
       sequence length) while memory allows — in chapter 01's sweep, with data wait at zero, MFU rose with the
       micro-batch, and chapter 07 sweeps micro-batch and width the same way; train
       in bf16; use fused attention (SDPA/flash); `torch.compile` to fuse element-wise ops and cut launches
       (CUDA graphs for the rest); a fused optimizer (`AdamW(..., fused=True)`); pad the vocabulary to a
       multiple of 64 so the LM head's matmul tiles evenly on tensor cores.""",
       "measure-07-nothing-waits", "measure-07-mfu-sweep", "measure-07-profile-table", "measure-01-mfu-sweep",
       "measure-01-profiler-trace", "measure-01-baseline"),
    # ---- mixed precision ------------------------------------------------------------------------------
    _q("fp16-vs-bf16", "precision",
       "fp16 and bf16 are both 16 bits. How do they differ, and what follows from it?",
       """fp16 has 5 exponent and 10 mantissa bits: more precision, but the largest value is 65504 and normal
       numbers stop near 6e-5. bf16 has 8 exponent bits like fp32 (same range) and 7 mantissa bits (two to
       three significant digits). So fp16 overflows and underflows where bf16 does not; bf16 rounds more
       coarsely.""",
       "measure-02-finfo", "measure-02-overflow", "measure-02-bf16-scaler"),
    _q("loss-scaling-why", "precision",
       "Why do fp16 gradients need loss scaling, and why does bf16 not?",
       """Many gradient values are smaller than fp16's smallest normal number and become zero (or lose
       precision as subnormals). Multiplying the loss by S multiplies every gradient by S, moving them into
       range; the optimizer divides by S again before the update. bf16 has fp32's exponent range, so small
       gradients survive without it.""",
       "measure-02-underflow", "measure-02-grad-histogram"),
    _q("dynamic-scaling", "precision",
       "How does dynamic loss scaling (`GradScaler`) choose the scale?",
       """It starts high (2^16 by default). After each backward it checks the gradients for inf/NaN: if any,
       the optimizer step is skipped and the scale halved; after a run of good steps (2000 by default) the
       scale doubles. The scale settles just below the point where gradients overflow; a few skipped steps
       are normal.""",
       "measure-02-grad-scaler"),
    _q("unscale-then-clip", "precision",
       "With fp16 and a `GradScaler`, where must gradient clipping go?",
       """After `scaler.unscale_(optimizer)` and before `scaler.step(optimizer)`. Before unscaling, the
       gradients are S times too large, so clipping compares S·‖g‖ with the threshold and shrinks every
       update by about S.""",
       "measure-02-clip-unscale"),
    _q("autocast-ops", "precision",
       "Under autocast, which operations run in 16 bits and which stay in fp32?",
       """Matmuls, linear layers and convolutions run in 16 bits. Reductions that need range or precision —
       losses, softmax/log-softmax, normalisation — run in fp32 on CUDA (on a CPU, layer_norm and softmax
       keep their input's type). The parameters stay fp32; autocast casts 16-bit copies for the matmuls.""",
       "measure-02-autocast-ops"),
    _q("mixed-precision-memory", "precision",
       "What does mixed precision save in memory, and what does it not?",
       """It shrinks the activations saved for backward (roughly halved; norms and the residual stream may
       stay fp32). With PyTorch's autocast (labkit's regime) it does not shrink the model state: weights and
       gradients stay fp32, so with AdamW it stays at 16 bytes per parameter (4 + 4 + 8), and autocast's
       16-bit weight copies even add a little. Setups that keep 16-bit weights and gradients next to fp32
       master weights do not save either: 16 bytes, or about 20 when gradients are also accumulated in
       fp32.""",
       "measure-02-memory", "measure-00-memory-breakdown", "measure-08-bytes-per-param"),
    _q("bf16-faster", "precision",
       "Is bf16 training always faster than fp32?",
       """Only on hardware with fast 16-bit matrix units: tensor cores on NVIDIA GPUs since Ampere, AMX or
       AVX-512-BF16 on some CPUs. Elsewhere the conversions cost time and bf16 can be slower. Measure on the
       device you have; when reference measurements are present, the course shows the GPU reference beside your run.""",
       "measure-02-bf16-speed", "measure-02-precision-runs"),
    _q("buggy-loop", "precision",
       "A colleague's bf16 training loop uses a `GradScaler` and accumulates gradients under DDP without `no_sync()`. What is wrong?",
       """Both waste work without changing the result much. bf16 needs no scaler: it has fp32's exponent
       range, so the scaled gradients do not overflow and the scaler does not skip steps for that reason.
       What it costs is a host–device synchronisation every step (`scaler.step` reads the inf/NaN check back to
       the CPU) and, worse, it silently skips any step whose gradients hold a genuine inf or NaN and
       halves the scale, which hides a diverging run instead of stopping it. Without `no_sync()` DDP
       all-reduces the gradients after every micro-batch: K rounds of AllReduces per update (one per gradient
       bucket each round) instead of one.""",
       "measure-02-buggy-loop", "measure-03-allreduce-preview"),
    # ---- accumulation ----------------------------------------------------------------------------------
    _q("effective-batch", "accumulation",
       "What is the effective batch with gradient accumulation and data parallelism?",
       """micro-batch × accumulation steps K × number of data-parallel processes (in tokens: times the
       sequence length). Different splits of the same effective batch give the same updates, up to
       floating-point rounding.""",
       "measure-03-equivalence"),
    _q("divide-by-k", "accumulation",
       "Why divide each micro-batch's loss by K, and when is accumulation not the same as one big batch?",
       """`backward()` adds into `.grad`, so K losses each divided by K add up to the gradient of the big
       batch's mean loss — if the micro-batches are the same size. When they hold different numbers of valid
       tokens, weight by tokens instead. BatchNorm statistics and dropout masks also differ per
       micro-batch.""",
       "measure-03-unequal", "measure-03-equivalence"),
    _q("accum-memory", "accumulation",
       "Does gradient accumulation reduce memory?",
       """It keeps activation memory at one micro-batch's worth however large the effective batch grows, so
       it lets a big effective batch fit. It does not reduce weights, gradients or optimizer state. The peak
       is not quite flat in K, though: with `zero_grad(set_to_none=True)`, at K = 1 the forward, and the
       start of backward where the peak usually is, run with no `.grad` alive (backward then builds the
       gradients while activations are still alive, freeing those as it goes); at
       K ≥ 2 micro-batches 2…K run their forward and backward with every gradient alive. So the peak can
       rise by up to the gradient bytes from K = 1 to K = 2, and stays flat from there on. Measure it (the device's
       peak on a GPU, a traced peak on a CPU) rather than adding up a breakdown that cannot depend on K.""",
       "measure-03-memory-vs-k"),
    _q("accum-speed", "accumulation",
       "Does gradient accumulation make training faster?",
       """Not the passes themselves: each micro-batch runs at its own speed. It shares the per-update work —
       one optimizer step, and under DDP with `no_sync()` one AllReduce — among K micro-batches, which
       matters when that work is a large part of a step. A bigger micro-batch, if it fits, is usually the
       faster way to the same effective batch.""",
       "measure-03-throughput", "measure-09-grid"),
    # ---- checkpointing --------------------------------------------------------------------------------
    _q("saved-activations", "checkpointing",
       "What does autograd keep for backward in a transformer block, and how does it scale?",
       """The inputs each operation's gradient needs: normalisation inputs and statistics, the input of
       every matmul, the attention output and its softmax statistics, the MLP activation. It scales with
       micro-batch × sequence length × width per block (plus the T×T scores when attention is not fused).""",
       "measure-04-saved-per-op", "measure-04-block-formula", "measure-08-seq-sweep"),
    _q("checkpointing-trade", "checkpointing",
       "What does activation checkpointing trade, and roughly how much?",
       """Compute for memory. Only each block's input is kept; in backward the block's forward runs again.
       Activation memory drops several-fold; compute rises by about one forward pass (2·N of the 6·N FLOPs
       per token, so up to a third more hardware FLOPs) and the step gets slower by a measured amount.""",
       "measure-04-full-overhead", "measure-04-hfu-mfu"),
    _q("checkpointing-peak", "checkpointing",
       "With full checkpointing, why is peak memory above the bytes kept after the forward pass?",
       """In backward each block is recomputed, so one block's full activations exist again, on top of the
       kept block inputs and the gradients being built. The peak is about: kept inputs + one block's
       activations + gradients and temporaries.""",
       "measure-04-memory-timeline"),
    _q("checkpointing-choice", "checkpointing",
       "Full, selective or every-k-th-block checkpointing: how do you choose?",
       """Measure memory and step time for each and take the cheapest in recompute that fits. "Selective"
       has two meanings. PyTorch's selective activation checkpointing is a policy (labkit's
       `checkpointing="selective"`): keep the expensive outputs (matmuls) and recompute the cheap
       element-wise operations. Megatron's and the Ultra-Scale Playbook's "selective recomputation" (labkit's
       `checkpointing="attention"`) recomputes only the attention core — the T×T scores, softmax and dropout
       — which holds most of the activation memory at long sequences for a few per cent of the FLOPs; with a
       fused SDPA/flash kernel the T×T matrix is never stored, so that mode saves little. Checkpointing every
       k-th block saves in proportion; full saves the most and recomputes the most.""",
       "measure-04-options-curve", "measure-04-attention-recompute", "measure-08-attention-recompute",
       "measure-04-memory-budget"),
    _q("checkpointing-faster", "checkpointing",
       "Can activation checkpointing make training faster?",
       """Per sample it always costs extra compute, but it can raise throughput under a memory budget: the
       memory it frees can hold a larger micro-batch, which uses the device better. Whether that wins is a
       measurement; the Pareto chart of a grid search shows it.""",
       "measure-09-pareto", "measure-09-grid"),
    # ---- data loading -----------------------------------------------------------------------------------
    _q("starving", "loader",
       "GPU utilisation is low. How do you tell whether the input pipeline is the cause?",
       """Time each step's wait on `next(loader)` separately from compute and optimizer (synchronising the
       device before reading the clock). A large data-wait share, and MFU that recovers when data is free,
       means the accelerator is starving.""",
       "measure-05-starving", "measure-01-data-cost"),
    _q("how-many-workers", "loader",
       "How many DataLoader workers should you use?",
       """Enough that data wait falls to a few per cent: roughly workers ≥ (time to prepare a batch) ÷
       (compute time per batch), plus some headroom. Past that knee more workers only cost cores and memory.
       Measure a sweep.""",
       "measure-05-workers-sweep", "measure-05-fewest-check"),
    _q("worker-slower", "loader",
       "Why can adding a DataLoader worker make training slower?",
       """The worker is one more busy process. If the training process still runs one intra-op thread per
       core, threads outnumber cores; PyTorch's threads wait for each other at every parallel operation and
       stall when one is descheduled. Limit the trainer to cores − workers threads; on a CPU-only machine
       workers and training compete for the same cores.""",
       "measure-05-oversubscription", "measure-09-workers"),
    _q("pin-memory", "loader",
       "What do `pin_memory=True` and `non_blocking=True` do, and when do they matter?",
       """Pinned (page-locked) host memory lets the GPU copy by DMA without an extra staging copy;
       `non_blocking=True` lets that copy overlap with compute. They matter for large inputs (images, audio,
       float features); for small batches of token ids the difference is tiny.""",
       "measure-05-pin-memory"),
    _q("spawn-main", "loader",
       "A DataLoader with workers fails with \"Can't get attribute ... on <module '__main__'>\". Why?",
       """Under spawn or forkserver each worker is a fresh Python that imports the dataset's class by module
       and name; a class defined in a notebook or in the script's `__main__` cannot be found there. Move it
       (and any collate or init function) into an importable module. Each spawned worker also imports
       PyTorch, which costs start-up time and memory.""",
       "measure-05-spawn", "measure-05-worker-rss"),
    _q("persistent-prefetch", "loader",
       "What are `persistent_workers` and `prefetch_factor` for?",
       """`persistent_workers=True` keeps the worker processes between epochs, so their start-up is paid once.
       `prefetch_factor` is how many batches each worker prepares ahead: it smooths out uneven sample costs,
       but cannot fix a loader that is too slow on average.""",
       "measure-05-startup", "measure-05-prefetch"),
    # ---- DDP ----------------------------------------------------------------------------------------------
    _q("ddp-how", "ddp",
       "How does DistributedDataParallel keep replicas identical, and what does it communicate?",
       """Every process starts from the same weights and buffers (broadcast from rank 0 at construction) and
       trains on its own slice of the data. In backward the gradients are averaged with bucketed AllReduce,
       so every process applies the same update and the weights stay identical. Module buffers (BatchNorm
       running statistics, for example) are also broadcast from rank 0 before a forward pass
       (`forward_sync_buffers`, default on, which replaces the deprecated `broadcast_buffers` in torch 2.13)
       — but only before a forward whose previous backward synchronised: about once per update with
       `no_sync` accumulation, about K times when every micro-batch synchronises. labkit's GPT has no
       buffers, so for it only gradients travel.""",
       "measure-06-ddp-two-procs", "measure-06-buffer-sync"),
    _q("ddp-buckets", "ddp",
       "What are DDP's gradient buckets for, and what is special about the first iteration?",
       """One AllReduce per parameter would pay the latency hundreds of times; one for all gradients could not
       start until backward ends. Buckets (about 25 MB by default) are the compromise: each bucket's
       AllReduce starts as soon as its gradients are ready and overlaps the rest of backward. In the first
       iteration DDP does not yet know the order in which gradients become ready, so the buckets differ
       (here: everything in one); it rebuilds them after.""",
       "measure-06-buckets", "measure-06-first-bucket"),
    _q("no-sync", "ddp",
       "You accumulate K micro-batches under DDP. What must you do, and what happens if you forget?",
       """Run the first K−1 forward/backward passes inside `model.no_sync()`, so gradients add up locally and
       only the last micro-batch all-reduces. Forgetting gives the same result with K times the AllReduce
       calls and bytes per update.""",
       "measure-06-sync-sweep", "measure-06-every-micro-real", "measure-03-allreduce-preview"),
    _q("count-collectives", "ddp",
       "How do you count the AllReduce calls and bytes of a real training job?",
       """Register a DDP communication hook that counts each bucket (and its bytes) and then returns the
       usual averaging AllReduce's future, so the maths is unchanged; or read the collectives from a
       `torch.profiler` trace.""",
       "measure-06-ddp-two-procs", "measure-06-sync-sweep"),
    _q("debug-hang", "ddp",
       "A multi-node job hangs in an AllReduce. How do you find out why?",
       """A collective completes only when every rank calls it with matching arguments, so a hang means one
       rank is elsewhere, called a different collective or shape, or a link is stuck. See where each rank
       is: `py-spy dump --pid` on every rank prints its Python stack (the odd one out is stuck in data
       loading, I/O, a rank-dependent branch, or an earlier collective). Turn on PyTorch's flight recorder
       (`TORCH_NCCL_TRACE_BUFFER_SIZE` > 0 with `TORCH_NCCL_DUMP_ON_TIMEOUT=1`): at the watchdog timeout each
       rank dumps its last collectives with sequence numbers, ops and shapes, which shows the rank that
       lags or mismatches. `TORCH_DISTRIBUTED_DEBUG=DETAIL` checks before each collective that the ranks call
       the same op with the same shapes (slow: for debugging only); it cannot see a skipped call of the same
       shape, and then reports only that a rank failed to pass its monitored barrier. `NCCL_DEBUG=INFO` logs NCCL's set-up: the interfaces and
       transports chosen (InfiniBand or sockets), the topology, and network errors. Use a shorter
       `timeout` in `init_process_group` while debugging so the watchdog fires in minutes. Typical causes:
       a rank that runs a different number of steps or batches, collectives only some ranks call (logging,
       evaluation, checkpointing on rank 0), ranks that disagree on `no_sync` and so on how many AllReduces
       an update makes, different tensor shapes, a straggler (a slow GPU, node or loader that the others
       wait for) and a bad link or NIC (test it with nccl-tests).""",
       "measure-06-ddp-two-procs", "measure-06-sync-sweep", "measure-06-every-micro-real"),
    _q("skipped-collective", "ddp",
       "One rank skips an all_reduce (its batch was empty) and carries on. What happens?",
       """Not a clean hang. Collectives pair by call order, not by intent: the other rank's call completes with
       the skipping rank's *next* all_reduce, so gradients of different updates are averaged from then on,
       and the ranks' parameters, identical until then, drift apart with no error. Only the last call left
       without a partner hangs -- at the end of the run, or when a collective of another shape or op pairs
       with it. The symptom: parameters that differ between ranks from the skipped update on, then a
       timeout. To find it, compare each rank's collective sequence numbers in NCCL's flight
       recorder (`TORCH_NCCL_TRACE_BUFFER_SIZE` > 0); `TORCH_DISTRIBUTED_DEBUG=DETAIL` only names the rank
       that missed its barrier. The fix: every rank calls every collective, in the same order (an empty
       batch contributes zeros).""",
       "measure-06-ddp-two-procs"),
    # ---- network ---------------------------------------------------------------------------------------
    _q("ring-allreduce", "network",
       "How long does a ring AllReduce of S bytes over N GPUs take?",
       """About 2·(N−1)/N · S / bandwidth + 2·(N−1) · latency: a reduce-scatter and an all-gather, each
       N−1 steps moving S/N bytes. The bandwidth term hardly grows with N; the latency term does, so large
       rings and small messages are latency-bound.""",
       "measure-06-ring-model"),
    _q("bytes-per-update", "network",
       "How many bytes does data parallelism move per update, and how can you move fewer?",
       """Each synchronisation all-reduces every gradient once: with `no_sync`, one gradient's worth of bytes
       per update (a ring sends about twice that per GPU). Fewer synchronisations (accumulation), fp16/bf16
       compression hooks (half the bytes) or sharding schemes change it.""",
       "measure-06-bytes", "measure-06-fp16-compress"),
    _q("comm-dominates", "network",
       "When does communication start to dominate data-parallel training, and what pushes that point out?",
       """When AllReduce time per update approaches compute time per update: slow links (Ethernet between
       nodes) reach it at a few GPUs, large N adds latency. Accumulation (more compute per synchronisation),
       overlap with backward, bigger buckets, compression and faster links push it out.""",
       "measure-06-ring-model", "measure-06-sync-sweep"),
    _q("zero-communication", "network",
       "What do ZeRO-1, ZeRO-2 and ZeRO-3/FSDP cost in communication compared with DDP?",
       """ZeRO-1 and ZeRO-2 move the same bytes as DDP: a reduce-scatter of gradients plus an all-gather of
       updated weights equals one all-reduce. ZeRO-3/FSDP also all-gathers each layer's weights before its
       forward and again before its backward: about 1.5× DDP's traffic.""",
       "measure-09-memory-arithmetic", "measure-09-fsdp"),
    _q("fsdp-accumulation", "network",
       "FSDP with gradient accumulation: do you skip gradient synchronisation on the first K−1 micro-batches?",
       """It trades memory against communication. Without skipping, every micro-batch's backward reduce-scatters
       its gradients, so between micro-batches each rank keeps only its shard of the accumulated gradients:
       sharded gradient memory, but K reduce-scatters per update. Skipping (FSDP1's `no_sync()`, FSDP2's
       `model.set_requires_gradient_sync(False)` until the last micro-batch) saves K−1 of them, but each rank
       must keep the full, unsharded gradients between micro-batches — the gradient memory of plain DDP, which
       gives back much of what sharding saved. The weights are all-gathered for every micro-batch's forward and
       backward either way. Skip the sync when memory allows and communication is the bottleneck; keep it when
       the unsharded gradients would not fit.""",
       "measure-09-fsdp", "measure-09-memory-arithmetic", "measure-06-sync-sweep"),
    _q("bus-bandwidth", "network",
       "Algorithm bandwidth or bus bandwidth: what is the difference, how do you benchmark an interconnect, and what should 8 GPUs over NVLink give?",
       """Algorithm bandwidth is bytes ÷ time (algbw = S / t). For AllReduce, nccl-tests report bus bandwidth
       busbw = algbw × 2(n−1)/n: a ring moves 2(n−1)/n × S bytes through each GPU's link, so busbw is
       comparable with the per-GPU link bandwidth (per direction) and does not fall as n grows. Benchmark
       with nccl-tests' `all_reduce_perf` (for example `-b 8 -e 8G -f 2 -g 8` on one node, one process per
       GPU across nodes) or a PyTorch script that times `dist.all_reduce` with CUDA events: warm up first,
       sweep message sizes (small ones measure latency, bandwidth needs hundreds of MB), and test inside a
       node and across nodes separately. On 8 H100 or H200 SXM GPUs, NVLink 4 gives 900 GB/s per GPU in both
       directions together, 450 GB/s each way; published all-reduce runs on such a node report busbw of
       very roughly 350–480 GB/s for large messages (Stas Bekman's ml-engineering, 8× H200: about 370 GB/s
       without in-switch reduction, about 480 GB/s with NCCL's NVLS, above the ring formula's 450 because
       the switch reduces). Across nodes the NIC is the limit (400 Gb/s InfiniBand ≈ 50 GB/s per GPU each
       way).""",
       "measure-06-ring-model", "measure-06-bytes"),
    # ---- kernels, shapes and torch.compile (chapter 07) ---------------------------------------------------
    _q("arithmetic-intensity", "kernels",
       "What is arithmetic intensity, and why does a small matmul run far below the peak FLOP/s while a large one gets close?",
       """Arithmetic intensity is FLOPs per byte moved to or from memory. In the roofline model a device reaches
       its peak only above the *ridge point*, peak FLOP/s ÷ memory bandwidth — about 989e12 / 3.35e12 ≈ 300
       FLOPs per byte for dense bf16 on an H100 SXM; below it, time is bytes ÷ bandwidth. An (m × k)·(k × n)
       matmul does 2·m·k·n FLOPs on m·k + k·n + m·n values: a square n × n one in bf16 does n/3 FLOPs per
       byte, so it needs n in the high hundreds to be compute-bound. In a transformer m is the number of
       tokens in the micro-batch (micro-batch × sequence) and k, n are multiples of the width: shrink the
       micro-batch or the model and the matmuls slide below the ridge, fill fewer tensor-core tiles and fewer
       of the GPU's multiprocessors, and the fixed cost of every kernel launch (microseconds) becomes a
       visible share. Element-wise operations do a handful of FLOPs per element whatever the size: an add or
       a copy is well below one FLOP per byte, and even the heavier ones (tanh-GELU, an exp in bf16) reach
       only a few FLOPs per byte — still far below the ~300 FLOP/byte ridge, so memory-bound at any size.
       That is why MFU depends on shapes at the same FLOPs per token.""",
       "measure-07-mfu-sweep", "measure-07-profile-table"),
    _q("pad-vocab", "kernels",
       "Why do nanoGPT and llm.c pad GPT-2's vocabulary from 50257 to 50304, and would you expect the same gain on a CPU?",
       """It is a rule for GPU tensor cores. 50257 is odd (29 × 1733), so the LM head's output dimension is not
       a multiple of 8, the alignment 16-bit tensor-core kernels want (older cuBLAS versions used tensor cores
       only for such dimensions), let alone of the 64- or 128-wide tiles the kernels compute in: the last
       tile is mostly empty (tile quantization). 50304 = 64 × 786 = 128 × 393 tiles evenly. The 47 extra rows
       add 0.09 % to the head's FLOPs and weights; no input or target ever uses those ids, so training pushes
       their logits down, and a careful sampler masks them out. In GPT-2 small the head (768 × 50257 ≈ 38.6 M
       weights) is over a quarter of the matmul FLOPs per token, so its shape shows in the step time. A CPU's
       matmul library blocks matrices its own way (vector widths, AMX tiles): there the measured verdict can
       go either way, and the interleaved comparison in `measure-07-shapes` says which head was faster on
       your machine, if either. Trust the measurement on the hardware you train on.""",
       "measure-07-shapes"),
    _q("memory-bound-share", "kernels",
       "A profile of one training step shows much of the time outside the matmuls. What is in it, why does it cost so much for so few FLOPs, and how does its share change with model width?",
       """LayerNorm, GELU, softmax, dropout, residual adds, the casts autocast makes of every weight, the
       log-softmax and cross-entropy over the vocabulary, copies, and the optimizer's update. Each reads and
       writes whole tensors for a FLOP or a few per value, so its time is bytes ÷ memory bandwidth, and in
       eager mode each is a separate pass through memory (and, on a GPU, a separate kernel launch). Per token
       the matmul FLOPs grow with d² while the element-wise bytes grow with d, so the element-wise share falls
       roughly as 1/d: small models spend a large share of the step there, wide ones much less — one reason
       MFU rises with model size. Measure it with `torch.profiler` on one step after warm-up, by *self* time
       grouped into matmuls, attention and the rest (on a GPU, kernel time, not the CPU time spent launching).
       Remedies: fusion (`torch.compile`, fused attention, LayerNorm and AdamW kernels) and 16-bit
       activations (half the bytes).""",
       "measure-07-profile-table", "measure-07-mfu-sweep"),
    _q("kernel-fusion", "kernels",
       "What does kernel fusion remove? Count the memory traffic of `gelu(x + b) + r`, eager and fused.",
       """With N elements per tensor and a small bias b, eager runs three kernels: the add reads x and writes a
       temporary, GELU reads it and writes another, the last add reads that and r and writes the result — 4N
       reads and 3N writes. Fused, one kernel reads x and r and writes the result: 3N, about 2.3× fewer bytes,
       two fewer launches and no temporaries; for a memory-bound chain time follows bytes. Fusion removes no
       FLOPs and does not speed up the matmuls themselves (they stay with cuBLAS or oneDNN, though a bias or
       activation can be folded into their epilogue). In training, `torch.compile`'s partitioner also decides
       what backward keeps: cheap element-wise results are recomputed inside the fused backward kernels
       instead of being stored, which saves memory as well. FlashAttention, fused LayerNorm and fused AdamW are
       hand-written fusions of the same idea.""",
       "measure-07-fusion", "measure-07-compile"),
    _q("compile-payoff", "kernels",
       "When does `torch.compile` pay off for a training job, and how do you measure its gain honestly?",
       """The first call traces the Python into graphs (Dynamo), derives the backward graph (AOTAutograd) and
       generates kernels (Inductor: Triton on a GPU, C++ on a CPU, which needs a compiler) — seconds to
       minutes, paid again at every recompilation; an on-disk cache makes a later compile of the same graphs
       faster. Report that compile time apart, and compare the steady-state steps of eager and compiled runs
       interleaved. It pays back after compile time ÷ (eager step − compiled step) updates: a 60 s compile
       that saves 20 ms per step needs 3000 steps — nothing for a pre-training run, a lot for a short
       experiment. Gains are largest where element-wise work and launch overhead dominate (small and medium
       models; `mode="reduce-overhead"` adds CUDA graphs against launch overhead) and small where large
       matmuls already dominate. Watch for graph breaks (each splits the step into separately compiled
       pieces) and for recompilations when shapes change (a short last batch, variable sequence lengths):
       `TORCH_LOGS="graph_breaks,recompiles"` or `torch._dynamo.explain` shows them, and `fullgraph=True`
       turns a break into an error.""",
       "measure-07-compile", "measure-07-fusion"),
    _q("adamw-impl", "kernels",
       "for-loop, foreach or fused AdamW: what is the difference, which one does PyTorch pick, and when does the choice matter?",
       """All compute the same update. The for-loop version runs a handful of element-wise operations per
       parameter tensor, one tensor after another; foreach (`torch._foreach_*`) applies each operation to the
       whole list of tensors at once — far fewer launches, for about one extra copy of the parameters in peak
       memory (intermediates); fused does all of AdamW's arithmetic in one pass that reads each weight,
       gradient and moment once. Left to itself `torch.optim.AdamW` picks foreach when every tensor is on CUDA
       and the for-loop elsewhere; fused must be asked for (`fused=True`) and raises on a device without a
       fused kernel (CUDA has one; CPU and others in recent releases — ask your torch). The step is
       memory-bound: at least four fp32 reads (weight, gradient, two moments) and three writes per parameter,
       28 bytes, so 124 M parameters move about 3.5 GB per update, around a millisecond on an H100 at full
       bandwidth and more with every extra pass. The choice matters when the optimizer is a visible share of
       the step (small micro-batches, many small tensors); with gradient accumulation one step serves K
       micro-batches and its share shrinks.""",
       "measure-07-optimizer"),
    _q("tf32", "kernels",
       "What does TF32 gain and cost, and how do you turn it on in PyTorch?",
       """On Ampere and newer NVIDIA GPUs, tensor cores can run fp32 matmuls in TF32: inputs rounded to 10
       mantissa bits (fp32 has 23; the 8 exponent bits keep fp32's range), products accumulated in fp32. The
       dense peak goes from about 19.5 to 156 TFLOP/s on an A100 and from about 67 to 495 on an H100 SXM. The
       cost is precision: each input keeps about three significant decimal digits instead of seven (unit
       roundoff 2^-11 ≈ 5e-4 against 6e-8), usually harmless for training, not for work that needs fp32
       accuracy. PyTorch runs fp32 matmuls in full precision by default (since 1.12; cuDNN convolutions do
       default to TF32): turn it on with `torch.backends.cuda.matmul.fp32_precision = "tf32"` or
       `torch.set_float32_matmul_precision("high")`, and use one API — torch 2.13 raises when the old
       `allow_tf32` flag is read after the new one was set. Under bf16 autocast it only affects matmuls left
       in fp32. Compute the MFU of a TF32 run against the TF32 peak. CPUs have no TF32: the chapter skips the
       cell there and shows the GPU reference when present.""",
       "measure-07-tf32", "measure-02-tf32", "measure-00-env"),
    _q("flash-attention", "kernels",
       "Why is FlashAttention faster and lighter than textbook (math) attention, though it does as many FLOPs or more?",
       """The math version computes S = QKᵀ, writes the T × T matrix to memory, reads it back for the softmax,
       writes P, reads it again for P·V, and keeps P for backward: memory and memory traffic that grow with
       T², most of it in memory-bound steps. FlashAttention splits Q, K and V into blocks that fit in on-chip
       SRAM and uses an online softmax (a running maximum and sum per row), so S and P never reach main
       memory; it keeps only the output and one log-sum-exp per row and recomputes the blocks in backward.
       Memory becomes linear in T and the T² traffic disappears, so it is faster even though backward redoes
       QKᵀ; under a causal mask, blocks above the diagonal are skipped altogether. PyTorch's
       `F.scaled_dot_product_attention` picks a backend — flash, memory-efficient, cuDNN or math — from the
       device, dtype, head size and mask (`torch.nn.attention.sdpa_kernel` forces one); its flash kernel needs
       fp16 or bf16 on CUDA, so fp32 inputs fall back to another.""",
       "measure-07-attention", "measure-08-seq-sweep"),
    _q("read-trace", "kernels",
       "You have a `torch.profiler` trace of one training step. How do you read it, and what are the traps?",
       """Profile a few steps after warm-up (`torch.profiler.schedule(wait=1, warmup=1, active=2)`) and label
       the phases with `record_function`. In the table, sort by *self* time (`sort_by="self_device_time_total"`
       on a GPU) to find the operations that took the time; *total* time includes everything called inside,
       so use it for the labelled ranges (forward, backward, optimizer) and their shares of the step. Open the
       exported Chrome trace in Perfetto: on a GPU the CPU thread launches kernels asynchronously and should
       run ahead of the GPU's stream; gaps between kernels mean the GPU waited — on Python and launch overhead
       (many tiny kernels), the data loader, or a synchronisation (`.item()`, printing the loss, `.cpu()`, a
       boolean mask), which shows as a long `cudaStreamSynchronize` or device-to-host copy on the CPU row.
       Traps: on a GPU, CPU-side operator times measure launching, not work; the first steps include
       warm-up, allocation and compilation; the profiler adds overhead, so time the run without it;
       communication kernels overlapping compute are not idle time.""",
       "measure-07-trace", "measure-07-profile-table"),
    # ---- memory at scale --------------------------------------------------------------------------------
    _q("bytes-per-param", "memory",
       "How many bytes per parameter does training with Adam in mixed precision need, and of what?",
       """It depends on the regime; say which. PyTorch's autocast (labkit's engine) keeps fp32 weights and
       gradients and makes 16-bit copies on the fly: 4 + 4 + Adam's two fp32 moments 8 = 16, the same as
       plain fp32 training. The classic recipe (Micikevicius et al.; the ZeRO paper) keeps 16-bit weights (2)
       and gradients (2) next to fp32 master weights (4) and the two moments (8): also 16. Frameworks that
       accumulate gradients in fp32 add an fp32 gradient buffer (4): 2 + 2 + 4 + 4 + 8 = 20, the count in
       the Ultra-Scale Playbook's table. Activations come on top.""",
       "measure-08-bytes-per-param", "measure-00-memory-breakdown", "measure-09-baseline"),
    _q("seven-b", "memory",
       "Full fine-tuning of a 7 B model with Adam on 8 GPUs of 80 GB: does it fit, and with what?",
       """In the classic 16-byte regime (16-bit weights and gradients, fp32 master weights and Adam
       moments) model state is 16 × 7e9 = 112 GB: no single card holds it, so plain DDP fails. ZeRO-1 needs
       4 + 12/8 = 5.5 bytes per parameter (38.5 GB per GPU), ZeRO-2 2 + 14/8 (26.25 GB), ZeRO-3/FSDP 2 bytes
       (14 GB). ZeRO-1 fits with room for activations; take the least sharding that fits. With fp32
       gradient accumulation (20 bytes) every figure grows: 140 GB replicated.""",
       "measure-09-memory-arithmetic", "measure-00-llm-scale"),
    _q("activation-scale", "memory",
       "How big are the activations of a large transformer, and what shrinks them?",
       """Per layer about s·b·h·(34 + 5·a·s/h) bytes in 16 bits (sequence s, micro-batch b, width h, heads a;
       Korthikanti et al.). A fused attention kernel removes the s² term; full checkpointing keeps only
       2·s·b·h per layer. ZeRO-1/2/3 shard model state, not activations. What shrinks the activations each
       GPU holds: a smaller micro-batch, checkpointing (selective or full), tensor and sequence parallelism
       (each GPU holds a slice of each layer's activations), context parallelism (a slice of the sequence
       per GPU), activation offload to CPU memory, and ZeRO-R's partitioned activation checkpoints (the
       checkpointed inputs split across the tensor-parallel GPUs instead of replicated). Not pipeline
       parallelism: it shards the weights and model state, but under 1F1B the first stage keeps p
       micro-batches in flight through its L/p layers, L layers' worth of one micro-batch, as much as
       without a pipeline (Korthikanti et al., §4.2.3), so it does not reduce the first stage's activations;
       the interleaved schedule holds 1 + (p−1)/(p·m) times more (m model chunks per GPU).""",
       "measure-09-memory-arithmetic", "measure-08-seq-sweep", "measure-04-block-formula"),
    _q("offload-8bit", "memory",
       "When would you use 8-bit Adam or CPU offload instead of more sharding?",
       """When sharding over the GPUs you have is not enough, or the data-parallel group is small. 8-bit Adam
       stores the two moments in one byte each (Adam's 12 bytes become about 6), at a small numerical cost.
       Offloading moves optimizer states (and possibly weights) to CPU memory, paying PCIe traffic and a CPU
       optimizer step every update: the last resort.""",
       "measure-09-memory-arithmetic"),
    _q("oom-order", "memory",
       "Training runs out of memory at your target effective batch. What do you try, in order?",
       """Read the breakdown first. If activations dominate: a smaller micro-batch with more accumulation
       steps, bf16, then checkpointing (a selective policy, attention-only recomputation or every k-th block
       before full). If model state dominates: shard it
       (ZeRO-1, then 2, then 3), then 8-bit optimizer states, then offload. An out-of-memory error can be
       caught and the memory freed without restarting the process.""",
       "measure-04-memory-budget", "measure-09-pareto"),
    _q("oom-puzzles", "memory",
       "Out of memory with gigabytes free, or only at step 2: what is going on?",
       """Read the error and `torch.cuda.memory_summary()`: memory *allocated* (live tensors) differs from
       memory *reserved* by PyTorch's caching allocator (freed blocks it keeps for reuse), and
       `nvidia-smi` shows reserved memory plus the CUDA context and other processes. "Gigabytes free" with
       a large reserved-but-unallocated share is fragmentation: no single free block fits the request.
       Setting `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (`PYTORCH_ALLOC_CONF` in recent torch)
       lets the allocator grow a segment instead of adding new fixed-size ones, so changing allocation sizes
       fragment memory far less; a memory snapshot
       (`torch.cuda.memory._record_memory_history`) shows what holds the memory. Out of memory only at step
       2 (or at the first `optimizer.step()`): Adam's two moments are created lazily in the first `step()`
       — 8 bytes per parameter that the first forward and backward never had to share memory with — and
       step 1's gradients are still alive during step 2's forward unless `zero_grad()` (which sets them to
       None by default) runs before it.
       Budget for the full model state, not the first iteration's peak.""",
       "measure-08-step2", "measure-08-allocator", "measure-04-memory-budget", "measure-00-memory-breakdown",
       "measure-04-memory-timeline"),
    _q("seq-len-memory", "memory",
       "How does activation memory grow with sequence length, where does a T² term come from, and when does recomputing attention pay off?",
       """Per block and token a transformer keeps a fixed set of values for backward — LayerNorm inputs,
       q/k/v, the attention output, the MLP's input, up-projection and GELU output, the residual stream —
       about 16·d + n_head + 4 per token in the course's fp32 count: linear in T. The math attention backend
       also keeps the softmax output P, n_head × T × T per sequence and block (some implementations add the
       scores and dropout masks), so n_head·T more values per token; that overtakes the linear part once
       n_head·T exceeds about 16·d — near T = 1024 for GPT-2 small (d = 768, 12 heads). A fused kernel
       (FlashAttention) never stores it. Without one, Megatron's selective recomputation keeps everything
       except the attention core and recomputes the core in backward: per block the core costs 4·B·T²·d
       FLOPs against 24·B·T·d² for the block's matmuls, so recomputing it adds T / (18·d + 3·T) to the
       training FLOPs — under 5 % at d = 4096, T = 4096 — and removes the whole T² term. With a fused kernel
       there is nothing left to save. Beyond that, sequence or context parallelism splits T across GPUs.""",
       "measure-08-seq-sweep", "measure-08-attention-recompute"),
    _q("step2-arithmetic", "memory",
       "A 1.3 B-parameter model trained in fp32 with AdamW peaks 8 GB below the card's capacity in update 1. Will update 2 fit?",
       """No. AdamW's two moments (`exp_avg` and `exp_avg_sq`, fp32 like the weights) are created inside the
       first `optimizer.step()`: 8 bytes × 1.3e9 = 10.4 GB that update 1's forward and backward never had to
       share memory with. The run fails in that first step or in update 2's forward or backward, whose peak is
       update 1's plus the state when update 1 peaked in its forward or backward (when update 1 peaked in its
       optimizer step, with gradients and the new state both alive, the jump is smaller — chapter 08 measures
       where each peak falls). The foreach implementation (the CUDA default) also holds temporaries of
       about one more copy of the parameters during the step (5.2 GB here). Budget 16 bytes per parameter (4
       weights + 4 gradients + 8 moments) plus the activations from the start, not the first update's peak.
       Fixes: free activation memory (a smaller micro-batch with accumulation, checkpointing), shrink the
       state (8-bit Adam) or shard it (ZeRO-1); some frameworks create the state before the first step so that
       an out-of-memory error comes at once, not minutes into the run.""",
       "measure-08-step2", "measure-08-timeline"),
    _q("allocator-numbers", "memory",
       "`nvidia-smi` shows far more memory in use than `torch.cuda.memory_allocated()`. Which numbers do you read, how do you tell fragmentation from a real shortage, and does `torch.cuda.empty_cache()` help?",
       """`memory_allocated()` counts live tensors; `memory_reserved()` is what PyTorch's caching allocator
       holds from the driver — live tensors plus freed blocks kept for reuse, because `cudaMalloc` and
       `cudaFree` are slow and synchronise; `nvidia-smi` adds the CUDA context, other libraries' buffers
       (NCCL, cuBLAS workspaces) and other processes. `max_memory_allocated()`, after
       `reset_peak_memory_stats()`, is the peak your tensors needed. When an out-of-memory error reports a
       large amount "reserved by PyTorch but unallocated" (and `memory_stats()` shows large
       `inactive_split_bytes` and rising `num_alloc_retries`), the free memory is cut into pieces too small
       for the request: fragmentation, which `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, set before
       CUDA starts, mostly removes by growing a segment instead of adding fixed-size ones. When allocated
       memory alone is near the card's size, it is a real shortage: keep less. `empty_cache()` hands unused
       cached segments back to the driver (useful for other processes, and for what `nvidia-smi` shows), but
       frees no live tensor, and the allocator already frees its cache and retries before it raises an
       out-of-memory error, so it rarely saves your own run and makes later allocations slower.""",
       "measure-08-allocator"),
    _q("memory-peak", "memory",
       "How do you find what holds the memory at the peak of a training step?",
       """First find when the peak happens: a timeline of one step (bytes held after each operation, as the
       course's tracer draws it) or `torch.cuda.max_memory_allocated()` read after each phase, with
       `reset_peak_memory_stats()` in between. Without checkpointing it often comes early in backward, while
       every saved activation is still alive and the first gradients are built — including the logits'
       gradient, B × T × vocabulary values (about 1.6 GB in fp32 at B = 8, T = 1024 and a 50304-token
       vocabulary) — or at the optimizer step once its state exists. Then find who allocated it: on CUDA,
       `torch.cuda.memory._record_memory_history(max_entries=100000)`, run a few steps,
       `torch.cuda.memory._dump_snapshot("snapshot.pickle")`, and drag the file onto pytorch.org/memory_viz —
       every allocation over time with the Python stack that made it. `torch.profiler` with
       `profile_memory=True, record_shapes=True, with_stack=True` gives a per-operator view
       (`export_memory_timeline`). Both see only memory that goes through PyTorch's allocator: not NCCL's
       buffers or the CUDA context.""",
       "measure-08-timeline", "measure-04-memory-timeline"),
    _q("fp32-grad-accum", "memory",
       "Weights and gradients are bf16. Why do frameworks accumulate gradients in fp32, and what does it cost?",
       """bf16 keeps 8 significant bits: neighbouring values are 2^-7 ≈ 0.8 % apart near 1, so adding a
       contribution below half that spacing — roughly 0.2–0.4 % of the running sum — leaves the sum unchanged,
       and larger ones are rounded. Summing many micro-batches' gradients (accumulation) or many ranks'
       (the data-parallel reduction) in bf16 therefore drops small contributions and lets rounding error grow
       with their number. Megatron-style training keeps an fp32 buffer per parameter (`main_grad`) and adds
       each micro-batch's bf16 gradient into it: 4 more bytes per parameter — 2 + 2 + 4 + 4 + 8 = 20 instead
       of 16 with Adam and fp32 master weights — and, if gradients are all-reduced in fp32, twice the bytes
       of a bf16 reduction. PyTorch's autocast avoids the question: weights and gradients stay fp32, 16
       bytes per parameter with AdamW.""",
       "measure-08-bytes-per-param", "measure-02-finfo"),
    # ---- playbook -----------------------------------------------------------------------------------------
    _q("choose-config", "playbook",
       "Fixed GPUs, a memory budget, a target effective batch: how do you choose micro-batch, K, precision and checkpointing?",
       """Fix the effective batch first (it is a training decision). Use the fastest 16-bit format the
       hardware has. Search micro-batch × checkpointing with K = effective batch ÷ micro-batch, measuring
       throughput and memory of each; draw the Pareto front and take the fastest point inside the budget.
       Then check loader workers on the winner.""",
       "measure-09-grid", "measure-09-pareto", "measure-09-workers"),
    _q("pareto", "playbook",
       "What is a Pareto front, and why is it the right picture for choosing a training configuration?",
       """The configurations that no other one beats on both axes: less or equal memory and more or equal
       throughput. Every other configuration is dominated. With a memory budget the answer is the fastest
       front point left of the budget line; a smaller budget just moves you down the front.""",
       "measure-09-pareto"),
    _q("bigger-batch", "playbook",
       "Why not always use the largest effective batch the hardware runs fast?",
       """Because a bigger batch always costs data. McCandlish et al. (2018, "An Empirical Model of
       Large-Batch Training") model the updates S and examples E a batch B needs to reach one loss as
       S = S_min·(1 + B_crit/B) and E = E_min·(1 + B/B_crit), i.e. (S/S_min − 1)(E/E_min − 1) = 1, with the
       critical batch size B_crit = E_min/S_min. The two regimes are asymptotes: well below B_crit, k times
       the batch (with the learning rate raised — about linearly for SGD with warm-up, closer to the square
       root for Adam) needs about k times fewer steps for about the same data; well above it, k times the
       batch needs about k times the data for about the same number of steps. At B = B_crit a run needs
       twice the minimum of both, so at a fixed token budget a larger batch ends higher even below B_crit
       — one comparison at equal tokens cannot place a batch on either side. Estimate B_crit instead: the
       steps and tokens each of at least three batch sizes needs to reach one target loss, fitted. It grows
       as the loss falls, so it is small early in training. Throughput per second is not progress per
       token.""",
       "measure-09-critical-batch", "measure-09-convergence", "measure-09-lr-batch"),
    _q("fsdp-math", "playbook",
       "Does FSDP change what a model learns compared with data-parallel training on the same batch?",
       """No: it changes where the bytes live, not the arithmetic. Each rank keeps a shard of weights,
       gradients and optimizer state, gathers a layer's full weights just before using it and reduce-scatters
       gradients so each rank updates its own shard. The losses match a single process on the whole batch up
       to rounding.""",
       "measure-09-fsdp"),
    _q("roofline-whatif", "playbook",
       "A roofline model of one training step predicted your small model's step faster than you measured. Why, and would the error shrink on a larger model or another GPU?",
       """A roofline model charges each operation the larger of its FLOPs divided by an achievable FLOP/s and
       its bytes divided by an achievable bandwidth, plus a fixed cost per operation, and sums the operations
       as if nothing overlapped (per operation: charging a whole group max(ΣFLOPs/peak, Σbytes/bandwidth)
       would let small memory-bound kernels hide behind compute-bound ones and lean fast for no good
       reason). What it leaves out is mostly fixed per update: Python in the training
       loop, autograd's bookkeeping, the loader's machinery, DDP's hooks, records and logging. On a small
       model those are a large share of the step, so the prediction comes out too fast; as the matmuls grow,
       arithmetic dominates and the relative error shrinks. On another GPU the same model also depends on the
       achievable fractions you assumed (about 0.6-0.8 of the dense peak for large matmuls, lower for small
       ones) and on fusion: `torch.compile` or hand-fused kernels remove memory traffic the eager model
       counts. On a GPU the error can point the other way: real kernels overlap communication and hide
       launches behind running work, which the no-overlap sum does not, so there it leans slow where those
       matter. Validate the model where you can measure (your own machine, one thread, interleaved repeats),
       report its error beside every prediction, and call the numbers predicted.""",
       "measure-09-whatif", "measure-09-whatif-gpus"),
    # ---- when the model does not fit (chapter 10) ------------------------------------------------------
    _q("choose-layout", "parallel",
       "A 70 B-parameter model, 64 GPUs of 80 GB in nodes of 8 (NVLink inside a node, InfiniBand between nodes), sequences of 4096 tokens. Tensor, pipeline or sharded data parallelism: how do you choose the layout?",
       """Start from memory, then place each kind of parallelism on the links it can afford. Mixed-precision
       Adam needs 16 bytes a parameter, 1.12 TB here, so the state must be split more than 14 ways before
       anything else fits on the card. Activations decide the rest: 80 layers × 4096 tokens × d = 8192
       come to about 34·s·h bytes a layer for one sequence, some 90 GB, even with a fused attention kernel.
       ZeRO and FSDP shard state only, never activations, so FSDP over all 64 GPUs leaves 17.5 GB of state
       per GPU but does not fit as it is. The first lever is activation recomputation: with full
       checkpointing a layer keeps only its 16-bit input (2·s·h bytes, some 5 GB for all 80 layers) and
       pays one extra forward, so FSDP plus recomputation fits with no model parallelism at all; the
       question becomes whether its extra third of compute costs more than TP's and PP's communication. Tensor parallelism splits most of each layer's activations as well as its
       weights, but its AllReduces block every block's forward and backward, so keep it inside a node
       (tp ≤ 8). Across nodes, pipeline stages exchange only the activations at stage boundaries, point to
       point, which InfiniBand handles easily; the price is the bubble, (p − 1)/(m + p − 1) of each step,
       so a stage needs many micro-batches per step. Sharded data parallelism goes on the outermost axis:
       ZeRO-1 costs no more traffic than DDP, while ZeRO-3/FSDP with its defaults re-gathers the weights
       for every micro-batch, so its traffic grows with gradient accumulation where a pipeline's bubble shrinks.
       With pipeline stages, gradients sharded per micro-batch would need a ReduceScatter for every
       micro-batch each stage runs: DeepSpeed's pipeline engine refuses ZeRO-2/3 and Megatron's distributed
       optimizer is ZeRO-1. PyTorch-native stacks do combine FSDP with PP (torchtitan sets
       `reshard_after_forward = not pp_enabled`; `torch.distributed.pipelining` turns gradient sync and
       reshard-after-backward off until a stage's last micro-batch), so each stage reduce-scatters once per
       step and holds whole weights and gradients meanwhile: ZeRO-1's bytes within the step, sharded between
       steps. Llama 3 405B, with 16 pipeline stages, sharded its gradients and optimizer state over its
       data-parallel ranks.
       A typical answer is tp = 4 or 8 in each node, a few pipeline stages, and DP with ZeRO-1 across what is
       left. Then list every layout that fits, estimate each one's step time (compute plus the
       communication it adds) and measure the best two or three before you commit.""",
       "measure-10-layout", "measure-10-tp-link", "measure-10-published-layout"),
    _q("pipeline-bubble", "parallel",
       "What is the pipeline bubble, how large is it for p stages and m micro-batches, and how do you make it smaller?",
       """With GPipe or 1F1B and micro-batches of equal cost, a stage cannot start before the first
       micro-batch reaches it and has nothing to do once its last one has passed. A step lasts m + p − 1
       micro-batch slots; each stage works in m of them and idles in p − 1. So the idle share of the step
       is (p − 1)/(m + p − 1). Megatron-LM's paper writes (p − 1)/m, which measures the same idle time
       against the ideal bubble-free time: with p = 4 and m = 8 that is 3/8 of the ideal, and 3/11 of the
       real step. Say which one you mean. 1F1B does not shrink the bubble, it only needs less memory.
       What does shrink it: more micro-batches per step (m ≫ p), which at a fixed global batch means
       smaller micro-batches or fewer data-parallel replicas; interleaved stages, where each GPU holds v
       non-adjacent chunks and the bubble falls by about v, paid for with v times the point-to-point
       messages; and zero-bubble schedules, which split backward into the input gradient and the weight
       gradient and move the weight gradients into the idle slots. A measured bubble usually comes out
       larger than the formula, because stages are uneven (the embedding and the head sit on the first and
       last stage) and each micro-batch's send and receive add a latency on every link, 2·m messages per
       step, so more micro-batches are not free. On a machine shared with other processes the measured
       step can be far longer than the schedule's; then the replay, the schedule with the measured compute
       times, is the number to read.""",
       "measure-10-bubble"),
    _q("one-f-one-b-memory", "parallel",
       "GPipe and 1F1B have the same bubble. Why does 1F1B need less activation memory, and how much less?",
       """GPipe runs all m forwards first, so each stage keeps the saved activations of all m micro-batches
       until backward begins. 1F1B starts the backward of a micro-batch as soon as it returns from the last
       stage and then alternates one forward with one backward. Stage i, counted from 0, therefore holds at
       most p − i micro-batches in flight, so the first stage holds p. At equal m ≥ p the first stage's
       activation peak falls from m to p micro-batches' worth, a factor of m/p in saved activations. The
       ratio of whole-GPU peaks is smaller, because weights, gradients and buffers are the same in both
       schedules. Two consequences are
       worth saying. First, the memory is uneven: the first stage holds p micro-batches and the last holds
       one, so the first stage sets the limit. Second, p micro-batches through L/p layers is L layers'
       worth of one micro-batch, the same as an unsplit model, so pipelining does not reduce the first
       stage's activations. It shards the weights and the state, not the activations. With m < p the
       warm-up shrinks to min(p − s − 1, m) forwards and the pipeline never reaches its steady state;
       Megatron-LM allows that, PyTorch's `Schedule1F1B` refuses it.""",
       "measure-10-pp-memory", "measure-10-bubble"),
    _q("tp-block-collectives", "parallel",
       "In Megatron-style tensor parallelism, how many AllReduce calls does one transformer block make, and why must a fused qkv projection be split per head?",
       """In the MLP, the first layer (fc) is split by columns: each rank computes its slice of the hidden
       units, and GELU works on that slice. The second layer is split by rows, so each rank produces a
       partial sum of the full output, and one AllReduce adds them up. Attention works the same way: split
       q, k and v by heads (column-parallel), run attention locally on each rank's heads, and make the
       output projection row-parallel, followed by one AllReduce. That is 2 AllReduces per block in
       forward. Backward mirrors it: the gradient of each column-parallel layer's input is a partial sum
       on every rank and must be all-reduced. With a fused qkv layer there are two such inputs, qkv and fc,
       so 2 more. With q, k and v as three separate column-parallel layers there are 4, unless the three
       partial gradients are added locally before a single AllReduce. Every call sums a micro-batch ×
       sequence × d_model tensor. Per head matters because a fused weight stacks all of q, then all of k,
       then all of v. A plain split by rows gives one rank all of q and half of k, so it cannot compute a
       single head. Permute the rows first so that each rank's slice holds the q, k and v of whole heads,
       and map the unsplit model's weights the same way when you test equivalence.""",
       "measure-10-tp"),
    _q("sequence-parallel", "parallel",
       "What does sequence parallelism change in a tensor-parallel block, and what does it save?",
       """Without it, the regions between tensor-parallel layers (LayerNorm, dropout, the residual adds) are
       replicated. Every rank holds the full micro-batch × sequence × d activations there and does the
       same work. Sequence parallelism (Korthikanti et al., 2022) splits those regions along the sequence
       dimension. Each forward AllReduce becomes a ReduceScatter, which leaves every rank with the summed
       output for its own tokens, followed by an AllGather that rebuilds the full sequence before the next
       column-parallel layer. Backward does the reverse. A ring AllReduce is a ReduceScatter followed by an
       AllGather, so the bytes on the wire stay the same and the number of collective calls doubles. What
       it saves is activation memory: per layer, from s·b·h·(10 + 24/t) bytes down to 34·s·b·h/t (16-bit,
       fused attention). The replicated part is split t ways too, along with the LayerNorm and dropout
       work. The cost is a little bookkeeping: each rank's LayerNorm sees only its own tokens, so the
       LayerNorm weight gradients must be summed over the tensor-parallel group. In PyTorch,
       `SequenceParallel()` on the norms, with `ColwiseParallel(input_layouts=Shard(1))` and
       `RowwiseParallel(output_layouts=Shard(1))`, gives this pattern.""",
       "measure-10-tp"),
    _q("tp-inside-node", "parallel",
       "Why is tensor parallelism kept inside a node while pipeline and data parallelism cross nodes?",
       """Because of what it sends and when. Each block makes 4 AllReduces per micro-batch (2 forward,
       2 backward), each of micro-batch × sequence × d_model 16-bit values, and the next layer waits for
       every one of them, so they sit on the critical path and overlap little with compute. The bytes per
       GPU do not shrink as t grows, because a ring moves 2(t − 1)/t of the tensor, while each GPU's
       compute falls as 1/t. So the share of time spent communicating rises with t. A worked example with
       datasheet figures: at b = 1, s = 4096 and d = 8192 one AllReduce carries 64 MiB, and 80 layers ×
       4 × 1.75 is about 37 GB sent per GPU per micro-batch at t = 8. At NVLink's 450 GB/s each way that is
       under a tenth of a second, a bearable share of the matmul time (roughly a third at these sizes).
       Over a 400 Gb/s NIC (about 50 GB/s) it is nearly a second, longer than the compute it blocks.
       Production stacks hide part of it (Megatron-LM overlaps the input-gradient AllReduce with the
       weight-gradient GEMM; with sequence parallelism the collectives can be split and overlapped with
       the GEMMs), but only part. A pipeline boundary sends one such tensor
       per micro-batch each way, point to point, and data parallelism reduces gradients once per step,
       overlapped with backward. Both tolerate the slower links between nodes.""",
       "measure-10-tp-link", "measure-10-tp"),
    _q("fsdp2-accumulation-counts", "parallel",
       "FSDP2 with K micro-batches per update: how many AllGather and ReduceScatter calls does each update make, and what does `set_requires_gradient_sync(False)` change?",
       """Say `fully_shard` wraps every block and then the root, giving G parameter groups. Each
       micro-batch's forward AllGathers every group once. With the default `reshard_after_forward` (None:
       True for the blocks, False for the root), every
       block's weights are freed after its forward and gathered again for its backward. The root keeps its
       weights, because they would be needed again at once. That makes about K·(2G − 1) AllGathers per
       update. If gradients are synced on every micro-batch, each backward also ReduceScatters every group:
       K·G calls, and between micro-batches each rank keeps only its shard of the accumulated gradient.
       Calling `model.set_requires_gradient_sync(False)` before the first K − 1 backwards, and `True`
       before the last, cuts that to G ReduceScatters per update. The price is memory: until the last
       micro-batch, every rank holds full unsharded gradients, as much as plain DDP. The AllGathers do not
       change. To save those too, `set_reshard_after_backward(False)` keeps the gathered weights between
       micro-batches, at the memory cost of unsharded weights. Count the calls (a wrapped process group or
       the profiler) and read the peak memory, because either can be the limit.""",
       "measure-10-fsdp-accum", "measure-10-reshard"),
    _q("reshard-after-forward", "parallel",
       "What does FSDP2's `reshard_after_forward` trade, and when would you set it to False or to an integer?",
       """With True (ZeRO-3), each wrapped module frees its gathered weights as soon as its forward ends and
       gathers them again for backward. That is two AllGathers and one ReduceScatter per module per
       micro-batch, and between the passes only the shards stay resident. With False, the gathered weights
       stay until backward has used them: one AllGather fewer per module per micro-batch, about the
       traffic of ZeRO-2, but at the end of the forward every module's unsharded weights are resident at
       once. That gives back much of what sharding saved at the peak. An integer reshards after forward to
       a smaller group, for example the GPUs of one node, so the backward re-gather runs over fast links
       and memory lands in between. Choose False when memory is plentiful and the AllGathers are exposed.
       Choose True when weight memory is what does not fit. Choose an integer on multi-node jobs where
       inter-node bandwidth is the bottleneck. The root module is not resharded by default (its default,
       None, means False for the root and True for the others), since backward needs it right away;
       passing True to the root's `fully_shard` reshards it too, one more AllGather per micro-batch.""",
       "measure-10-reshard", "measure-10-fsdp-accum"),
    _q("fp8-mfu", "parallel",
       "What does FP8 training change, and how do you report MFU for an FP8 run?",
       """FP8 changes the big matmuls. The linear layers' forward GEMM and their two backward GEMMs (input
       and weight gradients) run on FP8 tensor cores, whose dense peak on an H100 or H200 is about twice
       the bf16 one. Activations and weights are cast to E4M3, and gradients often to E5M2. Each tensor
       carries a scale that maps its range onto FP8's few bits, set per tensor from a history of maxima
       (delayed scaling) or from the current tensor, or in finer blocks: per row, per 128-element tile, or
       MX formats' 32-element blocks. The master weights, the optimizer state and the gradient reduction
       stay in higher precision (the weights' FSDP AllGather need not: torchao's float8 with
       `enable_fsdp_float8_all_gather` gathers them in FP8, half the bytes), and so, usually, do
       attention's softmax, the norms, the embeddings and
       the output head. Only the share of time spent in FP8-capable matmuls gets faster, and the casts and
       scale computations add memory-bound work, so predict the speed-up from that share rather than from
       the peak ratio. For MFU, the model FLOPs stay the same and the peak you divide by must be named.
       Against the FP8 peak, a run that became 1.5 times faster shows a lower MFU than its bf16 baseline.
       Against the bf16 peak, an FP8 run can show an MFU that no bf16 run could reach, even above 100 %. Report both, or the one a
       comparison needs, say which it is, and label a figure from a model rather than a run as
       predicted.""",
       "measure-10-fp8", "measure-10-layout"),
    # ---- a long run: checkpoints, resumes, failures ----------------------------------------------------
    _q("resume-exact", "longrun",
       "What must a checkpoint hold for a training run to resume exactly as if it had never stopped?",
       """Everything that changes during training and that the code does not rebuild: the model's weights;
       the optimizer's state_dict (Adam's two moments and step count, and the learning rate the scheduler
       last wrote into its param_groups); the scheduler's step count; the GradScaler's scale and growth
       counter with fp16; the state of every random generator a step uses (Python's, NumPy's, torch's on the
       CPU and on each GPU, in every rank, since each draws its own dropout masks); and the data loader's
       position, the epoch and how many samples the training loop has consumed. With loader workers that
       count must come from the loop, not the sampler, because workers prefetch batches the loop has not
       used yet. Save at an update boundary, never halfway through gradient accumulation, and write the file
       atomically (a temporary file, then a rename) so a crash during the save cannot damage the last good
       checkpoint (a process crash; against a machine crash, fsync the file before the rename and its folder
       after). On GPUs a bit-exact match also needs deterministic kernels. Compare the resumed run with
       an uninterrupted one bit for bit to prove it, and drop one item at a time to see each one matter.""",
       "measure-11-exact", "measure-11-ablation"),
    _q("resume-diverges", "longrun",
       "After a resume the loss curve no longer matches the uninterrupted run. How do you find what the checkpoint missed?",
       """Look at the first update after the resume. Its loss is computed from the restored weights before
       any update, so if it already differs, the input or the forward pass changed. A batch that repeats
       an early one means the loader's position is missing. The same batch with another loss means a
       random draw in the forward pass, dropout's masks, so the generators' state is missing. If the first
       loss matches and later ones drift, the update changed. A learning rate back in warm-up means the
       scheduler was not restored. Every weight moving by about the learning rate means Adam's moments
       are missing, because Adam's first step is sign-like. A loss scale back at 65,536, possibly with a
       skipped step, means the GradScaler was not restored. Log the learning rate, the loss scale and a hash
       of each batch, and the diagnosis takes minutes instead of days.""",
       "measure-11-ablation"),
    _q("dcp-why", "longrun",
       "Why save a sharded model with torch.distributed.checkpoint instead of torch.save(model.state_dict()) on rank 0?",
       """Gathering the full state on rank 0 needs the whole model and optimizer in one process's memory,
       which is the one thing a sharded model cannot afford, and it makes a single writer the bottleneck.
       With DCP every rank writes only its own shards, in parallel, and a metadata file records where each
       piece of each tensor lives. So a load can reshard: a checkpoint saved on 2 ranks loads on 1 or on 4.
       On a fixed cluster that matters, because a restart may come back with fewer healthy nodes. DCP also
       offers an asynchronous save, and converters to and from a plain torch.save file for inference.""",
       "measure-11-dcp", "measure-11-reshard"),
    _q("async-checkpoint", "longrun",
       "What does an asynchronous checkpoint save you, and what does it cost?",
       """A synchronous save stops training for the whole write. An asynchronous save (DCP's async_save)
       writes in the background while training continues. With its default stager the call blocks while
       the state is staged, copied from the GPU or the training tensors into host memory; a stager with
       async staging, pinned and shared memory and non-blocking copies
       (`DefaultStager(StagingOptions(...))`, on GPUs; torchtitan's `async_with_pinned_mem` with a
       process checkpointer) moves that copy off the loop too, and the loop waits only before it next
       changes the weights. What is left of the save is hidden behind training. The costs: a second copy
       of the state in host memory (often pinned); the background work competes with training for CPU,
       memory and file system bandwidth; the next save, and the end of the job, must wait for the
       previous one to finish; and a failure during the write loses that checkpoint, so the previous one
       must stay until the new one is complete. Measure the whole cost before relying on it: the call's
       block plus how much slower the updates that overlap the write run. On a machine whose cores the
       training already fills, that sum can exceed a synchronous save.""",
       "measure-11-async-save"),
    _q("checkpoint-interval", "longrun",
       "How often should a large training job checkpoint?",
       """Balance two costs. Saving every τ seconds costs C/τ of the run, where C is the time a save blocks
       training. A failure loses on average τ/2 of work plus the restart, once per mean time between
       failures M. The sum is smallest at Young's interval τ = √(2·C·M), and Daly refined it for
       intervals that are not small against M. At that interval the overhead is about √(2·C/M). M falls
       with the cluster's size, because every GPU, host and link can fail. Meta's Llama 3 report counted
       419 unexpected interruptions in 54 days on 16,384 GPUs, about one every three hours. A job of
       1,024 such GPUs would see one about every two days, a job of 16,384 every few hours. So a faster save,
       whether asynchronous or sharded, lets a job checkpoint more often for the same overhead.""",
       "measure-11-interval"),
    _q("rank-failure", "longrun",
       "One rank of a 1,024-GPU job dies. What happens next in a well-built job, and how much work is lost?",
       """It depends on how it dies, and on the backend. If a process crashes, its kernel closes its
       sockets: with gloo, or NCCL over TCP sockets, the peers' next collective fails within
       milliseconds, while NCCL peers on NVLink or shared memory (often InfiniBand too) see nothing and
       spin until the NCCL watchdog's timeout. Either way the launcher on its node (torchrun's elastic
       agent) sees the dead worker within about a second, and that is what starts the recovery. If a
       whole machine dies, nothing tells the peers: they hang in their collective until its timeout (the
       NCCL watchdog, or the timeout given to init_process_group). The defaults are 10 minutes for NCCL
       and 30 for gloo: choose one on purpose, longer than the slowest healthy collective (a
       checkpoint's, a first step that compiles) and no longer. Then the launcher tears down every
       worker of the job, not only the dead one, and starts them all again, up to --max-restarts times;
       with a fixed --nnodes a lost machine must be replaced by the scheduler first, while a range
       (--nnodes=min:max) lets the job go on with fewer. Each new rank loads the latest complete
       checkpoint and continues. The job loses the work done since that checkpoint, plus the restart:
       detection, new processes, rendezvous, the load and warm-up. With an exact resume the final
       weights are the same as an uninterrupted run's. Checkpoints must be written atomically so that
       the latest one is always complete, and a node that fails again and again should be drained, not
       retried forever.""",
       "measure-11-failure"),
    _q("loss-spike", "longrun",
       "Halfway through a run the loss jumps to several times its recent level. What do you do?",
       """First, do not let one bad update through. A guard compares each loss, or the gradient norm, with
       the median of the last few hundred updates and, above a threshold, skips that update. If the run has
       already taken damage, with the loss staying high, roll back to the last checkpoint and skip or
       reorder the data that caused it. The cause is often a bad batch or an unstable attention
       layer, and large runs also lower the learning rate or add QK-norm for this reason. GradScaler only
       catches inf and NaN gradients in fp16: it skips that update and halves the scale, but a finite spike
       passes through it. labkit's on_nonfinite does the same for runs without loss scaling: stop or skip on
       inf/NaN. Detection of finite spikes is up to you, and measuring what skip and rollback do to the
       loss curve shows which one a run needs.""",
       "measure-11-spike"),
]


def topics_in_order() -> list:
    return [t for t in TOPICS if any(q.topic == t for q in QUESTIONS)]


def by_topic(topic: str | None = None) -> list:
    if topic is not None and topic not in TOPICS:
        raise ValueError(f"topic={topic!r}: choose one of {', '.join(TOPICS)}")
    return [q for q in QUESTIONS if topic is None or q.topic == topic]


def get(qid: str) -> Question:
    for q in QUESTIONS:
        if q.id == qid:
            return q
    raise KeyError(f"no question {qid!r}")


def by_notebook(q: Question) -> list:
    """[(notebook, [tags])] in the order the answer names them."""
    out = {}
    for t, nb in q.backed_by():
        out.setdefault(nb, []).append(t)
    return list(out.items())


def drills_for(q: Question) -> list:
    """The drills (``lk.drills`` case ids) that exercise this answer's effect: those whose teaching cell is
    one of the cells backing it. Derived from the catalogue, so it is written down once (in the case)."""
    return [c.id for c in CASES if c.teaches in q.tags]


def drills_markdown(q: Question) -> str:
    """'Drill it: `lk.drills.Drill("sync-every-micro")`, ...' or '' when no drill exercises it."""
    ids = drills_for(q)
    return ("Drill it: " + ", ".join(f'`lk.drills.Drill("{i}")`' for i in ids) + ".") if ids else ""


def backed_by_markdown(q: Question, link_prefix: str = "") -> str:
    return "Backed by: " + "; ".join(", ".join(f"`{t}`" for t in tags) + f" in [{nb}]({link_prefix}{nb})"
                                     for nb, tags in by_notebook(q))


def to_html(text: str) -> str:
    """The little markdown the bank uses (`code`, **bold**, *italic*, [links](x)) as safe inline HTML."""
    out = html.escape(text, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    out = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", out)
    out = re.sub(r"(?<![\w*])\*([^*\n]+)\*(?![\w*])", r"<i>\1</i>", out)
    out = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r'<a href="\2" target="_blank">\1</a>', out)
    return out


def to_markdown(topic: str | None = None) -> str:
    """The bank as plain markdown: each answer in a collapsible block, each pointing at its cell tags."""
    qs = by_topic(topic)
    lines = [
        "# Interview questions: training on a fixed number of GPUs",
        "",
        "<!-- Generated from labkit/content/questions.py by `python -m labkit.content.questions --write`. Edit the source, "
        "not this file. -->",
        "",
        f"{len(qs)} questions with worked answers. Answer each one yourself (out loud or on paper) before you",
        "open the answer. Every answer names the cell that backs it: open the chapter notebook, find the cell",
        "with that tag (JupyterLab: the property inspector, or search the notebook for the tag) and run it on",
        "your own hardware. The same questions as a self-quiz: `interview_questions.ipynb`.",
        "",
    ]
    n = 0
    for t in TOPICS:
        group = [q for q in qs if q.topic == t]
        if not group:
            continue
        lines += [f"## {TOPICS[t]}", ""]
        for q in group:
            n += 1
            drill = drills_markdown(q)
            lines += [f"<details><summary><b>{n}.</b> {to_html(q.question)}</summary>", "", q.answer, "",
                      f"*{backed_by_markdown(q)}*", *([drill] if drill else []), "</details>", ""]
    return "\n".join(lines).rstrip() + "\n"


def write_markdown(path=MARKDOWN_PATH) -> str:
    Path(path).write_text(to_markdown())
    return str(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="The labkit interview question bank as markdown.")
    ap.add_argument("--write", action="store_true", help=f"rewrite {MARKDOWN_PATH.name} next to the notebooks")
    ap.add_argument("--topic", choices=list(TOPICS), help="one topic only (printing)")
    args = ap.parse_args(argv)
    if args.write:
        print(f"wrote {write_markdown()} ({len(QUESTIONS)} questions)")
    else:
        sys.stdout.write(to_markdown(args.topic))
    return 0


if __name__ == "__main__":
    sys.exit(main())
