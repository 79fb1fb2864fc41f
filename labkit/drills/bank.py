"""The drills' catalogue (``CASES``) and their words, read from their only source: interview_drills.md (documented at
its top). ``SPECS`` below keeps what runs (the knobs, the twin, the planted mistake, the signal); the page holds
what the learner reads -- each case's cause, fix words, why it needs a GPU, the reveal's explanation -- and every
sentence the drills say, as templates whose ``{name}`` placeholders the code fills with figures. A malformed entry
raises ``DrillsPageError`` naming the file and line, the entry, the field, the value and what is allowed, when the
drills are imported. An installed labkit reads the copy the wheel carries (``base.phrases.notebooks_dir``).
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..base import phrases
from ..base.runtime import ConfigError
from ..base.page import anchor
from ..base.phrases import items as _items, plain as _plain, split as _split, visible as _visible

FILE = "interview_drills.md"
CASES_HEADING, SIGNALS_HEADING, SENTENCES_HEADING = SECTIONS = ("Cases", "Signals", "Sentences")
ID = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
ITEM = phrases.ITEM
# a case's fields in the page -> the Case attribute each fills
CASE_FIELDS = {"cause": "cause", "fix words": "fix_words", "code fix": "code_fix", "needs a GPU": "needs_gpu"}

# Every sentence the drills say: its key in the page -> the placeholders the code fills (a template may leave
# any of them out, and may use no other).
SENTENCES = {
    # the reveal (drills.evidence.reveal)
    "reveal-cannot-run": ("fix", "error"), "reveal-right-fix-is": ("right_fix",), "reveal-healthy-right": (),
    "reveal-changed-nothing": ("answer", "signal", "case"),
    "reveal-healthy-unneeded": ("fix", "signal", "case", "yours"),
    "reveal-healthy-unneeded-same": ("fix", "signal", "case"), "reveal-lower-loss": (),
    "reveal-speed-healthy": ("speed",), "reveal-right": ("fix", "signal", "case", "right"),
    "reveal-speed-right": ("speed",), "reveal-wrong": ("fix", "signal", "yours", "right_fix", "right", "case"),
    "reveal-speed-wrong": ("speed",), "reveal-oom": ("fix", "yours", "right_fix", "right", "case"),
    "fate-oom": ("update",), "fate-completed": (), "reveal-code-how": (),
    "reveal-code-changed-nothing": ("answer", "signal", "case", "right"),
    "reveal-code-wrong": ("fix", "signal", "yours", "right_fix", "right", "case"),
    "label-case": (), "label-right-fix": (), "label-yours": (), "label-leaving": (),  # the comparison's arms
    "value-not-measured": (), "value-yes": (), "value-no": (),  # a signal's value (drills.evidence.show)
    "no-fix": (),  # the fix menu's "nothing wrong" entry (drills.bank.NO_FIX)
    "reveal-line": ("sentence",),
    # the evidence rows (drills.attempt): what each instrument read
    "row-step-time": ("step", "data", "compute", "optimizer"), "row-data-wait": ("share",),
    "row-throughput": ("tokens", "samples"), "row-mfu": ("mfu", "hfu"), "row-mfu-wrong": ("mfu",),
    "row-allreduce": ("calls", "bytes"), "row-memory": ("params", "grads", "optimizer", "activations", "peak"),
    "row-oom": ("update", "peaks"), "row-oom-first": ("update",), "row-profiler": ("dtype",),
    "row-optimizer": ("lr", "sequences"), "row-loss": ("first", "final", "updates", "drop"),
    "row-grad-norm": ("norm", "clipped"), "row-loss-scale": ("scale",), "row-zero-grads": ("share",),
    "row-evaluation": ("losses",), "row-collectives": ("counts",), "row-parameters-same": ("norms",),
    "row-parameters-differ": ("norms", "update"), "row-hang": ("error",),
    "row-experts": ("shares", "largest", "even"), "row-tp-collectives": ("gathers", "scatters", "reduces"),
    # the evidence rows' names, a run's status, the units and a rank (drills.attempt)
    **{f"name-{k}": () for k in ("run", "step-time", "data-wait", "throughput", "mfu", "allreduce", "memory", "oom",
                                 "profiler", "optimizer", "loss", "grad-norm", "loss-scale", "skipped", "zero-grads",
                                 "evaluation", "collectives", "parameters", "hang", "experts", "tp")},
    "status-oom": (),
    "mfu-above-peak": (),  # engine.measure.MFU_WRONG's words
    "unit-ms": ("value",), "unit-mib": ("value",), "rank": ("rank",),
    # one drill (drills.attempt, drills.widget)
    "button-start": (), "button-answer": (), "button-reveal": (), "drill-title": (), "clock-left": ("time",),
    "reveal-progress": (), "running-case": (), "running-twin": (), "ready": (), "limit-none": (),
    "limit-seconds": ("seconds",), "drill-ask": (), "press-start": ("limit",), "needs-gpu": ("why",),
    "what-is-wrong": (), "what-to-change": (), "choose-fix": (), "pick-both": (), "stopped-restart": (),
    "evidence-below": ("seconds", "limit"), "revealing": (), "reveal-runs": ("runs",), "revealed": (),
    "no-curves-hang": (), "no-curves-oom": (), "no-curves": (), "chart-grad-norm": (), "chart-rank-norms": (),
    "chart-update": (),  # the rank chart's axis (tools.plots' own charts say their words from lab_messages.md)
    "time-up": ("seconds", "cause", "fix"), "scored": ("cause_mark", "fix_mark", "cause", "fix", "seconds"),
    "mark-right": (), "mark-wrong": (), "word-right": (), "word-wrong": (), "answer-prompt": (),
    "answer-unread": ("answer",), "log-timed-out": ("seconds",), "log-scored": ("cause", "fix", "seconds"),
    # the gauntlet and its score card (drills.attempt, drills.widget)
    "gauntlet-title": (), "button-next": (), "gauntlet-about": ("n", "seed"), "gauntlet-drill": ("i", "n", "seed"),
    "single-drill": ("seed",), "card": ("causes", "drills", "fixes", "both", "timed_out"),
    "card-median": ("seconds",), "card-stopped": (), "card-so-far": (), "card-final": (),
    "stopped-early": ("answered", "drills"), "missed-title": (), "missed-head": (), "missed-drill": (),
    "missed-yours": (), "missed-right": (), "missed-where": (), "missed-no-answer": (),
    "missed-chapter": ("chapter",), "missed-no-notebook": (), "wrote": ("path",),
}


DrillsPageError = phrases.PageError  # a malformed entry: file and line, entry, field, value, what is allowed


@dataclass(frozen=True)
class Page:
    """What the page holds: ``cases`` {id: {"cause", "fix_words", "code_fix", "needs_gpu", "words", "line"}},
    ``signals`` {evidence key: its name in a sentence}, ``sentences`` {key: template}."""
    cases: dict
    signals: dict
    sentences: dict = field(default_factory=dict)
    where: str = FILE

    def say(self, key: str, **values) -> str:
        """The sentence ``key`` with its placeholders filled from ``values`` (figures the caller formatted)."""
        return self.sentences[key].format(**values)

    def signal(self, key: str) -> str:
        """A signal's name in a sentence ("median gradient norm (before clipping)"); the key itself if unnamed."""
        return self.signals.get(key, key)


def source_path() -> Path:
    """The page's file: the checkout's notebooks/, else the copy an installed labkit carries."""
    return phrases.page_path(FILE)


# ---- parsing ----------------------------------------------------------------------------------------------

def parse(text: str, where: str = FILE, cases: dict = None) -> Page:
    """The Page of the page's markdown. ``cases`` {id: healthy?} is the catalogue's (``SPECS``): every
    one must have its section, and no other. Raises DrillsPageError on a malformed entry."""
    visible = _visible(text.splitlines())
    parts = {h: (n, rows) for n, h, rows in _split(visible, "## ")}
    for name in SECTIONS:
        if name not in parts:
            raise DrillsPageError(where, None, "section", None, f"a `## {name}` section (the page's sections: "
                                                                f"{', '.join(SECTIONS)})")
    extra = sorted(set(parts) - set(SECTIONS))
    if extra:
        raise DrillsPageError(where, None, "section", extra[0], "one of " + ", ".join(SECTIONS))
    found = _cases(parts[CASES_HEADING][1], where)
    if cases is not None:
        _check_catalogue(found, cases, where, parts[CASES_HEADING][0])
    signals = {k: _plain(f"{where}:{n}", k, "signal", v)
               for n, k, v in _items(parts[SIGNALS_HEADING][1], where, SIGNALS_HEADING)}
    sentences = phrases.sentences(parts[SENTENCES_HEADING][1], where, SENTENCES, SENTENCES_HEADING)
    return Page(found, signals, sentences, where)


def _cases(rows: list, where: str) -> dict:
    out = {}
    first = next(((n, ln) for n, ln in rows if ln.strip()), None)
    if first is not None and not first[1].startswith("### "):
        raise DrillsPageError(f"{where}:{first[0]}", None, "line", first[1][:60], "one `### case-id` section a case")
    for n, cid, body in _split(rows, "### "):
        if not ID.fullmatch(cid):
            raise DrillsPageError(f"{where}:{n}", None, "case id", cid, "lowercase letters, digits and '-'")
        if cid in out:
            raise DrillsPageError(f"{where}:{n}", cid, "case id", cid,
                                  f"a case once (line {out[cid]['line']} has it)")
        out[cid] = _case(cid, n, body, where)
    return out


def _case(cid: str, line: int, body: list, where: str) -> dict:
    paragraphs, cur = [], None  # each a list of (line number, line)
    for n, ln in body:
        if not ln.strip():
            cur = None
        elif cur is None:
            cur = [(n, ln)]
            paragraphs.append(cur)
        else:
            cur.append((n, ln))
    if not paragraphs or not ITEM.match(paragraphs[0][0][1]):
        raise DrillsPageError(f"{where}:{line + 1}", cid, "fields", None,
                              "a list of `- field: text` under the heading, `- cause: ...` at least")
    fields = {}
    for n, key, value in _items(paragraphs[0], where, cid):
        if key not in CASE_FIELDS:
            raise DrillsPageError(f"{where}:{n}", cid, "field", key, "one of " + ", ".join(CASE_FIELDS))
        if CASE_FIELDS[key] in fields:
            raise DrillsPageError(f"{where}:{n}", cid, "field", key, "each field once")
        fields[CASE_FIELDS[key]] = _plain(f"{where}:{n}", cid, key, value)
    if "cause" not in fields:
        raise DrillsPageError(f"{where}:{line + 1}", cid, "cause", None, "a `- cause: ...` item (what is wrong, or "
                                                                          "the healthy cases' shared words)")
    if len(paragraphs) != 2:
        n, extra = paragraphs[2][0] if len(paragraphs) > 2 else (line, None)
        raise DrillsPageError(f"{where}:{n}", cid, "explanation", extra and extra[:60],
                              "one paragraph after the fields: what the reveal explains")
    n, first = paragraphs[1][0]
    if ITEM.match(first):
        raise DrillsPageError(f"{where}:{n}", cid, "field", first[:60], "the fields in one list right under the "
                                                                         "heading, before the explanation")
    words = _plain(f"{where}:{n}", cid, "explanation", " ".join(t.strip() for _, t in paragraphs[1]))
    return {"cause": "", "fix_words": "", "code_fix": "", "needs_gpu": "", **fields, "words": words, "line": line}


def _check_catalogue(found: dict, cases: dict, where: str, line: int) -> None:
    """Every case of the catalogue has its section and none other; the healthy ones share one cause, which
    no mistake has."""
    missing = [c for c in cases if c not in found]
    if missing:
        raise DrillsPageError(f"{where}:{line}", missing[0], "case", None, f"a `### {missing[0]}` section "
                                                                           "(every case of drills/bank.py SPECS has one)")
    extra = [c for c in found if c not in cases]
    if extra:
        raise DrillsPageError(f"{where}:{found[extra[0]]['line']}", extra[0], "case id", extra[0],
                              "one of the catalogue's cases (drills/bank.py SPECS): " + ", ".join(cases))
    healthy = {found[c]["cause"] for c in cases if cases[c]}
    if len(healthy) > 1:
        raise DrillsPageError(where, None, "cause", sorted(healthy), "one cause for every healthy case")
    for c in cases:
        if not cases[c] and found[c]["cause"] in healthy:
            raise DrillsPageError(f"{where}:{found[c]['line']}", c, "cause", found[c]["cause"],
                                  "a mistake's own words, not the healthy cases' cause")
        if cases[c] and (found[c]["code_fix"] or found[c]["fix_words"]):
            raise DrillsPageError(f"{where}:{found[c]['line']}", c, "fix", None, "no fix for a healthy case")


def load(path=None, cases: dict = None, lang: str | None = None) -> Page:
    """The Page parsed from the drills' file (``path``: another copy of it), in ``lang`` (None: the learner's
    language, ``phrases.language()``, as it is when the drills are imported) where its translation has each
    entry; English, with one warning each, where it does not."""
    path = Path(path) if path is not None else source_path()
    page = parse(path.read_text(encoding="utf-8"), path.name, cases)
    lang = lang or phrases.language()
    if lang == "en":
        return page
    page, left = translated(page, lang)
    for section, key, why in left:
        phrases._notice(f"{lang}/{FILE} ## {section}: {key!r} {why}; shown in English")
    return page


# ---- the page in another language (issue #51) ---------------------------------------------------------------
# notebooks/<lang>/interview_drills.md: the same three sections under the same (English) headings; a case's
# heading is `### case-id @hash` (``case_hash`` of its English), a signal's or sentence's key `key @hash`
# (``phrases.entry_hash`` of its English). An entry whose hash differs from the English it claims to translate
# is stale: the English is shown, with a warning, and ``untranslated`` names it.

def case_hash(case: dict) -> str:
    """The hash a translated case stores of its English: its fields, in CASE_FIELDS' order, and explanation."""
    fields = "\n".join(f"{k}: {case[v]}" for k, v in CASE_FIELDS.items() if case.get(v))
    return phrases.entry_hash(fields + "\n\n" + case["words"])


def _keyed(key: str, where: str) -> tuple:
    m = re.fullmatch(r"(?P<key>.+?) @(?P<hash>[0-9a-f]{8})", key)
    if m is None:
        raise DrillsPageError(where, key, "key", key, "`key @hash`: the 8 hex digits of the English entry's hash")
    return m["key"], m["hash"]


def read_translation(lang: str, text: str | None = None) -> dict:
    """{section: {key: (hash, what it says)}} of the ``lang`` copy (a case: its fields dict); {} when absent."""
    where = f"{lang}/{FILE}"
    if text is None:
        try:
            text = phrases.page_path(where).read_text(encoding="utf-8")
        except (FileNotFoundError, OSError):
            return {}
    parts = {h: rows for _, h, rows in _split(_visible(text.splitlines()), "## ")}
    out = {name: {} for name in SECTIONS}
    for n, head, body in _split(parts.get(CASES_HEADING, []), "### "):
        cid, digest = _keyed(head, f"{where}:{n}")
        out[CASES_HEADING][cid] = (digest, _case(cid, n, body, where))
    for name in (SIGNALS_HEADING, SENTENCES_HEADING):
        for n, key, value in _items(parts.get(name, []), where, name):
            k, digest = _keyed(key, f"{where}:{n}")
            out[name][k] = (digest, value)
    return out


def translated(page: Page, lang: str, text: str | None = None) -> tuple:
    """(``page`` with every entry its ``lang`` copy translates and whose hash matches, [(section, key, "missing"
    or "stale")] of the entries left in English). The translated sentences are checked as the English are
    (the placeholders the code fills); every healthy case must keep one cause."""
    done = read_translation(lang, text)
    where = f"{lang}/{FILE}"
    left, cases = [], {}
    for cid, english in page.cases.items():
        entry = done.get(CASES_HEADING, {}).get(cid)
        if entry is None or entry[0] != case_hash(english):
            left.append((CASES_HEADING, cid, "missing" if entry is None else "stale"))
            cases[cid] = english
        else:
            cases[cid] = {**entry[1], "line": english["line"]}

    def words(name, english, check=None):
        out = {}
        for key, text_ in english.items():
            entry = done.get(name, {}).get(key)
            if entry is None or entry[0] != phrases.entry_hash(text_):
                left.append((name, key, "missing" if entry is None else "stale"))
                out[key] = text_
            else:
                out[key] = _plain(where, key, name, entry[1])
        return out

    signals = words(SIGNALS_HEADING, page.signals)
    said = words(SENTENCES_HEADING, page.sentences)
    phrases.sentences([(0, f"- {k}: {v}") for k, v in said.items()], where, SENTENCES, SENTENCES_HEADING)
    healthy = [c for c in cases if page.cases[c]["cause"] == _healthy_cause(page)]
    if len({cases[c]["cause"] for c in healthy}) > 1:  # the healthy cases share one cause: all English then
        for c in healthy:
            if cases[c] is not page.cases[c]:
                cases[c] = page.cases[c]
                left.append((CASES_HEADING, c, "kept in English: the healthy cases' causes differ in the copy"))
    return Page(cases, signals, said, where), left


def _healthy_cause(page: Page) -> str:
    causes = [c["cause"] for c in page.cases.values()]
    return max(set(causes), key=causes.count)  # the healthy cases share theirs; every mistake has its own


def untranslated(lang: str = "ru") -> list:
    """[(section, key, "missing" or "stale")] of the drills' page against its ``lang`` copy."""
    return translated(load(lang="en"), lang)[1]


# The catalogue: planted mistakes, healthy look-alikes, and the evidence that tells each apart. Each ``Case``
# is data. ``knobs`` are the ``lk.Config`` fields of the run a learner diagnoses, ``twin`` those of its healthy
# twin (the same run with the mistake taken out); ``fix`` is the knob change that repairs it ({} when nothing
# is wrong). A mistake that no Config knob can make (``zero_grad`` inside the micro-batch loop, a rank skipping
# a collective) names its plain-torch loop in ``mistake`` (``drills.mistakes``); its knobs then size that loop.
# ``signal`` is the evidence key that distinguishes the case from its twin -- and from every other case a
# gauntlet can draw whose answer differs (``evidence.separated`` says how far apart two values must be: a test
# holds every pair to it). ``SPECS`` is what runs; ``CASES`` joins each spec to its words on the page.
# Every case's runs share these knobs: the CI-sized model, one thread (two threads fighting a shared
# machine's other programs for two cores measure the machine, not the mistake).
BASE = {"model": "tiny", "threads": 1, "seed": 0}


@dataclass(frozen=True)
class Case:
    id: str
    cause: str                # a short phrase; HEALTHY for a healthy case (the page's words)
    fix: dict                 # knob changes that repair it ({} for a healthy case)
    teaches: str              # the chapter cell that measures the effect: measure-NN-topic
    knobs: dict               # the case's lk.Config fields (BASE added when it runs)
    twin: dict                # the healthy twin's fields
    mistake: str = ""         # the planted code-level mistake in drills.mistakes, or ""
    signal: str = ""          # the evidence key that tells the case from its twin
    needs_gpu: str = ""       # why a CPU cannot show it; "" when it can (the page's words)
    words: str = ""           # what the reveal says (the page's words)
    speed_only: bool = field(default=False)  # only a speed tells it apart: CI tests its set-up, benchmarks its speed
    code_fix: str = ""        # a code-level mistake's fix, in words ("" when a knob change fixes it)
    fix_words: str = ""       # a knob fix's menu entry when "field=value" would not say the rule ("" otherwise)

    @property
    def healthy(self) -> bool:
        return self.cause == HEALTHY


# What runs: id, the fix, the teaching cell, the case's and the twin's knobs, the mistake and the signal
# ("healthy": nothing is wrong; the page's section of that id holds the words).
SPECS = (
    dict(id='sync-every-micro', fix={'ddp_sync': 'no_sync'}, teaches='measure-06-every-micro-real',
         knobs={'world_size': 2, 'accum': 4, 'micro_batch': 4, 'ddp_sync': 'every_micro', 'lr': 6e-4},
         twin={'world_size': 2, 'accum': 4, 'micro_batch': 4, 'ddp_sync': 'no_sync', 'lr': 6e-4},
         signal='allreduce_calls_per_update'),
    dict(id='loader-no-workers', fix={'workers': 1}, teaches='measure-05-starving', knobs={'data_cost_ms': 2.0,
         'workers': 0}, twin={'data_cost_ms': 2.0, 'workers': 1}, signal='data_wait_frac'),
    dict(id='fp32-on-fast-bf16', fix={'precision': 'bf16'}, teaches='measure-02-bf16-speed', knobs={'precision':
         'fp32', 'model': 'small'}, twin={'precision': 'bf16', 'model': 'small'}, signal='tokens_per_s',
         speed_only=True),
    dict(id='fp16-no-scaling', fix={'loss_scaling': 'on'}, teaches='measure-02-underflow', knobs={'precision':
         'fp16', 'loss_scaling': 'off'}, twin={'precision': 'fp16', 'loss_scaling': 'on'},
         mistake='fp16_without_scaler', signal='grad_zero_frac'),
    dict(id='bf16-with-scaler', healthy=True, fix={}, teaches='measure-02-bf16-scaler', knobs={'precision':
         'bf16', 'loss_scaling': 'on'}, twin={'precision': 'bf16', 'loss_scaling': 'off'}, signal='grad_scale'),
    dict(id='full-ckpt-ample-memory', fix={'checkpointing': 'none'}, teaches='measure-04-full-overhead',
         knobs={'checkpointing': 'full'}, twin={'checkpointing': 'none'}, signal='recompute_ratio'),
    dict(id='micro-batch-1', fix={'micro_batch': 8, 'accum': 1}, teaches='measure-01-low-mfu-suspect',
         knobs={'micro_batch': 1, 'accum': 8}, twin={'micro_batch': 8, 'accum': 1}, signal='mfu',
         speed_only=True),
    dict(id='pin-memory-off', fix={'pin_memory': True}, teaches='measure-05-pin-memory', knobs={'workers': 2,
         'pin_memory': False, 'model': 'small'}, twin={'workers': 2, 'pin_memory': True, 'model': 'small'},
         signal='data_wait_frac', speed_only=True),
    dict(id='step2-oom', fix={'micro_batch': 4, 'accum': 2}, teaches='measure-08-step2', knobs={'model': 'base',
         'micro_batch': 8, 'memory_budget_gb': 3.0, 'steps': 3}, twin={'model': 'base', 'micro_batch': 4, 'accum':
         2, 'memory_budget_gb': 3.0, 'steps': 3}, signal='oom_at_update'),
    dict(id='lr-not-scaled', fix={'lr': 6e-4}, teaches='measure-09-lr-batch', knobs={'micro_batch': 32, 'lr':
         3e-4, 'grad_clip': None}, twin={'micro_batch': 32, 'lr': 6e-4, 'grad_clip': None},
         signal='lr_vs_sqrt_rule'),
    dict(id='loss-not-divided', fix={}, teaches='measure-03-equivalence', knobs={'accum': 4, 'micro_batch': 2},
         twin={'accum': 4, 'micro_batch': 2}, mistake='loss_not_divided_by_k', signal='grad_norm'),
    dict(id='zero-grad-inside', fix={}, teaches='measure-03-equivalence', knobs={'accum': 4, 'micro_batch': 2},
         twin={'accum': 4, 'micro_batch': 2}, mistake='zero_grad_inside_loop', signal='grad_norm'),
    dict(id='dropout-in-eval', fix={}, teaches='measure-03-equivalence', knobs={'dropout': 0.1}, twin={'dropout':
         0.1}, mistake='dropout_in_eval', signal='eval_loss_spread'),
    dict(id='rank-skips-collective', fix={}, teaches='measure-06-ddp-two-procs', knobs={'world_size': 2},
         twin={'world_size': 2}, mistake='rank_skips_collective', signal='timed_out'),
    dict(id='moe-no-balance-loss', fix={}, teaches='measure-12-moe-balance', knobs={'steps': 40, 'lr': 5e-3},
         twin={'steps': 40, 'lr': 5e-3}, mistake='router_without_balance_loss', signal='max_expert_share'),
    dict(id='sp-rowwise-replicated', fix={}, teaches='measure-12-twod-counts', knobs={'world_size': 2},
         twin={'world_size': 2}, mistake='sp_rowwise_replicated', signal='tp_allreduce_calls'),
    dict(id='accum-equivalent', healthy=True, fix={}, teaches='measure-03-equivalence', knobs={'micro_batch': 8,
         'accum': 4, 'lr': 6e-4}, twin={'micro_batch': 32, 'accum': 1, 'lr': 6e-4}, signal='final_loss'),
    dict(id='ddp-equivalent', healthy=True, fix={}, teaches='measure-06-ddp-two-procs', knobs={'world_size': 2,
         'micro_batch': 4}, twin={'world_size': 1, 'micro_batch': 8}, signal='final_loss'),
    dict(id='every-micro-k1', healthy=True, fix={}, teaches='measure-06-sync-sweep', knobs={'world_size': 2,
         'accum': 1, 'micro_batch': 4, 'ddp_sync': 'every_micro'}, twin={'world_size': 2, 'accum': 1,
         'micro_batch': 4, 'ddp_sync': 'no_sync'}, signal='allreduce_calls_per_update'),
)
# Planned, for a later session: an unpadded vocabulary (the byte vocabulary is 256, already a multiple of
# 64: no knob makes it odd); fp16 overflow (NaN, a case of its own).

PAGE = load(cases={s["id"]: s.get("healthy", False) for s in SPECS})
HEALTHY = next((PAGE.cases[s["id"]]["cause"] for s in SPECS if s.get("healthy")), "nothing wrong")
_WORDS = ("cause", "needs_gpu", "words", "code_fix", "fix_words")
CASES = tuple(Case(**{k: v for k, v in s.items() if k != "healthy"}, **{k: PAGE.cases[s["id"]][k] for k in _WORDS})
              for s in SPECS)
NO_FIX = PAGE.say("no-fix")  # the page's words ("nothing to fix"), in the learner's language as HEALTHY is


# A fix is a key: a knob change as ``"field=value"`` (several joined by ``", "``), a code-level mistake's
# ``code_fix`` words, or ``NO_FIX``. The menu is built from the catalogue, so every case's right fix is in it and
# so are every other case's -- the distractors are real fixes of real mistakes.

def knob_label(fix: dict) -> str:
    """{"micro_batch": 8, "accum": 1} -> 'micro_batch=8, accum=1' (the knobs in the catalogue's order)."""
    return ", ".join(f"{k}={v}" for k, v in fix.items())


def check_case(case, field_name: str = "case") -> Case:
    """``case`` when it is a drills Case; else a ConfigError naming it (before any work)."""
    if not isinstance(case, Case):
        raise ConfigError(field_name, case, "a drills Case: lk.drills.case_by_id(id) gives one, "
                                            "lk.drills.CASES lists them")
    return case


def fix_key(case: Case) -> str:
    """The right fix of ``case``: its code change, its knob change, or NO_FIX for a healthy case."""
    check_case(case)
    if case.healthy:
        return NO_FIX
    return case.code_fix or case.fix_words or knob_label(case.fix)


def all_fixes() -> dict:
    """{fix key: the knob change it makes ({} for a code change or NO_FIX)}, in catalogue order."""
    out = {}
    for c in CASES:
        if not c.healthy:
            out.setdefault(fix_key(c), {} if c.code_fix else dict(c.fix))
    out[NO_FIX] = {}
    return out


# Where the course teaches a drill: the chapter notebook and the section heading above the cell a case
# names in ``teaches`` -- what the score card links to, since JupyterLab shows a chapter's headings and never
# its cell tags. Read from the course's own notebooks, so a renamed heading is followed, not remembered.
@functools.lru_cache(maxsize=None)
def _sections(folder: Path, chapter: str) -> tuple:
    """(notebook file name, {tag: the heading above it}) of chapter ``chapter`` ("06") in ``folder``."""
    found = sorted(folder.glob(f"{chapter}_*.ipynb"))
    if not found:
        return "", {}
    heading, under = "", {}
    for cell in json.loads(found[0].read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] == "markdown":
            lines = [ln for ln in "".join(cell["source"]).splitlines() if ln.startswith("#")]
            heading = lines[-1].lstrip("#").strip() if lines else heading
        for tag in cell.get("metadata", {}).get("tags", []):
            under[tag] = heading
    return found[0].name, under


def where_taught(case: Case) -> dict:
    """{"tag", "chapter", "notebook", "heading", "href"} for ``case``: ``href`` is the notebook and the
    heading's anchor, relative (the chapters sit beside the interview notebook in a checkout's notebooks/
    and in a folder ``labkit course`` made). Without the notebooks at hand: the chapter alone, "" for the
    rest."""
    chapter = case.teaches.split("-")[1]
    folder = phrases.notebooks_dir()
    notebook, under = _sections(folder, chapter) if folder is not None else ("", {})
    heading = under.get(case.teaches, "")
    href = f"{notebook}#{anchor(heading)}" if notebook and heading else notebook
    return {"tag": case.teaches, "chapter": chapter, "notebook": notebook, "heading": heading, "href": href}
