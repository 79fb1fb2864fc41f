"""Chapter 08's bytes: the CUDA caching allocator (its statistics, the fragmentation patterns' arithmetic,
its history, the fragmentation demo in a process of its own per setting) and bytes per parameter of three
mixed-precision recipes."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from ...base.paths import check_writable, write_atomic
from ...engine.config import Config, ConfigError, _int, _num
from ...engine.data import make_loader
from ...engine.device import capabilities, intra_op_threads, torch_device
from ...engine.measure import activation_bytes, state_bytes
from ...engine.model import GPT
from ...engine.precision import autocast
from ...engine.step import make_optimizer
from ...engine.tracer import Tracer
from ...engine.train import run
from ...tools.memory import MIB, _config, _rows, _size, _threads
from ..course import table  # rows that show themselves as a markdown table
from ..measured import grading_tool

def allocator_stats(device=None) -> dict:
    """The CUDA caching allocator's view: allocated, reserved and their difference, inactive splits, segments
    (an expandable segment's mapped pages are not in ``segment.all.current``), retries, OOMs and driver calls.
    Shown in 08_memory_in_practice (code-08-memory-stats); measure-08-allocator reads it after a run."""
    if not torch.cuda.is_available():
        raise RuntimeError("allocator statistics come from the CUDA caching allocator; this machine has no CUDA GPU")
    s = torch.cuda.memory_stats(device)
    alloc = s.get("allocated_bytes.all.current", 0)
    reserved = s.get("reserved_bytes.all.current", 0)
    return {"allocated": alloc, "reserved": reserved, "reserved_unallocated": reserved - alloc,
            "peak_allocated": s.get("allocated_bytes.all.peak", 0), "peak_reserved": s.get("reserved_bytes.all.peak", 0),
            "inactive_split": s.get("inactive_split_bytes.all.current", 0),
            "segments": s.get("segment.all.current", 0), "alloc_retries": s.get("num_alloc_retries", 0),
            "ooms": s.get("num_ooms", 0), "device_allocs": s.get("num_device_alloc", 0),
            "device_frees": s.get("num_device_free", 0), "fragmentation": 1 - alloc / reserved if reserved else 0.0}


# The allocator's rounding (c10/cuda/CUDACachingAllocator.cpp): a cudaMalloc'd segment for a request of
# 10 MiB or more is rounded up to 2 MiB (kRoundLarge); an expandable segment maps pages of 20 MiB (kLargeBuffer).
PAGE_MIB = {False: 2, True: 20}


def _pages(mib: float, expandable: bool) -> int:
    p = PAGE_MIB[expandable]
    return int(math.ceil(mib / p) * p)


def hole_pattern(block_mib: int = 64, count: int = 16, request_mib: int = 192, expandable: bool = False) -> dict:
    """The holes pattern's arithmetic: ``count`` blocks carved from one cached segment, every other one freed,
    then one ``request_mib`` tensor asked for -- no two holes merge. Refused unless the largest hole < the
    request < all holes together. ``unmappable_mib``: the holes' whole 20 MiB pages, which an expandable
    segment can unmap and map again at its end (fixed segments give back nothing: the segment holds live blocks)."""
    _int("block_mib", block_mib, 2, 4096)
    _int("count", count, 4, 256)
    if count % 2:
        raise ConfigError("count", count, "an even number: every other block is freed, the last one stays live")
    _int("request_mib", request_mib, 2, 10**6)
    arena = block_mib * count
    mapped = _pages(arena, expandable)
    holes = [(i * block_mib, (i + 1) * block_mib) for i in range(0, count, 2)]
    holes += [(arena, mapped)] if mapped > arena else []  # the segment's tail past the last (live) block
    sizes = [b - a for a, b in holes]
    largest, total = max(sizes), sum(sizes)
    if not largest < request_mib < total:
        raise ConfigError("request_mib", request_mib, f"more than the largest hole ({largest} MiB) and less than all "
                                                      f"{len(sizes)} holes together ({total} MiB)")
    page = PAGE_MIB[True]
    unmappable = sum(max(0, b // page - -(-a // page)) * page for a, b in holes)  # whole pages inside each hole
    return {"block_mib": block_mib, "count": count, "request_mib": request_mib, "arena_mib": arena,
            "reserved_mib": mapped, "live_mib": arena // 2, "holes_mib": sizes, "largest_hole_mib": largest,
            "sum_holes_mib": total, "freed_mib": block_mib * (count // 2), "unmappable_mib": unmappable if expandable else 0,
            "cap_mib": mapped + request_mib // 2, "expandable": expandable}


def _grow(live: int, sizes: list, expandable: bool, cap: float = math.inf) -> dict:
    """The growth pattern under the allocator's rules, in MiB: what stays reserved, the retries, whether it
    fits. A request that would take reserved past ``cap`` first releases what can be released -- fixed
    segments: every cached (whole, free) segment; an expandable segment: its free whole pages -- and retries.
    The cap check counts the whole request, even where an expandable segment maps only the difference."""
    reserved, cached, retries, worst = _pages(live, expandable), 0, 0, 0
    for s in sizes:
        worst = max(worst, reserved + s)
        if reserved + s > cap:
            reserved, cached, retries = (_pages(live, True) if expandable else reserved - cached), 0, retries + 1
            if reserved + s > cap:
                return {"reserved_mib": reserved, "retries": retries, "ok": False, "worst_mib": worst}
        if expandable:
            reserved = max(reserved, _pages(live + s, True))  # the segment maps the difference at its end
        else:
            reserved, cached = reserved + s, cached + s  # a new segment; freed at the step's end, it stays cached
    return {"reserved_mib": reserved, "retries": retries, "ok": True, "worst_mib": worst}


def growth_pattern(live_mib: int = 64, first_mib: int = 256, step_mib: int = 32, steps: int = 8,
                   expandable: bool = False) -> dict:
    """The growth pattern's arithmetic: ``live_mib`` stays, then each of ``steps`` steps allocates a tensor
    ``step_mib`` larger than the last and frees it. Fixed segments: a cached segment never fits the next
    request, so reserved grows to live + the sum of all sizes; an expandable segment maps the difference at
    its end: live + the largest, in 20 MiB pages. ``cap_mib`` (the capped arm): the expandable worst step plus
    one page; ``fixed_retries``: how often fixed segments then hit the cap, release and retry."""
    _int("live_mib", live_mib, 2, 10**5)
    _int("first_mib", first_mib, 10, 10**5)  # >= 10 MiB: rounded to 2 MiB, so the arithmetic here is exact
    _int("step_mib", step_mib, 2, 10**5)     # >= 2 MiB: a step's request never fits the last step's segment
    _int("steps", steps, 2, 64)
    sizes = [_pages(first_mib + i * step_mib, False) for i in range(steps)]
    fixed, grown = _grow(live_mib, sizes, False), _grow(live_mib, sizes, True)
    cap = grown["worst_mib"] + PAGE_MIB[True]
    return {"live_mib": live_mib, "sizes_mib": sizes, "steps": steps, "largest_mib": sizes[-1],
            "sum_mib": sum(sizes), "reserved_mib": (grown if expandable else fixed)["reserved_mib"],
            "fixed_reserved_mib": fixed["reserved_mib"], "expandable_reserved_mib": grown["reserved_mib"],
            "cap_mib": cap, "fixed_retries": _grow(live_mib, sizes, False, cap)["retries"],
            "expandable_retries": _grow(live_mib, sizes, True, cap)["retries"], "expandable": expandable}


def fragmentation_patterns(expandable: bool = False) -> dict:
    """Both patterns of the allocator demo, with the sizes it uses (pure arithmetic: any device)."""
    if not isinstance(expandable, bool):
        raise ConfigError("expandable", expandable, "True or False")
    return {"holes": hole_pattern(expandable=expandable), "growth": growth_pattern(expandable=expandable)}


def record_cuda_history(config: Config, path, steps: int = 2, max_entries: int = 200_000) -> str:
    """Run ``steps`` updates of ``config`` with the CUDA allocator recording every allocation and free,
    and write the snapshot to ``path`` (PyTorch's own snapshot format, a pickle that labkit writes and never reads:
    drag it onto https://pytorch.org/memory_viz). Written atomically: a failed write leaves no half file."""
    _config(config)
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError("path", path, "a file path (str or pathlib.Path) for the snapshot")
    _int("steps", steps, 1, 1000)
    _int("max_entries", max_entries, 1, 10**8)
    if capabilities(config.device).kind != "cuda":
        raise RuntimeError("the allocator's history is a CUDA feature (torch.cuda.memory._record_memory_history)")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    check_writable(path)  # a folder, a device or a read-only place is refused now, not after the run
    rec = torch.cuda.memory._record_memory_history
    rec(max_entries=max_entries)
    try:
        run(config.replace(steps=steps, warmup=min(config.warmup, steps - 1)))
        with tempfile.TemporaryDirectory() as tmp:  # private (0o700): PyTorch writes its file here
            own = Path(tmp) / "snapshot.pickle"
            torch.cuda.memory._dump_snapshot(str(own))
            blob = own.read_bytes()  # bytes only: nothing here unpickles it
    finally:
        rec(enabled=None)  # stop recording: it costs time on every allocation
    return str(write_atomic(path, blob))


# ---- the fragmentation demo -----------------------------------------------------------------------------

# What each arm of the demo is expected to show -- from the allocator's rules, not measured (chapter 08's
# markdown words each one): the test that the demo's own numbers confirm it. (pattern, expandable, capped) -> test.
EXPECTED = {
    ("holes", False, False): lambda m, p: m["ok"] and m["reserved_unallocated"] >= 0.98 * p["freed_mib"] * MIB,
    ("holes", True, False): lambda m, p: m["ok"] and m["reserved_unallocated"] >= 0.98 * p["freed_mib"] * MIB,
    ("holes", False, True): lambda m, p: not m["ok"] and m["ooms"] >= 1,
    ("holes", True, True): lambda m, p: m["ok"] and m["alloc_retries"] >= 1 and m["ooms"] == 0,
    ("growth", False, False): lambda m, p: (m["ok"] and m["reserved"] >= 0.98 * p["fixed_reserved_mib"] * MIB
                                            and m["segments"] >= p["steps"]),
    ("growth", True, False): lambda m, p: m["ok"] and m["reserved"] <= (p["expandable_reserved_mib"]
                                                                        + PAGE_MIB[True]) * MIB,
    ("growth", False, True): lambda m, p: m["ok"] and m["alloc_retries"] >= 1 and m["ooms"] == 0,
    ("growth", True, True): lambda m, p: m["ok"] and m["alloc_retries"] == 0,
}


def _cap(dev, mib: float) -> None:
    """Let this process's allocator reserve at most ``mib`` MiB (the fraction is global to the process)."""
    total = torch.cuda.get_device_properties(dev).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, mib * MIB / total), dev)


def _holes(dev, p: dict, capped: bool, keep: list) -> None:
    """The holes pattern (hole_pattern): one segment, every other block freed, then the request."""
    arena = torch.empty(p["arena_mib"] * MIB, dtype=torch.uint8, device=dev)
    del arena  # cached as one free segment: the blocks below are carved out of it
    keep += [torch.empty(p["block_mib"] * MIB, dtype=torch.uint8, device=dev) for _ in range(p["count"])]
    for i in range(0, p["count"], 2):
        keep[i] = None  # every other block freed: holes between live blocks, inside one segment
    if capped:  # room for half the request beyond what is reserved now: only the holes can make up the rest
        _cap(dev, torch.cuda.memory_reserved(dev) / MIB + p["request_mib"] / 2)
    keep.append(torch.empty(p["request_mib"] * MIB, dtype=torch.uint8, device=dev))


def _growth(dev, p: dict, capped: bool, keep: list) -> None:
    """The growth pattern (growth_pattern): a live tensor, then one larger temporary tensor per step."""
    if capped:
        _cap(dev, torch.cuda.memory_reserved(dev) / MIB + p["cap_mib"])
    keep.append(torch.empty(p["live_mib"] * MIB, dtype=torch.uint8, device=dev))
    for s in p["sizes_mib"]:
        step = torch.empty(s * MIB, dtype=torch.uint8, device=dev)
        del step  # freed at the step's end, as activations are


def _arm(build, dev, pattern: dict, capped: bool) -> dict:
    """One arm of the demo: allocator numbers after ``build`` ran (counters as differences over the arm).
    The cap and every tensor are gone afterwards, whatever happened."""
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    before, keep, error = allocator_stats(dev), [], None
    try:
        try:
            build(dev, pattern, capped, keep)
        except torch.cuda.OutOfMemoryError as e:
            error = " ".join(str(e).split())[:600]
        after = allocator_stats(dev)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, dev)  # global to the process: never leave a cap behind
        keep.clear()
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
    counters = ("alloc_retries", "ooms", "device_allocs", "device_frees")
    return {**{k: after[k] for k in ("allocated", "reserved", "reserved_unallocated", "segments", "inactive_split")},
            **{k: after[k] - before[k] for k in counters}, "ok": error is None, "error": error}


def _fragment() -> dict:
    """Both patterns, without and with a cap, in this process (CUDA; the allocator's settings as started)."""
    dev = torch.device("cuda", 0)
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    expandable = "expandable_segments:true" in conf.replace(" ", "").lower()
    pats = fragmentation_patterns(expandable)
    arms = {f"{name} {'capped' if capped else 'uncapped'}": _arm(build, dev, pats[name], capped)
            for name, build in (("holes", _holes), ("growth", _growth)) for capped in (False, True)}
    return {"settings": conf, "patterns": pats, "arms": arms, "gpu": torch.cuda.get_device_name(dev),
            "torch": torch.__version__}


# the demo's own process: both patterns in a fresh CUDA context, their numbers printed as one JSON line
_CHILD = "import json; from labkit.chapters.ch08_memory.allocator import _fragment; print(json.dumps(_fragment()))"


def fragmentation_demo(expandable: bool, timeout_s: float = 120.0) -> dict:
    """Run both fragmentation patterns (fragmentation_patterns), each without and with a memory cap, in a
    fresh Python process with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` or ``False``: the allocator
    reads it when CUDA starts, so a process of its own is the documented way to switch it, and the cap
    (``set_per_process_memory_fraction``) dies with that process. The process is killed if it outlives
    ``timeout_s``, or if this call is interrupted."""
    if not isinstance(expandable, bool):
        raise ConfigError("expandable", expandable, "True or False")
    _num("timeout_s", timeout_s, 1.0, 3600.0)
    if not torch.cuda.is_available():
        raise RuntimeError("the caching allocator's segments exist on CUDA only: this demo needs a CUDA GPU, and "
                           "this machine has none")
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=f"expandable_segments:{'True' if expandable else 'False'}")
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    try:  # run() kills the child on a timeout and on any exception here (Ctrl-C included) before re-raising
        out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env,
                             timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the allocator demo did not finish within timeout_s={timeout_s:g} s; its process was "
                           "stopped") from None
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"the allocator demo failed (exit {out.returncode}): {out.stderr.strip()[-400:]}")
    return {"expandable_segments": expandable, **json.loads(lines[-1])}


def fragmentation_demos(timeout_s: float = 120.0) -> dict:
    """``fragmentation_demo`` with fixed, then with expandable segments: {False: ..., True: ...}, with a
    progress line (each is a process of its own that starts CUDA)."""
    from ...base.frontend import Progress  # deferred: a notebook-only display

    _num("timeout_s", timeout_s, 1.0, 3600.0)
    out = {}
    with Progress(total=2, label="allocator demo, one process per setting") as bar:
        for i, flag in enumerate((False, True)):
            out[flag] = fragmentation_demo(flag, timeout_s)
            bar.update(i + 1, note=f"expandable_segments={flag} done")
    return out


def _demos(demos) -> dict:
    """{expandable: fragmentation_demo result} -- what fragmentation_table and _verdicts read."""
    if not isinstance(demos, dict) or not demos or not all(
            isinstance(k, bool) and isinstance(v, dict) and "arms" in v for k, v in demos.items()):
        raise ConfigError("demos", type(demos).__name__, "{False: fragmentation_demo(False), True: "
                                                         "fragmentation_demo(True)}")
    return demos


def fragmentation_verdicts(demos: dict) -> list:
    """One row per arm: the pattern, the setting, the cap and whether the measurement shows what the
    allocator's rules predict for it (``EXPECTED``; the chapter words each prediction)."""
    rows = []
    for flag, d in sorted(_demos(demos).items()):
        for arm, m in d["arms"].items():
            name, capped = arm.split()[0], arm.endswith(" capped")
            test = EXPECTED[(name, flag, capped)]
            rows.append({"pattern": name, "expandable": flag, "capped": capped,
                         "confirmed": bool(test(m, d["patterns"][name])), **m})
    return rows


def fragmentation_table(demos: dict) -> list:
    """The demo as a table, one row per arm: its measured allocator numbers and whether they show what the
    allocator's rules predict (``EXPECTED``; the chapter's markdown says what each arm should show)."""
    mib = lambda b: f"{b / MIB:,.0f} MiB"  # noqa: E731
    return table(fragmentation_verdicts(demos), [
        ("pattern", "pattern", "{}"), ("expandable", "segments", lambda e: "expandable" if e else "fixed"),
        ("capped", "cap", lambda c: "yes" if c else "no"),
        ("ok", "the request", lambda ok: "served" if ok else "out of memory"), ("reserved", "reserved", mib),
        ("reserved_unallocated", "reserved, not allocated", mib), ("segments", "cudaMalloc segments", "{}"),
        ("alloc_retries", "retries", "{}"), ("confirmed", "as predicted?", lambda c: "yes" if c else "NO")])


# ---- bytes per parameter of three recipes ---------------------------------------------------------------

# the recipes measured, in order: what each keeps per parameter is chapter 08's markdown (the measurement counts
# the real tensors): autocast 4 + 4 + 8; 16-bit weights + fp32 master 2 + 2 + 4 + 8; with an fp32 accumulator + 4
RECIPES = ("autocast", "16-bit weights + fp32 master", "16-bit weights + fp32 master + fp32 grad accumulation")


def _half_dtype(kind: str):
    """bf16 where the hardware runs it (compute capability 8.0+ on CUDA; any CPU), else fp16."""
    if kind == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        return torch.float16
    return torch.bfloat16


def _one_update_autocast(config, dev, x, y, half):
    """labkit's engine: fp32 weights, autocast makes 16-bit copies for the matmuls, AdamW steps the fp32 weights.
    Returns (bytes by role, every tensor the recipe keeps until its next update)."""
    torch.manual_seed(config.seed)
    model = GPT(config.spec).to(dev)
    opt = make_optimizer(config, model.parameters())
    with autocast(dev.type, "bf16" if half == torch.bfloat16 else "fp16"):
        loss = model(x, y)
    loss.backward()
    opt.step()
    return {"weights": state_bytes(model.parameters()), "grads": state_bytes(p.grad for p in model.parameters()),
            "master": 0, "accumulator": 0, "optimizer": sum(state_bytes(s.values()) for s in opt.state.values())}, \
        {"model": model, "opt": opt}


def _one_update_master(config, dev, x, y, half, accumulate_fp32: bool, micro: int = 2):
    """16-bit weights; the optimizer steps fp32 master copies. With ``accumulate_fp32`` each micro-batch's
    16-bit .grad is added into an fp32 buffer and stays allocated beside it (the Ultra-Scale Playbook's
    accounting; Megatron's distributed optimizer keeps no 16-bit .grad: 18 bytes per parameter).
    Returns (bytes by role, every tensor the recipe keeps until its next update)."""
    torch.manual_seed(config.seed)
    model = GPT(config.spec).to(dev).to(half)
    params = list(model.parameters())
    master = [p.detach().float().clone().requires_grad_() for p in params]
    opt = torch.optim.AdamW(master, lr=config.lr, weight_decay=0.01)
    acc = [torch.zeros_like(m) for m in master] if accumulate_fp32 else None
    for _ in range(micro):
        (model(x, y) / micro).backward()
        if acc is not None:
            for a, p in zip(acc, params):
                a.add_(p.grad.float())  # fp32 sums: small 16-bit gradients are not lost in the addition
                p.grad.zero_()          # the 16-bit buffer stays allocated for the next micro-batch
    for m, p, a in zip(master, params, acc or [None] * len(params)):
        m.grad = a if a is not None else p.grad.float()
    opt.step()
    with torch.no_grad():
        for m, p in zip(master, params):
            p.copy_(m)  # the updated master weights, rounded to 16 bits for the next forward
            m.grad = None  # the fp32 gradient copy is transient (ZeRO's accounting); the accumulator lives on in acc
    held = {"weights": state_bytes(params), "grads": state_bytes(p.grad for p in params),
            "master": state_bytes(master), "accumulator": state_bytes(acc or []),
            "optimizer": sum(state_bytes(s.values()) for s in opt.state.values())}
    return held, {"model": model, "master": master, "opt": opt, "acc": acc}


def _traced(recipe, config, dev, x, y, *args) -> tuple:
    """Run one recipe's update under labkit's tracer: (bytes by role, the kept tensors, the bytes of every
    storage the update made that is still alive while they are kept -- what the process really holds, so a
    tensor the roles forget, such as a gradient copy never freed, shows up as a difference)."""
    tracer = Tracer(torch.nn.Module(), exclude=(x, y))  # the recipe makes every other tensor itself
    with tracer:
        held, kept = recipe(config, dev, x, y, *args)
        alive = sum(tracer.alive_bytes())
    return held, kept, alive


def bytes_per_param(config: Config, n_threads: int | None = 1) -> list:
    """Each recipe of RECIPES trained for one update on ``config``'s model: the bytes of the tensors it
    keeps between updates, by role, counted; and per parameter. ``traced_bytes``: every byte the update's
    own tensors still hold afterwards (labkit's tracer) -- equal to ``total`` when nothing is left uncounted.
    ``step_counter_bytes``: the part of the optimizer's bytes that is AdamW's step counters."""
    _config(config)
    _threads(n_threads)
    kind = capabilities(config.device).kind
    dev = torch_device(kind)
    half = _half_dtype(kind)
    rows = []
    with intra_op_threads(n_threads):
        x, y = (t.to(dev) for t in next(iter(make_loader(config)[0])))
        for name in RECIPES:
            if name == "autocast":
                held, kept, alive = _traced(_one_update_autocast, config, dev, x, y, half)
            else:
                held, kept, alive = _traced(_one_update_master, config, dev, x, y, half, "accumulation" in name)
            model = kept["model"]
            n = sum(p.numel() for p in model.parameters())
            total = sum(held.values())
            # AdamW's step counters (one small tensor per parameter tensor), part of its state
            counters = state_bytes(s["step"] for s in kept["opt"].state.values() if "step" in s)
            rows.append({"recipe": name, **held, "total": total, "traced_bytes": alive, "n_params": n,
                         "bytes_per_param": total / n, "half": str(half).replace("torch.", ""),
                         "step_counter_bytes": counters,
                         "param_tensors": len(list(model.parameters()))})
            del model, kept
    return rows


def run_memory(config: Config) -> dict:
    """What one engine run of ``config`` held: weights, gradients and optimizer state (the run's summary), and
    the activations kept for backward counted over the whole micro-batch (under attention="math" a sequence
    also keeps scaled q and k; ``engine_activation_bytes`` keeps the summary's per-sequence figure)."""
    _config(config)
    s = run(config.replace(steps=1, warmup=0)).summary
    parts = {k: s[k] or 0 for k in ("param_bytes", "grad_bytes", "optimizer_bytes")}
    with intra_op_threads(config.threads):
        acts, _ = activation_bytes(config, torch_device(capabilities(config.device).kind), batch=config.micro_batch)
    parts["activation_bytes"] = acts
    return {**parts, "total": sum(parts.values()), "n_params": s["n_params"],
            "engine_activation_bytes": s["activation_bytes"]}


# ---- what the chapter's cells draw from these counts (rows and figures; the words are the chapter's) -------

def bpp_table(rows: list) -> list:
    """Bytes per parameter of each recipe, role by role, and any bytes the tracer found alive that no role
    counts (``untracked``: 0.00 when every byte is accounted for)."""
    keys = ("weights", "grads", "master", "accumulator", "optimizer")
    per = [{"recipe": r["recipe"], **{k: r[k] / r["n_params"] for k in keys}, "total": r["bytes_per_param"],
            "untracked": (r["traced_bytes"] - r["total"]) / r["n_params"]} for r in rows]
    return table(per, [("recipe", "recipe", "{}"), ("weights", "weights", "{:.2f}"), ("grads", "gradients", "{:.2f}"),
                       ("master", "master", "{:.2f}"), ("accumulator", "accumulator", "{:.2f}"),
                       ("optimizer", "AdamW", "{:.2f}"), ("total", "bytes per parameter", "{:.2f}"),
                       ("untracked", "alive, in no role", "{:.2f}")])


def budget_beside_run(calculator, config: Config) -> dict:
    """The learner's calculator for ``config`` beside what one run of it held (one thread), in bytes:
    {"graded": False, "predicted", "run"}. While a grader runs the notebook nothing is called (the exercise is
    graded from the learner's saved measurements, and the grader's CPU measures nothing for it):
    {"graded": True}."""
    _config(config)
    if not callable(calculator):
        raise ConfigError("calculator", calculator, "your budget function, e.g. my_budget")
    if grading_tool() is not None:
        return {"graded": True, "predicted": None, "run": None}
    return {"graded": False, "predicted": calculator(config), "run": run_memory(config.replace(threads=1))["total"]}


ROLE_COLORS = {"weights": "#4c72b0", "master": "#64b5cd", "grads": "#dd8452", "accumulator": "#ccb974",
               "optimizer": "#55a868", "activations": "#c44e52"}
# the chapter's tables' words for the roles: a legend that says "grads" beside a table that says "gradients" reads
# as two different things
ROLE_WORDS = {"weights": "weights", "master": "master", "grads": "gradients", "accumulator": "accumulator",
              "optimizer": "AdamW state", "activations": "activations"}


def plot_bytes_per_param(rows, width: float = 7.5, height: float = 2.8):
    """One horizontal stacked bar per recipe: bytes per parameter by role."""
    rows = _rows(rows, "n_params")
    _size(width, height)
    from ...tools.plots import FONT as font, new_figure  # deferred: matplotlib is heavy; loaded only to draw

    fig = new_figure(width, height)
    ax = fig.add_subplot()
    roles = ("weights", "grads", "master", "accumulator", "optimizer")
    for i, r in enumerate(rows):
        left = 0.0
        for role in roles:
            v = r[role] / r["n_params"]
            if v:
                ax.barh(i, v, left=left, color=ROLE_COLORS[role])
                ax.text(left + v / 2, i, f"{v:.0f}", ha="center", va="center", fontsize=font, color="white")
            left += v
    # the long recipe names on two lines: at this width they would otherwise take half the chart
    ax.set_yticks(range(len(rows)), [r["recipe"].replace(" + fp32 grad", "\n+ fp32 grad") for r in rows],
                  fontsize=font)
    ax.set_xlabel("bytes per parameter kept between updates", fontsize=font)
    ax.tick_params(axis="x", labelsize=font)
    from matplotlib.patches import Patch  # deferred: matplotlib is optional; loaded only to draw

    # the legend in the bars' own left-to-right order (not in the order rows first use a role), roles shown only
    used = [role for role in roles if any(r[role] for r in rows)]
    fig.legend([Patch(color=ROLE_COLORS[role]) for role in used], [ROLE_WORDS[role] for role in used], fontsize=font,
               loc="outside lower center", ncols=len(used))
    ax.invert_yaxis()
    return fig
