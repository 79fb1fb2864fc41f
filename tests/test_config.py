"""labkit.engine.config: every bad value fails before any work, with one message naming the field, the value and
the rule; run() checks its Config again; Config.from_dict refuses what is not a dict of fields."""
import pytest

import labkit as lk
from labkit.engine import precision as precision_mod
from labkit.engine.config import ConfigError
from labkit.engine.rules import check, refusals
from labkit.engine.device import Capabilities, capabilities, max_world_size

BAD = [
    (dict(model="huge"), "model"),
    (dict(micro_batch=0), "micro_batch"),
    (dict(micro_batch=-3), "micro_batch"),
    (dict(micro_batch=2.5), "micro_batch"),
    (dict(micro_batch=True), "micro_batch"),
    (dict(accum=0), "accum"),
    (dict(accum="4"), "accum"),
    (dict(seq_len=1), "seq_len"),
    (dict(precision="fp8"), "precision"),
    (dict(loss_scaling="maybe"), "loss_scaling"),
    (dict(checkpointing="some"), "checkpointing"),
    (dict(model="tiny", checkpoint_every=3), "checkpoint_every"),
    (dict(checkpoint_every=0), "checkpoint_every"),
    (dict(optimizer="lion"), "optimizer"),
    (dict(lr=0.0), "lr"),
    (dict(lr=float("nan")), "lr"),
    (dict(grad_clip=-1.0), "grad_clip"),
    (dict(attention="fast"), "attention"),
    (dict(workers=-1), "workers"),
    (dict(pin_memory="yes"), "pin_memory"),
    (dict(prefetch_factor=0), "prefetch_factor"),
    (dict(data_cost_ms=-1.0), "data_cost_ms"),
    (dict(world_size=0), "world_size"),
    (dict(world_size=10_000), "world_size"),
    (dict(ddp_sync="sometimes"), "ddp_sync"),
    (dict(bucket_cap_mb=0), "bucket_cap_mb"),
    (dict(comm_hook="zip"), "comm_hook"),
    (dict(steps=0), "steps"),
    (dict(seed=-1), "seed"),
    (dict(device="tpu"), "device"),
    (dict(n_head=5), "n_head"),  # 256 is not divisible by 5
    (dict(compile="yes"), "compile"),
]


# What this machine (a CPU, no GPU) refuses: a Config can describe it -- to save, load or compare --
# and lk.run refuses it before any work, with the same kind of message.
REFUSED_HERE = [
    (dict(precision="tf32"), "precision"),  # tf32 is CUDA-only; this machine has no GPU
    (dict(attention="efficient"), "attention"),  # CUDA-only kernel
    (dict(pin_memory=True), "pin_memory"),  # nothing to pin for on a CPU
    (dict(world_size=1000), "world_size"),  # more processes than this machine has cores
    (dict(comm_hook="bf16_compress"), "comm_hook"),  # gloo cannot reduce bf16
    (dict(device="cuda"), "device"),  # no GPU here
    (dict(memory_budget_gb=8.0), "memory_budget_gb"),  # CUDA-only
    (dict(corpus="/no/such/file.txt"), "corpus"),
]


def _names_field_value_and_rule(error, field):
    assert error.field == field
    msg = str(error)
    assert msg.startswith(f"{field}=")
    assert repr(error.value) in msg
    assert "not allowed" in msg and len(error.allowed) > 5


@pytest.mark.parametrize("kwargs,field", BAD, ids=[f"{f}={list(k.values())[0]!r}" for k, f in BAD])
def test_bad_value_names_field_value_and_rule(kwargs, field):
    with pytest.raises(lk.ConfigError) as e:
        lk.Config(**kwargs)
    _names_field_value_and_rule(e.value, field)


@pytest.mark.skipif(capabilities().kind != "cpu", reason="the refusals of a machine without a GPU")
@pytest.mark.parametrize("kwargs,field", REFUSED_HERE, ids=[f"{f}={list(k.values())[0]!r}" for k, f in REFUSED_HERE])
def test_what_this_device_refuses_is_refused_by_run(kwargs, field, no_work):
    cfg = lk.Config(model="tiny", **kwargs)  # a description: it can be built, saved and loaded anywhere
    assert lk.Config.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(lk.ConfigError) as e:
        lk.run(cfg)
    _names_field_value_and_rule(e.value, field)


def test_defaults_are_valid_and_derived_values():
    c = lk.Config()
    assert c.spec.n_layer == 4 and c.context == 128
    assert lk.Config(precision="fp16").scaling_on  # auto = on for fp16
    assert not lk.Config(precision="bf16").scaling_on  # bf16 has fp32's range: no scaler
    assert lk.Config(precision="bf16", loss_scaling="on").scaling_on
    assert lk.Config(model="tiny", micro_batch=4, accum=8).tokens_per_update == 4 * 64 * 8


def test_bf16_and_tf32_refused_on_a_t4():
    t4 = Capabilities(kind="cuda", name="Tesla T4", reason="test", n_devices=1, compute_capability="7.5",
                      bf16=False, fp16=True, tf32=False, memory_bytes=16 * 2**30, ddp_backend="nccl")
    for p in ("bf16", "tf32"):
        with pytest.raises(lk.ConfigError) as e:
            check(lk.Config(precision=p), t4)
        assert e.value.field == "precision" and "7.5" in str(e.value) and "8.0" in str(e.value)
    assert lk.Config(precision="fp16").scaling_on and not refusals(lk.Config(precision="fp16"), t4)
    with pytest.raises(lk.ConfigError, match="world_size"):
        check(lk.Config(world_size=2), t4)  # one visible GPU
    with pytest.raises(lk.ConfigError, match="memory_budget_gb"):
        check(lk.Config(memory_budget_gb=32.0), t4)  # more than the card has
    assert not refusals(lk.Config(memory_budget_gb=8.0, comm_hook="bf16_compress"), t4)


def test_precision_note_follows_the_cpu_flags():
    def cpu(*flags):
        return Capabilities(kind="cpu", name="test CPU", reason="test", bf16=True, fp16=True, cpu_flags=list(flags))
    note = precision_mod.precision_note
    assert "AMX-BF16" in note(cpu("amx_bf16", "avx512_bf16"), "bf16")
    assert "modest" in note(cpu("avx512_bf16"), "bf16")
    assert "slower than fp32" in note(cpu("avx2"), "bf16")
    assert "slower than fp32" in note(cpu("amx_bf16", "avx512_fp16"), "fp16")  # AVX512-FP16 is not enough
    assert "faster" in note(cpu("amx_fp16"), "fp16")
    assert note(cpu(), "fp32") is None
    assert note(cpu(), "bf16") is None  # no flags read (ARM, macOS): nothing claimed either way
    # a measurement wins over the flags: AMX present but switched off (ONEDNN_MAX_CPU_ISA=AVX2)
    assert "50x slower" in note(cpu("amx_bf16"), "bf16", factor=50.0)
    assert "faster" in note(cpu("avx2"), "bf16", factor=0.2)
    gpu = Capabilities(kind="cuda", name="NVIDIA H200", reason="test", bf16=True, fp16=True, tf32=True)
    assert note(gpu, "bf16") is None  # tensor cores: the course's table holds, nothing to add


def test_ddp_refused_on_mps():
    mps = Capabilities(kind="mps", name="Apple MPS", reason="test", bf16=True, fp16=True)
    with pytest.raises(lk.ConfigError) as e:
        check(lk.Config(world_size=2), mps)
    assert e.value.field == "world_size" and "MPS" in str(e.value)
    with pytest.raises(lk.ConfigError, match="tf32"):
        check(lk.Config(precision="tf32"), mps)


def test_cli_prints_one_line_and_exits_nonzero(capsys):
    from labkit.__main__ import main

    rc = main(["run", "--model", "tiny", "--accum", "0"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.strip().splitlines() == ["error: accum=0 is not allowed: an integer from 1 to 4096"]


def test_every_field_says_once_what_it_is_and_the_cli_and_readme_follow():
    """Help text, label and choices live in each field's metadata; the CLI's flags are made from them, and
    the README's flag list names every one."""
    import argparse
    import dataclasses
    from pathlib import Path

    from labkit.__main__ import _add_config_args

    parser = argparse.ArgumentParser()
    _add_config_args(parser)
    flags = {s for a in parser._actions for s in a.option_strings}
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    for f in dataclasses.fields(lk.Config):
        assert len(f.metadata["help"]) > 5, f.name
        flag = "--" + f.name.replace("_", "-")
        assert flag in flags and flag in readme, flag
        assert parser.get_default(f.name) == f.default, f.name  # defaults are a contract
    assert lk.Config.__dataclass_fields__["precision"].metadata["choices"] == ("fp32", "tf32", "fp16", "bf16")


def test_choices_and_defaults_are_read_from_the_fields_not_retyped():
    """#26: the panel and the plots read a field's choices and default from Config (config.choices/default)."""
    import dataclasses

    from labkit.engine import config as config_mod

    assert config_mod.choices("loss_scaling") == ("auto", "on", "off") == config_mod.LOSS_SCALING
    assert config_mod.choices("optimizer") == config_mod.OPTIMIZERS
    assert config_mod.choices("model") == tuple(config_mod.PRESETS)
    assert config_mod.choices("lr") == ()  # a number: no menu
    fresh = lk.Config()
    assert config_mod.defaults() == {f.name: getattr(fresh, f.name) for f in dataclasses.fields(lk.Config)}
    assert config_mod.default("micro_batch") == fresh.micro_batch and config_mod.default("grad_clip") == fresh.grad_clip
    with pytest.raises(lk.ConfigError, match="did you mean 'optimizer'"):
        config_mod.choices("optimiser")


# ---- run() checks a Config changed after it was built ----------------------------------------------

# Before: IndexError after ~10 s, ZeroDivisionError, a RuntimeError from autograd, a reshape error,
# and more ranks than cores.
CHANGES = [("micro_batch", 0), ("steps", 0), ("accum", 0), ("n_head", 3), ("precision", "fp8"),
           ("model", "huge"), ("world_size", None)]


@pytest.mark.parametrize("field,value", CHANGES, ids=[f for f, _ in CHANGES])
def test_a_config_changed_after_validation_is_checked_again(field, value, no_work):
    c = lk.Config(model="tiny")
    if field == "world_size":
        value = max_world_size(capabilities(c.device)) + 1
    setattr(c, field, value)
    with pytest.raises(lk.ConfigError) as err:
        lk.run(c)
    assert err.value.field == field and err.value.value == value, str(err.value)


def test_a_valid_changed_config_still_runs():
    c = lk.Config(model="tiny")
    c.steps = 2
    assert lk.run(c).summary["steps"] == 2


# ---- Config.from_dict ------------------------------------------------------------------------------

@pytest.mark.parametrize("values", [None, [], ["model"], "tiny", 5])
def test_from_dict_of_something_else_names_what_is_allowed(values):
    with pytest.raises(ConfigError, match="a dict of Config fields") as e:
        lk.Config.from_dict(values)
    assert e.value.field == "config" and e.value.value == values


def test_from_dict_still_builds_a_config():
    assert lk.Config.from_dict({"model": "tiny", "steps": 2}).steps == 2
