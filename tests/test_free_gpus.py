"""The free GPUs as first-class devices (#28, part 4; #43 for 2026): Colab's T4, Kaggle's 2 x T4 and an L4,
plus a V100 and the Ampere/Hopper cards the course was written on -- each one's decisions
(labkit.engine.gpus.plan) from its catalogue entry, on a CPU; and the engine's device choice with torch.cuda
monkeypatched to look like one. The P100 stays only as a card a current build refuses in one line."""
import json
from pathlib import Path

import pytest
import torch

import labkit as lk
from labkit.base.runtime import ConfigError
from labkit.engine import device, gpus, precision
from labkit.engine.rules import refusals

CAT = gpus.catalogue()
# a current CUDA 12.8+ wheel: no Pascal (sm_60) code, no PTX below sm_70
NEW_BUILD = ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
OLD_BUILD = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]


# ---- the catalogue ------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["t4", "l4", "p100-pcie", "p100-sxm2", "v100-sxm2", "v100-pcie"])
def test_every_figure_added_names_a_source_that_exists(key):
    dev = CAT["devices"][key]
    for field in ("arch", "compute_capability", "tensor_cores", "memory_gb", "memory_bandwidth_gbps",
                  "interconnect_gbps", *(f"peak_tflops.{p}" for p in ("bf16", "fp16", "tf32", "fp32"))):
        entry = dev["peak_tflops"][field.split(".")[1]] if "." in field else dev[field]
        assert entry["source"] in CAT["sources"], (key, field)
    for sid in {dev["arch"]["source"], dev["compute_capability"]["source"], dev["memory_gb"]["source"]}:
        src = CAT["sources"][sid]
        assert src["title"] and src["url"].startswith("https://") and src["kind"] in ("datasheet", "vendor web page")


def test_every_device_has_arch_and_compute_capability():
    want = {"t4": "7.5", "l4": "8.9", "rtx4090": "8.9", "a100-40gb": "8.0", "a100-80gb": "8.0", "h100-sxm": "9.0",
            "h100-pcie": "9.0", "h200-sxm": "9.0", "h200-nvl": "9.0", "p100-pcie": "6.0", "p100-sxm2": "6.0",
            "v100-sxm2": "7.0", "v100-pcie": "7.0", "mi300x": None}
    assert set(want) == set(CAT["devices"])
    for key, cc in want.items():
        dev = CAT["devices"][key]
        assert gpus.value(dev["compute_capability"]) == cc, key
        assert gpus.value(dev["arch"]), key
        assert isinstance(gpus.value(dev["tensor_cores"]), bool), key


def test_the_l4_figures_are_its_datasheets_dense_ones():
    # NVIDIA's L4 datasheet quotes tensor rates with 2:4 sparsity (BF16/FP16 242*, TF32 120*): dense is half
    d = CAT["devices"]["l4"]
    assert {p: gpus.value(e) for p, e in d["peak_tflops"].items()} == {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0,
                                                                       "fp32": 30.3}
    assert all(e["source"] == "nvidia-l4" for e in d["peak_tflops"].values())
    assert CAT["sources"]["nvidia-l4"]["kind"] == "datasheet"
    assert gpus.value(d["memory_gb"]) == 24 and gpus.value(d["memory_bandwidth_gbps"]) == 300
    assert gpus.value(d["arch"]) == "Ada Lovelace" and d["hardware_units"] == {"fp32": True, "tf32": True,
                                                                               "fp16": True, "bf16": True}
    assert gpus.board_key("NVIDIA L4") == "l4"
    assert device.table_peak("NVIDIA L4", "bf16")[0] == 121.0e12


def test_the_p100_and_v100_figures_are_the_datasheets():
    d = CAT["devices"]
    assert {p: gpus.value(e) for p, e in d["p100-pcie"]["peak_tflops"].items()} == \
        {"bf16": None, "fp16": 18.7, "tf32": None, "fp32": 9.3}
    assert gpus.value(d["p100-pcie"]["memory_gb"]) == 16 and gpus.value(d["p100-pcie"]["memory_bandwidth_gbps"]) == 732
    assert gpus.value(d["p100-sxm2"]["peak_tflops"]["fp16"]) == 21.2
    assert gpus.value(d["v100-sxm2"]["peak_tflops"]["fp16"]) == 125.0
    assert gpus.value(d["v100-pcie"]["peak_tflops"]["fp32"]) == 14.0
    assert gpus.value(d["v100-sxm2"]["memory_bandwidth_gbps"]) == 900
    assert d["p100-pcie"]["tensor_cores"]["value"] is False and d["v100-sxm2"]["tensor_cores"]["value"] is True


@pytest.mark.parametrize("name, key", [
    ("Tesla T4", "t4"), ("Tesla P100-PCIE-16GB", "p100-pcie"), ("Tesla P100-PCIE-12GB", "p100-pcie"),
    ("Tesla P100-SXM2-16GB", "p100-sxm2"), ("Tesla V100-SXM2-16GB", "v100-sxm2"), ("Tesla V100-SXM2-32GB", "v100-sxm2"),
    ("Tesla V100-PCIE-16GB", "v100-pcie"), ("Tesla V100-PCIE-32GB", "v100-pcie"), ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA A10", None), ("Some Future GPU", None)])
def test_board_names_torch_reports_find_their_device(name, key):
    assert gpus.board_key(name) == key
    if key:
        assert device.table_peak(name, "fp16")[0] == gpus.value(CAT["devices"][key]["peak_tflops"]["fp16"]) * 1e12


# ---- the plans ----------------------------------------------------------------------------------------

def test_a_t4_runs_fp16_with_a_grad_scaler_and_no_flash():
    p = gpus.plan("t4", arch_list=NEW_BUILD, torch_version="2.13.0+cu128")
    assert (p.low_precision, p.loss_scaling, p.tf32) == ("fp16", True, False)
    assert p.compute_capability == "7.5" and p.arch == "Turing"
    assert "no bf16 units" in p.low_precision_why and "emulation" in p.low_precision_why
    assert "GradScaler" in p.low_precision_why and "sm 7.5" in p.low_precision_why
    assert p.sdpa_backends == ("math", "efficient")
    assert "flash" not in p.sdpa_backends and "cudnn" not in p.sdpa_backends
    assert "flash attention needs sm 8.0" in p.sdpa_why and "memory-efficient" in p.sdpa_why
    assert p.runnable and p.refusal is None and p.fp16_note is None  # fp16 tensor cores: the datasheet rate holds
    assert p.world_size == 1 and p.memory_gb == 16


def test_two_t4s_run_real_ddp_at_world_size_two():
    p = gpus.plan("t4", n_gpus=2)
    assert p.world_size == 2 and p.n_gpus == 2 and p.low_precision == "fp16"
    assert "world size 2" in p.summary()
    assert gpus.plan("t4", n_gpus=4).world_size == 2  # chapter 06 runs two processes, however many are visible
    assert gpus.world_size(1) == gpus.world_size(0) == 1


def test_a_p100_on_a_current_build_is_refused_in_one_line():
    p = gpus.plan("p100-pcie", arch_list=NEW_BUILD, torch_version="2.13.0+cu128")
    assert not p.runnable
    assert p.refusal.count("\n") == 0
    for words in ("2.13.0", "sm_70", "sm_120", "P100", "sm 6.0", "no kernel image is available", "T4 × 2", "CPU"):
        assert words in p.refusal, words
    assert "+cu128" not in p.refusal
    # the same card under a build that still ships Pascal code runs, and so does one with PTX at or below sm 6.0
    assert gpus.plan("p100-pcie", arch_list=OLD_BUILD).runnable
    assert gpus.plan("p100-pcie", arch_list=["compute_50", "sm_70"]).runnable
    assert not gpus.plan("p100-pcie", arch_list=["sm_61", "sm_70"]).runnable  # sm_61 code cannot run on 6.0


def test_a_p100_has_fp16_without_tensor_cores_and_says_what_that_means():
    p = gpus.plan("p100-pcie")
    assert (p.low_precision, p.loss_scaling, p.tf32) == ("fp16", True, False)
    assert "no tensor cores" in p.low_precision_why
    assert p.fp16_note and "fp16 accumulation" in p.fp16_note and "fp32" in p.fp16_note and "18.7" in p.fp16_note
    assert p.sdpa_backends == ("math", "efficient")  # the memory-efficient kernel runs from sm 5.0
    assert gpus.plan("p100-sxm2").fp16_note  # 21.2 against 10.6: the same story


def test_a_v100_has_fp16_tensor_cores_and_no_bf16():
    p = gpus.plan("v100-sxm2", arch_list=NEW_BUILD)
    assert (p.low_precision, p.loss_scaling, p.tf32) == ("fp16", True, False)
    assert p.runnable and p.fp16_note is None and p.arch == "Volta" and p.compute_capability == "7.0"
    assert p.sdpa_backends == ("math", "efficient")


@pytest.mark.parametrize("key, cc", [("a100-80gb", "8.0"), ("h100-sxm", "9.0"), ("l4", "8.9")])
def test_ampere_and_later_run_bf16_tf32_and_flash(key, cc):
    p = gpus.plan(key, arch_list=NEW_BUILD)
    assert (p.low_precision, p.loss_scaling, p.tf32) == ("bf16", False, True)
    assert p.compute_capability == cc and p.runnable and p.fp16_note is None
    assert p.sdpa_backends == ("math", "flash", "efficient", "cudnn")
    assert "not available" not in p.sdpa_why and "bf16 tensor cores" in p.low_precision_why
    assert gpus.ships_kernels((8, 9), ["sm_80", "sm_86", "sm_90"])  # sm_86 code serves an sm 8.9 L4


def test_kernel_compatibility_follows_cuda_rules():
    assert gpus.ships_kernels((7, 5), ["sm_70"])            # same major, later minor
    assert not gpus.ships_kernels((7, 0), ["sm_75"])        # a later minor's cubin does not run on an earlier one
    assert not gpus.ships_kernels((8, 0), ["sm_90a"])       # arch-specific code: exactly that arch only
    assert gpus.ships_kernels((9, 0), ["sm_90a"])
    assert gpus.ships_kernels((8, 6), ["compute_80"])       # PTX is compiled for later devices by the driver
    assert not gpus.ships_kernels((7, 5), ["compute_80"])
    assert gpus.ships_kernels((6, 0), [])                   # a build that does not say: not refused


def test_mi300x_has_no_compute_capability():
    p = gpus.plan("mi300x")
    assert p.compute_capability is None and p.low_precision == "bf16" and p.sdpa_backends == ("math",)
    assert p.runnable


def test_bad_input_to_plan_says_what_is_allowed():
    with pytest.raises(ConfigError, match="did you mean 't4'"):
        gpus.plan("t44")
    with pytest.raises(ConfigError) as e:
        gpus.plan("p100")
    assert e.value.field == "device_key" and "p100-pcie" in str(e.value)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="n_gpus"):
            gpus.plan("t4", n_gpus=bad)


def test_the_summary_says_it_all_in_a_few_lines():
    text = gpus.plan("p100-pcie", arch_list=NEW_BUILD).summary()
    assert 4 <= len(text.splitlines()) <= 8
    assert "fp16" in text and "GradScaler" in text and "no kernel image" in text and "fp16 accumulation" in text
    assert gpus.plan("t4")._repr_markdown_() == gpus.plan("t4").summary()


# ---- the engine, with torch.cuda made to look like a GPU -------------------------------------------------

class _Props:
    def __init__(self, gb):
        self.total_memory = int(gb * 2**30)


def _fake_cuda(monkeypatch, name, cc, arch_list, count=1, gib=15.1, native_bf16=None):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: cc)
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: list(arch_list))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: _Props(gib))
    native = cc >= (8, 0) if native_bf16 is None else native_bf16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: native or including_emulation)
    device.capabilities.cache_clear()


@pytest.fixture(autouse=True)
def _fresh_capabilities():
    device.capabilities.cache_clear()
    yield
    device.capabilities.cache_clear()


def test_a_t4s_capabilities_come_from_the_catalogue(monkeypatch):
    _fake_cuda(monkeypatch, "Tesla T4", (7, 5), NEW_BUILD, count=2)
    caps = device.capabilities("auto")
    assert (caps.kind, caps.bf16, caps.tf32, caps.fp16, caps.n_devices) == ("cuda", False, False, True, 2)
    assert caps.reason == "a CUDA GPU is available"
    refused = precision.resolve(lk.Config(precision="bf16"), caps).refusal
    assert refused is not None and "no bf16 units" in str(refused) and "compute capability 7.5" in str(refused)
    assert precision.resolve(lk.Config(precision="fp16"), caps).scaler
    assert not refusals(lk.Config(precision="fp16", world_size=2), caps)
    p = gpus.current_plan()
    assert p.device == "t4" and p.name == "Tesla T4" and p.world_size == 2 and p.memory_gb == pytest.approx(16.0)


def test_an_unknown_board_falls_back_to_compute_capability(monkeypatch):
    _fake_cuda(monkeypatch, "NVIDIA RTX A6000", (8, 6), NEW_BUILD)
    caps = device.capabilities("auto")
    assert caps.bf16 and caps.tf32 and gpus.current_plan() is None
    _fake_cuda(monkeypatch, "Quadro RTX 8000", (7, 5), NEW_BUILD)
    caps = device.capabilities("auto")
    assert not caps.bf16 and not caps.tf32  # emulated bf16 is not counted as a unit
    _fake_cuda(monkeypatch, "Odd Ampere", (8, 0), NEW_BUILD, native_bf16=False)
    assert not device.capabilities("auto").bf16  # torch's no-emulation answer has the last word


def test_a_p100_on_a_current_build_runs_on_the_cpu_and_says_why(monkeypatch):
    _fake_cuda(monkeypatch, "Tesla P100-PCIE-16GB", (6, 0), NEW_BUILD)
    kind, reason = device.resolve_kind("auto")
    assert kind == "cpu" and reason.count("\n") == 0
    assert "no kernel image is available" in reason and "Tesla P100-PCIE-16GB" in reason
    assert device.capabilities("auto").kind == "cpu" and device.capabilities("auto").reason == reason
    with pytest.raises(ConfigError) as e:
        device.resolve_kind("cuda")
    assert e.value.field == "device" and e.value.value == "cuda" and "no kernel image" in str(e.value)
    p = gpus.current_plan()
    assert not p.runnable and p.refusal == reason and p.memory_gb == 16


def test_a_p100_under_an_older_build_is_a_gpu(monkeypatch):
    _fake_cuda(monkeypatch, "Tesla P100-PCIE-12GB", (6, 0), OLD_BUILD, gib=11.9)
    caps = device.capabilities("auto")
    assert caps.kind == "cuda" and not caps.bf16 and not caps.tf32
    p = gpus.current_plan()
    assert p.runnable and p.memory_gb < 13  # the 12 GB board: what torch reports, not the 16 GB entry


def test_an_h100_keeps_bf16_and_tf32(monkeypatch):
    _fake_cuda(monkeypatch, "NVIDIA H100 80GB HBM3", (9, 0), NEW_BUILD, gib=79.2)
    caps = device.capabilities("auto")
    assert caps.kind == "cuda" and caps.bf16 and caps.tf32
    assert precision.resolve(lk.Config(precision="bf16"), caps).refusal is None


# ---- the chapters, on a fake T4 / two T4s / an H100 ----------------------------------------------------

def test_chapter_sizes_give_a_t4_fp16_and_a_budget_it_has(monkeypatch):
    from labkit.chapters import course
    _fake_cuda(monkeypatch, "Tesla T4", (7, 5), NEW_BUILD, gib=15.1)
    got = course.sizes(cpu=dict(precision="fp32"), gpu=dict(model="base", precision="bf16", dtype=torch.bfloat16,
                                                             budget_bytes=16 * 2**30))
    assert got["precision"] == "fp16" and got["dtype"] is torch.float16  # chapter 05's bf16 would be refused
    assert got["budget_bytes"] == int(0.92 * 16e9) < 16 * 2**30
    assert course.gpu_low_precision() == "fp16"
    _fake_cuda(monkeypatch, "NVIDIA H100 80GB HBM3", (9, 0), NEW_BUILD, gib=79.2)
    got = course.sizes(cpu=dict(), gpu=dict(precision="bf16", budget_bytes=16 * 2**30))
    assert got == dict(precision="bf16", budget_bytes=16 * 2**30) and course.gpu_low_precision() == "bf16"


def test_chapter_02_says_why_fp16_on_a_t4_and_nothing_on_a_cpu(monkeypatch, capsys):
    from labkit.chapters import course
    course.on_this_device()
    assert capsys.readouterr().out == ""  # the CPU: nothing changes
    _fake_cuda(monkeypatch, "Tesla P100-PCIE-16GB", (6, 0), OLD_BUILD)
    course.on_this_device()
    out = capsys.readouterr().out
    assert "On this device" in out and "GradScaler" in out and "fp16 accumulation" in out


def test_chapter_06_runs_nccl_at_world_size_two_on_two_t4s(monkeypatch):
    # the chapter's first cell decides with the GPU plan's world size: two GPUs run NCCL, fewer CPU processes
    from labkit.engine import gpus
    assert gpus.world_size(2) == 2 and gpus.world_size(1) != 2 and gpus.world_size(0) != 2
    nb = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "06_ddp_allreduce.ipynb").read_text())
    first = next("".join(c["source"]) for c in nb["cells"] if c["id"] == "c01")
    assert "multi_gpu = lk.engine.gpus.world_size(n_gpus) == 2" in first and "NCCL" in first and "gloo" in first


def test_chapter_07_skips_flash_on_a_t4_with_the_sentence(monkeypatch):
    from labkit.chapters import ch07_kernels as kernels
    _fake_cuda(monkeypatch, "Tesla T4", (7, 5), NEW_BUILD)
    assert kernels.sdpa_backends("cuda") == ["math", "efficient"]
    rows = [{"seq_len": 1024, "backend": b, "kept_bytes": 2**20, "peak_bytes": 2**21, "scores_bytes": 2**22}
            for b in ("math", "efficient")]
    assert kernels.fused_backend(rows) == "efficient"
    backends, why = kernels.gpu_sdpa()  # what chapter 07's attention cell says where flash is missing
    assert "flash" not in backends and "flash attention needs sm 8.0" in why and "T4" in why
    _fake_cuda(monkeypatch, "NVIDIA A100-SXM4-80GB", (8, 0), NEW_BUILD)
    assert kernels.sdpa_backends("cuda") == ["math", "flash", "efficient", "cudnn"]
    assert "flash" in kernels.gpu_sdpa()[0]
    _fake_cuda(monkeypatch, "Unknown Turing board", (7, 5), NEW_BUILD)  # not in the catalogue: compute capability
    assert kernels.sdpa_backends("cuda") == ["math", "efficient"]


# ---- every chapter's GPU run fits a T4 -------------------------------------------------------------------

# what the chapters' GPU size dicts may name, as a T4 has it (chapter 00 picks gpu_precision from env first)
T4_NAMES = {"env": {"bf16": False}, "torch": torch, "gpu_precision": "fp16"}


def _gpu_runs():
    """(chapter, cell, the Config fields) of every ``lk.course.sizes(gpu=...)`` dict that describes a run, with
    a T4's precision (fp16 where the dict asks for bf16 or leaves it to ``env``), at its largest micro-batch."""
    import ast
    import json
    from pathlib import Path

    for nb in sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("0*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            src = "".join(cell["source"]) if cell["cell_type"] == "code" else ""
            if "course.sizes(" not in src:
                continue
            for node in ast.walk(ast.parse(src)):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "sizes":
                    gpu = next((k.value for k in node.keywords if k.arg == "gpu"), None)
                    if isinstance(gpu, ast.Call):
                        yield nb.name[:2], i, eval(ast.unparse(gpu), T4_NAMES)


def _as_runs(gpu: dict) -> list:
    knobs = {**gpu.get("knobs", {}), **{k: v for k, v in gpu.items() if k in lk.Config.__dataclass_fields__}}
    if "model" not in knobs:
        return []
    knobs["precision"] = "fp16" if knobs.get("precision", "fp16") in ("bf16", "fp16") else knobs["precision"]
    mbs = list(gpu.get("micro_batches", ())) + list(gpu.get("mbs", ())) or [knobs.get("micro_batch", 8)]
    runs = [({**knobs, "micro_batch": max(mbs)}, False)]
    if "T" in gpu:  # chapter 08's sequence sweep: one forward of two sequences, fp32, both attention backends
        runs = [(dict(model=gpu["model"], micro_batch=2, precision="fp32", seq_len=max(gpu["T"]), attention=a), True)
                for a in ("auto", "math")]
    return runs


def _needed_bytes(knobs: dict, forward_only: bool) -> int:
    from labkit.engine import measure

    est = measure.host_memory_estimate(lk.Config(**knobs))
    # a forward-only probe (memlab.seq_sweep) holds the fp32 weights and the activations, no gradients or AdamW
    return 4 * est["n_params"] + est["activation_bytes"] if forward_only else est["total_bytes"]


def test_every_chapters_gpu_run_fits_a_t4():
    # The T4's catalogue memory is 16 GB; the what-if model counts 0.92 of a card as usable (CUDA's context,
    # allocator fragmentation, workspaces): 14.7 GB, about the 15.1 GiB a T4 reports less its context. The
    # engine's estimate (measure.host_memory_estimate) is a floor: it leaves out the logits and backward's
    # temporaries; the what-if model's traced memory of the largest run here (base, micro-batch 32, fp16) was
    # 12.97 GB against the floor's 11.57, 1.12x -- so the floor times 1.15 must fit.
    usable = 0.92 * gpus.value(CAT["devices"]["t4"]["memory_gb"]) * 1e9
    from labkit.engine import measure

    seen = []
    for chapter, cell, gpu in _gpu_runs():
        for knobs, forward_only in _as_runs(gpu):
            need = _needed_bytes(knobs, forward_only)
            seen.append(chapter)
            assert 1.15 * need <= usable, (chapter, cell, knobs, need / 1e9)
    assert {"00", "01", "02", "03", "04", "05", "07", "08", "09"} <= set(seen)
    # chapter 09's naive baseline (fp32, the whole effective batch of 32 in one micro-batch, no checkpointing)
    # does not fit on purpose: the notebook catches lk.OutOfMemory and adds full checkpointing, which fits
    naive = lk.Config(model="base", seq_len=1024, micro_batch=32, precision="fp32")
    assert measure.host_memory_estimate(naive)["total_bytes"] > usable
    assert 1.15 * measure.host_memory_estimate(naive.replace(checkpointing="full"))["total_bytes"] <= usable


# ---- 2026: the P100 is not offered as a free GPU anywhere a learner reads ------------------------------------

def test_the_p100_is_not_offered_as_a_free_gpu():
    from pathlib import Path

    from labkit.instructor import hosting

    root = Path(__file__).resolve().parent.parent
    chapters = sorted((root / "notebooks").glob("*.ipynb"))
    for path in [root / "README.md", *chapters, root / "notebooks" / "cheatsheet.md"]:
        assert "P100" not in path.read_text(encoding="utf-8"), path.name
    assert "P100" not in hosting.setup_cell_source() and "P100" not in hosting.from_a_wheel()
    # the kit names it once, to say why it is refused -- never as a choice
    kit = [ln for ln in (root / "notebooks" / "README.md").read_text(encoding="utf-8").splitlines() if "P100" in ln]
    assert kit and all("P100 is not among them" in ln for ln in kit), kit
    offered = gpus.__doc__.split("The P100")[0]
    assert "P100" not in offered and "T4" in offered and "L4" in offered
    assert "P100" not in gpus.KAGGLE_HINT and "T4 × 2" in gpus.KAGGLE_HINT


def test_the_free_gpus_plans_in_2026():
    t4, l4 = gpus.plan("t4", n_gpus=2, arch_list=NEW_BUILD), gpus.plan("l4", arch_list=NEW_BUILD)
    assert t4.runnable and t4.world_size == 2 and t4.low_precision == "fp16" and t4.loss_scaling
    assert l4.runnable and (l4.low_precision, l4.tf32, l4.loss_scaling) == ("bf16", True, False) and l4.memory_gb == 24
    refused = gpus.plan("p100-pcie", arch_list=NEW_BUILD, torch_version="2.14.1+cu130")
    assert not refused.runnable and refused.refusal.count("\n") == 0 and "sm 6.0" in refused.refusal
