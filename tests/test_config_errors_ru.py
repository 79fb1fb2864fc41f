"""A ConfigError reaches a learner who chose Russian in Russian (issue #51): base/runtime.py builds its message through
the formatter labkit.base.phrases installs, and the checks of lk.Config say what is allowed through the
"Setting errors" section of notebooks/lab_messages.md (its Russian: notebooks/ru/lab_messages.md). In English
the messages are byte for byte what they were."""
from __future__ import annotations

import ast
import re
from dataclasses import replace
from pathlib import Path

import pytest

from labkit.base import phrases, runtime
from labkit.base.runtime import ConfigError
from labkit.engine import config, rules
from labkit.engine.config import Config
from labkit.engine.device import capabilities

ROOT = Path(__file__).resolve().parent.parent
CYRILLIC = re.compile("[а-яё]", re.IGNORECASE)


@pytest.fixture
def english(monkeypatch):
    monkeypatch.setattr(phrases, "_chosen", [])
    monkeypatch.delenv("LABKIT_LANG", raising=False)


def refusal(values) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        Config.from_dict(values)
    assert isinstance(info.value, ValueError)
    return info.value


# the messages as main said them before the Russian frame existed (read from it, not written from memory)
ENGLISH = [
    ({"micro_batch": 0}, "micro_batch=0 is not allowed: an integer from 1 to 65536"),
    ({"precision": "bf61"}, "precision='bf61' is not allowed: did you mean 'bf16'? choose one of fp32, tf32, "
                            "fp16, bf16"),
    ({"dropout": 2}, "dropout=2 is not allowed: a number >= 0.0 and <= 0.9"),
    ({"lr": 0}, "lr=0 is not allowed: a number > 0.0 and <= 10.0"),
    ({"compile": 1}, "compile=1 is not allowed: True or False"),
    ({"n_head": 5}, "n_head=5 is not allowed: a divisor of d_model=256"),
    ({"corpus": 3}, "corpus=3 is not allowed: a path to a text file or folder, or None"),
    ({"init_scale": 0}, "init_scale=0 is not allowed: a number >= 5.960464477539063e-08 and <= "
                        "1.8446744073709552e+19"),
]


@pytest.mark.parametrize("values, message", ENGLISH)
def test_in_english_the_messages_are_unchanged(english, values, message):
    assert str(refusal(values)) == message


def test_in_english_the_other_messages_are_unchanged(english):
    e = refusal({"stepz": 3})
    assert str(e).startswith("stepz=3 is not allowed: did you mean 'steps'? not a Config field; fields are: "
                             "model, n_layer, d_model,") and str(e).endswith("memory_budget_gb, threads")
    assert str(refusal([1])) == ("config=[1] is not allowed: a dict of Config fields, e.g. "
                                 "{'model': 'tiny', 'steps': 5}")
    for call, message in [(lambda: config.real("x", -1), "x=-1 is not allowed: a finite number >= 0"),
                          (lambda: config.real("x", 0, strict=True), "x=0 is not allowed: a finite number > 0"),
                          (lambda: config.whole("n", 0), "n=0 is not allowed: a whole number >= 1"),
                          (lambda: config._int("k", 0, 1), "k=0 is not allowed: an integer >= 1")]:
        with pytest.raises(ConfigError) as info:
            call()
        assert str(info.value) == message


def test_a_bad_micro_batch_is_refused_in_russian(speaks_russian):
    e = refusal({"micro_batch": 0})
    assert (e.field, e.value) == ("micro_batch", 0)
    said = str(e)
    assert said.startswith("micro_batch=0 ") and CYRILLIC.search(said) and "not allowed" not in said
    assert re.findall(r"\d+", said.split("=", 1)[1]) == ["0", "1", "65536"]  # the value and the range
    assert "integer" not in e.allowed and CYRILLIC.search(e.allowed)


def test_an_unknown_field_with_a_did_you_mean_is_refused_in_russian(speaks_russian):
    e = refusal({"stepz": 3})
    assert (e.field, e.value) == ("stepz", 3)
    said = str(e)
    assert said.startswith("stepz=3 ") and "'steps'" in said and CYRILLIC.search(said)
    assert "did you mean" not in said and "not a Config field" not in said and "not allowed" not in said
    assert said.endswith(", ".join(config.defaults()))  # every field named, as in English
    assert said.index("'steps'") < said.index("model, n_layer")  # the suggestion first


def test_a_bad_choice_is_refused_in_russian(speaks_russian):
    e = refusal({"precision": "bf61"})
    assert (e.field, e.value) == ("precision", "bf61")
    said = str(e)
    assert said.startswith("precision='bf61' ") and "'bf16'?" in said and said.endswith("fp32, tf32, fp16, bf16")
    assert "choose one of" not in said and "not allowed" not in said and CYRILLIC.search(said)


@pytest.mark.parametrize("values, figures", [
    ({"dropout": 2}, ["2", "0.0", "0.9"]), ({"lr": 0}, ["0", "0.0", "10.0"]), ({"compile": 1}, ["1"]),
    ({"n_head": 5}, ["5", "256"]), ({"corpus": 3}, ["3"]), ({"attention": "flsh"}, ["flash"]),
])
def test_every_field_check_speaks_russian_with_its_figures(speaks_russian, values, figures):
    (name, value), = values.items()
    e = refusal(values)
    said = str(e)
    assert e.field == name and e.value == value and said.startswith(f"{name}={value!r} ")
    assert CYRILLIC.search(e.allowed) and "not allowed" not in said
    assert all(f in said for f in figures), (said, figures)
    if name in ("dropout", "lr"):
        assert ("> 0.0" if name == "lr" else ">= 0.0") in said and "<= " in said  # the signs the code fills


def test_the_other_checks_speak_russian(speaks_russian):
    for call, name, figure in [(lambda: config.real("x", -1), "x", ">= 0"),
                               (lambda: config.whole("n", 0), "n", ">= 1"),
                               (lambda: Config.from_dict([1]), "config", "{'model': 'tiny', 'steps': 5}")]:
        with pytest.raises(ConfigError) as info:
            call()
        assert info.value.field == name and figure in str(info.value) and CYRILLIC.search(info.value.allowed)
    c = Config()
    c.micro_batch = None  # a field the command line cannot set back to None
    with pytest.raises(ConfigError) as info:
        config.cli_args(c)
    assert str(info.value).startswith("micro_batch=None ") and CYRILLIC.search(info.value.allowed)


def test_a_check_given_its_own_english_words_keeps_them_in_the_russian_frame(speaks_russian):
    with pytest.raises(ConfigError) as info:  # a chapter's own allowed text: the frame only is Russian
        config.real("budget", -1.0, allowed="a budget in GiB >= 0")
    assert str(info.value).startswith("budget=-1.0 ") and str(info.value).endswith("a budget in GiB >= 0")
    assert "not allowed" not in str(info.value) and CYRILLIC.search(str(info.value))


def test_every_setting_error_is_translated_with_its_placeholders(speaks_russian):
    assert not [x for x in phrases.untranslated("lab_messages.md", "ru") if x[0] == "Setting errors"]
    words = config.ERROR_WORDS
    assert (words.page, words.heading) == ("lab_messages.md", "Setting errors")
    assert set(words.sentences) == set(phrases.FRAME) | set(words.spec)
    for key, english in words.sentences.items():
        said = words.template(key)
        assert said != english and CYRILLIC.search(said), key
        assert set(re.findall(r"{(\w+)}", said)) == set(re.findall(r"{(\w+)}", english)), key


def test_the_errors_module_imports_nothing_of_labkit_and_the_frame_is_english_while_it_is_said(monkeypatch):
    tree = ast.parse((ROOT / "labkit" / "base" / "runtime.py").read_text(encoding="utf-8"))
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [n.module for n in imports if isinstance(n, ast.ImportFrom)] == ["__future__", "pathlib"]
    assert not [n for n in imports if isinstance(n, ast.ImportFrom) and n.level]
    assert not [a.name for n in imports if isinstance(n, ast.Import) for a in n.names if a.name.startswith("labkit")]
    inner = []

    def formatter(field_name, value, allowed):  # a formatter that itself fails with a ConfigError
        inner.append(ConfigError("inner", 1, "x"))
        return f"[{field_name}]"
    monkeypatch.setattr(runtime, "_formatter", [formatter])
    assert str(ConfigError("outer", 2, "y")) == "[outer]"
    assert str(inner[0]) == "inner=1 is not allowed: x"  # said in English, no endless recursion


def test_any_config_error_is_framed_in_russian(speaks_russian):
    with pytest.raises(ConfigError) as info:
        phrases.choose_language("de")
    said = str(info.value)
    assert said.startswith("language='de' ") and said.endswith("one of en, ru") and CYRILLIC.search(said)


def test_a_wrong_labkit_lang_leaves_the_error_its_own_english_words(monkeypatch):
    monkeypatch.setattr(phrases, "_chosen", [])
    monkeypatch.setenv("LABKIT_LANG", "de")
    with pytest.raises(ConfigError, match=r"^language='fr' is not allowed: one of en, ru$"):
        phrases.choose_language("fr")
    with pytest.raises(ConfigError, match="LABKIT_LANG"):
        phrases.language()


# what a device refuses (labkit.engine.rules.refusals, "Device refusals"), as main said it on a CPU and a 2-GPU gloo card
CPU_REFUSALS = [
    ({"pin_memory": True}, "pin_memory=True is not allowed: False on cpu: pinned memory speeds host-to-GPU "
                           "copies, there is no such copy here"),
    ({"attention": "efficient"}, "attention='efficient' is not allowed: auto, math or flash on cpu (the "
                                 "memory-efficient kernel is CUDA-only)"),
    ({"memory_budget_gb": 100.0}, "memory_budget_gb=100.0 is not allowed: None on cpu: the budget uses CUDA's "
                                  "per-process memory fraction"),
    ({"world_size": 4096}, "world_size=4096 is not allowed: at most 2 on this machine (2 CPU cores)"),
]


def _caps(**changes):
    """This machine's CPU capabilities with 2 cores, or changed into another device's."""
    return replace(capabilities("cpu"), **{"cores": 2, **changes})


@pytest.mark.parametrize("values, message", CPU_REFUSALS)
def test_in_english_a_device_refusal_is_unchanged(english, values, message, monkeypatch):
    monkeypatch.setattr(rules, "max_world_size", lambda caps: 2)  # this machine's cores, pinned
    assert [str(e) for e in rules.refusals(Config(**values), _caps())] == [message]


def test_a_device_refusal_speaks_russian_with_its_figures(speaks_russian, monkeypatch):
    monkeypatch.setattr(rules, "max_world_size", lambda caps: 2)
    cuda = _caps(kind="cuda", n_devices=2, memory_bytes=16 * 2**30, name="T4", ddp_backend="gloo")
    said = {**{k: rules.refusals(Config(**v), _caps()) for k, v in (("pin", {"pin_memory": True}),
                                                                    ("world", {"world_size": 4096}))},
            "budget": rules.refusals(Config(memory_budget_gb=100.0), cuda),
            "gpus": rules.refusals(Config(world_size=4096), cuda),
            "hook": rules.refusals(Config(comm_hook="bf16_compress", world_size=2), cuda)}
    for key, (e,) in said.items():
        assert isinstance(e, ConfigError) and CYRILLIC.search(e.allowed) and "not allowed" not in str(e), key
        assert str(e).startswith(f"{e.field}={e.value!r} "), key
    assert said["pin"][0].field == "pin_memory" and "cpu" in str(said["pin"][0])
    assert re.findall(r"\d+", said["world"][0].allowed) == ["2", "2"]  # the limit and the cores
    assert "16.0" in said["budget"][0].allowed and "T4" in said["budget"][0].allowed
    assert re.findall(r"\d+", said["gpus"][0].allowed) == ["2", "2"]  # the limit and the GPUs
    assert "gloo" in said["hook"][0].allowed and "NCCL" in said["hook"][0].allowed
    assert not [x for x in phrases.untranslated("lab_messages.md", "ru") if x[0] == "Device refusals"]
