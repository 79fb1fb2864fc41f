"""The torch the course claims, and its guards for newer torch APIs (labkit/base/compat.py): the message an
older torch gets, each guarded use site giving it when the API is missing, and the stated floor being the one
requirements.txt and pyproject.toml ask for."""
from __future__ import annotations

import json
import re
import types
from pathlib import Path

import pytest
import torch
import torch.distributed.fsdp
import torch.nn.attention
import torch.utils.checkpoint

import labkit as lk
from labkit.base import compat
from labkit.base.runtime import TorchTooOld
from labkit.chapters import ch09_playbook as pb
from labkit.check import precision as check_precision
from labkit.engine import checkpointing, config, measure, rules
from labkit.engine.device import capabilities
from labkit.engine.model import GPT

ROOT = Path(__file__).resolve().parent.parent


def _pretend(monkeypatch, version: str):
    """Make compat believe ``version`` is installed."""
    monkeypatch.setattr(compat, "TORCH", compat.parse(version))
    monkeypatch.setattr(compat, "INSTALLED", version)


def test_parse_versions():
    assert compat.parse("2.13.0+cpu") == (2, 13)
    assert compat.parse("2.9.1+cu128") == (2, 9)
    assert compat.parse("2.10.0a0+git1234abc") == (2, 10)
    assert compat.parse("2.6.0.dev20240101") == (2, 6)
    assert compat.TORCH == compat.parse(torch.__version__)
    with pytest.raises(ValueError):
        compat.parse("nightly")


def test_this_torch_has_every_feature():
    """The suite runs on a torch at or above the floor, and every guarded API is in it."""
    assert compat.TORCH >= compat.parse(compat.TORCH_FLOOR)
    for feature, (_, since, _) in compat.FEATURES.items():
        if feature in compat.ABOVE_FLOOR:  # a part that is skipped, saying why, below its own version
            assert compat.has(feature) == (compat.TORCH >= since), feature
            continue
        assert since <= compat.parse(compat.TORCH_FLOOR), feature  # the floor covers every feature
        assert compat.has(feature), feature
    assert compat.need("sdpa_kernel") is torch.nn.attention.sdpa_kernel  # the guard hands back the API


@pytest.mark.parametrize("feature", sorted(compat.FEATURES))
def test_message_on_an_old_torch(monkeypatch, feature):
    _pretend(monkeypatch, "2.2.1+cu121")
    assert not compat.has(feature)
    with pytest.raises(TorchTooOld) as e:
        compat.need(feature)
    msg = str(e.value)
    what, since, _ = compat.FEATURES[feature]
    assert "\n" not in msg and msg == compat.message(feature)
    assert what in msg  # which feature
    assert f"needs torch >= {since[0]}.{since[1]}" in msg  # the torch it needs
    assert "(2.2.1+cu121)" in msg  # the torch installed
    want = max(since, compat.parse(compat.TORCH_FLOOR))
    assert f"pip install -U 'torch>={want[0]}.{want[1]}'" in msg and "Colab" in msg  # what to do


def test_fp32_precision_on_torch_2_8(monkeypatch):
    _pretend(monkeypatch, "2.8.0")
    assert not compat.has("fp32_precision") and compat.has("fully_shard")
    assert "needs torch >= 2.9" in compat.message("fp32_precision")


def test_missing_fp32_precision(monkeypatch):
    """The attribute gone (an older torch's matmul object has no fp32_precision): the guard says so."""
    monkeypatch.setattr(torch.backends.cuda, "matmul", types.SimpleNamespace(allow_tf32=False))
    with pytest.raises(TorchTooOld, match="fp32_precision needs torch >= 2.9"):
        compat.need("fp32_precision")


def test_chapter_07_tf32_cell_is_guarded():
    """Chapter 07's TF32 cell uses fp32_precision directly (on CUDA): the guard comes first."""
    nb = json.loads((ROOT / "notebooks" / "07_kernels_and_compile.ipynb").read_text())
    cells = ["".join(c["source"]) for c in nb["cells"] if "code-07-tf32" in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1
    src = cells[0]
    assert 'lk.compat.need("fp32_precision")' in src
    assert src.index('lk.compat.need("fp32_precision")') < src.index("matmul.fp32_precision")
    assert lk.compat is compat


def test_selective_checkpointing_missing(monkeypatch):
    monkeypatch.delattr(torch.utils.checkpoint, "create_selective_checkpoint_contexts")
    with pytest.raises(TorchTooOld, match="selective activation checkpointing.*needs torch >= 2.4"):
        checkpointing._selective_context()
    found = rules.refusals(lk.Config(model="tiny", checkpointing="selective"), capabilities("cpu"))
    assert [str(e) for e in found if e.field == "checkpointing"] == [
        f"checkpointing='selective' is not allowed: none or full here: {compat.message('selective checkpointing')}"]
    assert not rules.refusals(lk.Config(model="tiny", checkpointing="full"), capabilities("cpu"))


def test_checkpoint_policy_missing(monkeypatch):
    monkeypatch.delattr(torch.utils.checkpoint, "CheckpointPolicy")
    with pytest.raises(TorchTooOld, match="selective activation checkpointing"):
        checkpointing._selective_context()


def test_sdpa_kernel_missing(monkeypatch):
    monkeypatch.delattr(torch.nn.attention, "sdpa_kernel")
    with pytest.raises(TorchTooOld, match=r"sdpa_kernel.*needs torch >= 2\.3"):
        measure.attention_backend("math")  # count_flops' backend too
    assert measure.attention_backend("auto") is not None  # the default backend needs no sdpa_kernel


def test_grad_scaler_missing(monkeypatch):
    monkeypatch.delattr(torch.amp, "GradScaler")
    with pytest.raises(TorchTooOld, match=r"GradScaler\(device\).*needs torch >= 2\.3"):
        check_precision._gradscaler_trace([False, True], 4.0, 2.0, 0.5, 2)
    found = rules.refusals(lk.Config(model="tiny", precision="fp16"), capabilities("cpu"))
    assert [e.field for e in found] == ["loss_scaling"] and compat.message("GradScaler") in str(found[0])
    assert not rules.refusals(lk.Config(model="tiny", precision="bf16"), capabilities("cpu"))  # no scaler


def test_fully_shard_missing(monkeypatch):
    monkeypatch.delattr(torch.distributed.fsdp, "fully_shard")
    with pytest.raises(TorchTooOld, match="fully_shard needs torch >= 2.6"):
        pb.shard(GPT(lk.PRESETS["tiny"]))
    demo = pb.fsdp_demo(model="tiny", world_size=2)  # nothing spawned: the chapter's note says why
    assert demo == {"ok": False, "error": compat.message("fully_shard"), "ranks": {}}


def _floors() -> dict:
    req = re.findall(r"^torch(\S*)", (ROOT / "requirements.txt").read_text(), re.M)
    deps = re.search(r"^dependencies\s*=\s*\[(.*?)\]", (ROOT / "pyproject.toml").read_text(), re.M | re.S).group(1)
    return {"requirements.txt": req, "pyproject.toml": re.findall(r'"torch([^"]*)"', deps)}


def test_floor_is_stated_once():
    """requirements.txt and pyproject.toml ask for the torch compat says the suite passed on; CI pins no torch:
    its main pass installs what a newcomer's pip resolves (the newest release it can reach)."""
    for name, specs in _floors().items():
        assert specs == [f">={compat.TORCH_FLOOR}"], name
    ci = (ROOT / ".ci" / "run").read_text()
    assert "PIP_CONSTRAINT" not in ci and not (ROOT / ".ci" / "constraints.txt").exists()
