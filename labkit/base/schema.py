"""What a run reports: one ``Record`` per optimizer update and one ``Summary`` at the end.

``train`` builds them; the charts (plots), the panel, the CLI and the checkers read them. The keys are
a contract (the CLI's ``--json``, saved histories, reference files), so they are written down once,
here, with their types; units are in the names (``_s`` seconds, ``_bytes`` bytes, ``_per_s`` a rate,
``mfu``/``hfu`` a fraction of the peak). ``tests/test_schema.py`` checks that a real run produces
exactly these keys and that the modules which read them ask for no key that is not here.
"""
from __future__ import annotations

from typing import Optional, TypedDict


class _RecordEveryRank(TypedDict):
    update: int                       # 1, 2, ... (optimizer updates)
    loss: float                       # mean over the update's micro-batches (and ranks)
    grad_norm: float                  # global gradient norm before clipping
    grad_scale: Optional[float]       # the GradScaler's scale after the update; None without one
    skipped: bool                     # the update was not applied (inf/NaN gradients)
    nonfinite: bool                   # the loss or the gradient norm was inf/NaN
    step_time_s: float                # wall time of the whole update, device synchronised
    cpu_s: float                      # CPU time of this process (every thread) during the update
    data_wait_s: float                # time blocked on the loader
    optimizer_s: float                # unscale, clip and step (CUDA events on a GPU)
    compute_s: float                  # the rest: forward and backward
    tokens: int                       # tokens in the update, every rank together
    tokens_per_s: float
    samples_per_s: float
    peak_mem_bytes: Optional[int]     # the device's peak so far; None on a CPU or MPS
    allreduce_calls: Optional[int]    # collectives DDP launched in this update; None without DDP
    allreduce_bytes: Optional[int]
    elapsed_s: float                  # since the first update started


class Record(_RecordEveryRank, total=False):
    """One optimizer update. Rank 0's records (the ones a caller sees) also carry utilisation and
    the memory breakdown, so live charts need not wait for the summary."""

    mfu: Optional[float]
    hfu: Optional[float]
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    autocast_weight_copy_bytes: int


class ConfigEcho(TypedDict):
    """The configuration as the run used it: Config fields, the shape resolved from the preset."""

    model: str
    precision: str
    loss_scaling: str
    init_scale: float
    growth_interval: int
    accum: int
    micro_batch: int
    seq_len: int                      # resolved: the preset's when Config.seq_len is None
    checkpointing: str
    checkpoint_every: int
    optimizer: str
    attention: str
    compile: bool
    workers: int
    pin_memory: bool
    data_cost_ms: float
    world_size: int                   # the processes that ran (torchrun decides under torchrun)
    steps: int
    seed: int
    lr: float
    grad_clip: Optional[float]
    on_nonfinite: str
    ddp_sync: str
    bucket_cap_mb: float
    comm_hook: str
    memory_budget_gb: Optional[float]
    threads: Optional[int]
    n_layer: int                      # resolved from the preset
    d_model: int
    n_head: int
    tokens_per_update: int            # micro_batch x seq_len x accum x world_size
    tokens_per_step: int              # the same number under its first name (CLI --json, old histories)


class StoppedSummary(ConfigEcho):
    """What a stopped run returns instead of a Summary."""

    status: str                       # "stopped"
    updates_done: int


class Summary(ConfigEcho):
    """A completed run: medians over the timed updates (``warmup`` left out), totals and the setting."""

    status: str                       # "completed"
    device: str                       # the kind that ran: cuda, mps or cpu
    device_name: str
    device_reason: str
    precision_note: Optional[str]     # what this device means for the precision's speed, for a learner
    compute_capability: Optional[str]
    n_params: int
    n_matmul_params: int
    timed_updates: int
    step_time_s: float
    tokens_per_s: Optional[float]
    samples_per_s: Optional[float]
    data_wait_s: float
    compute_s: float
    optimizer_s: float
    data_wait_frac: Optional[float]
    intra_op_threads: int
    cpu_s_per_update: float
    peak_mem_bytes: Optional[int]
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    autocast_weight_copy_bytes: int
    model_flops_per_step: int         # one update, every rank together
    hardware_flops_per_step: int      # with checkpointing's recompute
    peak_flops: float                 # per device
    peak_flops_source: str
    mfu: Optional[float]
    hfu: Optional[float]
    mfu_note: Optional[str]           # why a utilisation above 100 % is shown
    final_loss: Optional[float]
    first_loss: Optional[float]
    grad_norm: Optional[float]
    skipped_steps: int
    nonfinite_steps: int
    grad_scale: Optional[float]
    corpus_sha: str
    torch_version: str
    python_version: str
    n_buckets: Optional[int]          # DDP's buckets after its first iteration; None without DDP
    first_update_buckets: Optional[int]
    allreduce_calls: Optional[int]
    allreduce_bytes: Optional[int]
    allreduce_calls_per_update: Optional[float]  # update 1 left out: DDP's first iteration differs
    allreduce_bytes_per_update: Optional[float]
    comm_time_s: None                 # not measured (always None); kept: the CLI's --json promises the key
    ddp_note: str
    worker_cpu_s: Optional[float]     # loader workers' CPU time (None without workers or psutil)
    param_fingerprint: float
    replicas_identical: bool


def keys(schema) -> tuple:
    """Every key of a schema (required and optional), in the order it lists them."""
    return tuple(schema.__annotations__)


RECORD_KEYS = keys(Record)
SUMMARY_KEYS = keys(Summary)
CONFIG_KEYS = keys(ConfigEcho)
# The memory breakdown, in the order it stacks, with words for a chart.
MEMORY_PARTS = (("param_bytes", "parameters"), ("grad_bytes", "gradients"),
                ("optimizer_bytes", "optimizer state"), ("activation_bytes", "activations"),
                ("autocast_weight_copy_bytes", "autocast weight copies"))


def summary_of(run) -> Optional[dict]:
    """The summary of one run: a Result's ``summary``, a {"summary": ...} dict's, or a bare summary
    dict; None for a bare list of records."""
    if isinstance(run, dict):
        return run.get("summary") if ("summary" in run or "records" in run) else run
    s = getattr(run, "summary", None)
    return s if isinstance(s, dict) else None


def tokens_per_update(summary: dict) -> Optional[int]:
    """Tokens per optimizer update of a summary -- also one saved before the key had this name."""
    return summary.get("tokens_per_update", summary.get("tokens_per_step"))
