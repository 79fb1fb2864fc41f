"""Command line: ``python -m labkit run|env|sweep|course|drill|assignments|grade``. Imports no widget or notebook library."""
from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import itertools
import io
import json
import math
import os
import sys
import time
import typing

from .base import phrases
from .base.numfmt import counted
from .engine.config import Config, cli_args  # cli_args: the inverse of config_from_args
from .engine.device import env_report
from .engine.measure import MFU_WRONG, mfu_impossible
from .base.runtime import ConfigError, RunError
from .base.paths import check_writable, write_atomic
from .base.frontend import Progress
from .tools import sweep
from .content import pages
from .tools.sweep import MAX_RUNS  # the CLI's --max-runs default
from .engine.rules import check as check_device
from .engine.train import run


def _or_text(kind):
    """A reader of ``kind`` (int, float) that gives back the text as typed when it is not one, so that
    Config says in one line which field and what is allowed (argparse would print its whole usage)."""
    def read(s: str):
        try:
            return kind(s)
        except ValueError:
            return s
    return read


_int, _float = _or_text(int), _or_text(float)


def _opt_float(s: str):
    return None if s.lower() in ("none", "off", "0") else _float(s)


def _reader(field_type, cli):
    """How argparse reads a field: from its type (Optional[int] -> _int, ...) or its metadata's ``cli``."""
    if cli == "off_float":
        return _opt_float
    types = [t for t in (typing.get_args(field_type) or (field_type,)) if t is not type(None)]
    if int in types:
        return _int
    if float in types:
        return _float
    return None  # a string or a choice: Config names the field when it is wrong


def _add_config_args(p: argparse.ArgumentParser):
    """One flag per Config field, made from the field itself: ``--micro-batch`` for ``micro_batch``, its
    default, its help text (config.py says each once). Flag names and defaults are a contract."""
    hints = typing.get_type_hints(Config)
    for f in dataclasses.fields(Config):
        meta = f.metadata
        flag = "--" + f.name.replace("_", "-")
        words = meta["help"] + (f" ({', '.join(meta['choices'])})" if meta["choices"] else "")
        if meta.get("cli") == "switch":
            p.add_argument(flag, action="store_true", help=words)
        elif hints[f.name] is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=words)
        else:
            p.add_argument(flag, type=_reader(hints[f.name], meta.get("cli")), default=f.default, help=words)


_CONFIG_FIELDS = list(Config.__dataclass_fields__)
# The command line's sentences (its help and what it prints): lab_messages.md's "Command line" section.
WORDS = phrases.load_section("lab_messages.md", "Command line", {
    "row-model": ("model", "params", "layers", "d"), "row-batch": ("micro", "seq", "accum", "world", "tokens"),
    "row-precision": ("precision", "scaling", "ckpt"), "row-step": ("step", "data", "compute", "optimizer"),
    "row-throughput": ("tokens", "wait"), "row-mfu-wrong": ("wrong", "peak"), "row-mfu": ("mfu", "hfu", "peak"),
    "row-memory": ("params", "grads", "optimizer", "activations", "peak"),
    "row-allreduce": ("calls", "bytes", "buckets", "sync"), "row-loss": ("first", "final", "norm", "skipped"),
    "row-threads": ("threads", "workers"), "run-ended": ("status", "updates"), "env-none-fast": (),
    "env-against-fp32": (), "rows-fallback": ("error", "n"), "rows-wrote": ("n", "out"),
    "sweep-done": ("done", "total", "time"), "sweep-start": ("runs", "dims", "updates"),
    "help-run": (), "help-run-json": (), "help-env": (), "help-no-measure": (), "help-remeasure": (),
    "help-sweep": (), "help-grid": (), "help-sweep-out": (), "help-max-runs": ("n",), "help-course": (),
    "help-course-dir": ("dir",), "help-drill": (), "help-case": (), "help-seed": (), "help-timer": (),
    "help-gauntlet": (), "help-n": (), "help-answer": (), "help-drill-out": (), "help-assignments": (),
    "help-chapters": (), "help-assignments-out": (), "help-force": (), "help-grade": (),
    "help-grade-chapters": (), "help-jobs": (), "assignment": ("name", "exercises", "checks", "points"),
    "assignment-kept": ("mine", "new"), "next-otter": ("notebook", "dist"), "next-nbgrader": ("out", "first"),
    "grade-interrupted": ("grades",), "graded": ("learners", "graded", "grades", "checks"), "graded-none": (),
    "interrupted": ()})
say = WORDS.say


def config_from_args(ns) -> Config:
    kw = {f: getattr(ns, f) for f in _CONFIG_FIELDS if hasattr(ns, f)}
    if os.environ.get("WORLD_SIZE") and ("TORCHELASTIC_RUN_ID" in os.environ):
        kw["world_size"] = int(os.environ["WORLD_SIZE"])  # under torchrun the launcher decides
    return Config.from_dict(kw)


def _fmt_bytes(b):
    if b is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(b) < 1024 or unit == "TiB":
            return f"{b:.1f} {unit}" if unit != "B" else f"{b:.0f} B"
        b /= 1024


def _fmt(v, pct=False):
    if v is None:
        return "n/a"
    if pct:
        return f"{100 * v:.1f} %"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    return str(v)


def table(s: dict) -> str:
    rows = [
        ("device", f"{s['device']} ({s['device_name']})"),
        ("model", say("row-model", model=s["model"], params=f"{s['n_params']:,}", layers=s["n_layer"], d=s["d_model"])),
        ("batch", say("row-batch", micro=s["micro_batch"], seq=s["seq_len"], accum=s["accum"], world=s["world_size"],
                      tokens=f"{s['tokens_per_update']:,}")),
        ("precision", say("row-precision", precision=s["precision"], scaling=s["loss_scaling"],
                          ckpt=s["checkpointing"])),
        ("step time", say("row-step", step=_fmt(s["step_time_s"]), data=_fmt(s["data_wait_s"]),
                          compute=_fmt(s["compute_s"]), optimizer=_fmt(s["optimizer_s"]))),
        ("throughput", say("row-throughput", tokens=_fmt(s["tokens_per_s"]), wait=_fmt(s["data_wait_frac"], True))),
        ("MFU / HFU", say("row-mfu-wrong", wrong=MFU_WRONG, peak=_fmt(s["peak_flops"])) if mfu_impossible(s["mfu"])
         else say("row-mfu", mfu=_fmt(s["mfu"], True), hfu=_fmt(s["hfu"], True), peak=_fmt(s["peak_flops"]))),
        ("peak source", s["peak_flops_source"]),
        *([("⚠ MFU", s["mfu_note"])] if s.get("mfu_note") else []),
        ("memory", say("row-memory", params=_fmt_bytes(s["param_bytes"]), grads=_fmt_bytes(s["grad_bytes"]),
                       optimizer=_fmt_bytes(s["optimizer_bytes"]), activations=_fmt_bytes(s["activation_bytes"]),
                       peak=_fmt_bytes(s["peak_mem_bytes"]))),
        ("AllReduce", say("row-allreduce", calls=_fmt(s["allreduce_calls_per_update"]),
                          bytes=_fmt_bytes(s["allreduce_bytes_per_update"]), buckets=_fmt(s["n_buckets"]),
                          sync=s["ddp_sync"])),
        ("loss", say("row-loss", first=_fmt(s["first_loss"]), final=_fmt(s["final_loss"]), norm=_fmt(s["grad_norm"]),
                     skipped=s["skipped_steps"])),
        ("threads", say("row-threads", threads=s["intra_op_threads"], workers=s["workers"])),
    ]
    if s.get("precision_note"):
        rows.insert(4, ("note", s["precision_note"]))
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


@contextlib.contextmanager
def _stdout_to_stderr():
    """While the engine runs, file descriptor 1 is stderr's: torch's C++ code writes to it directly (gloo in
    torch 2.9 prints "[Gloo] Rank 0 is connected to 0 peer ranks ..." when a process group starts), and
    stdout must carry only the report (``--json``: one JSON document). Spawned ranks inherit it. Yields
    a file that still writes to the real stdout (the drill's own text)."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no file descriptor 1 at all: nothing can be written there either
        yield sys.stdout
        return
    keep = os.fdopen(saved, "w", buffering=1, closefd=False)
    try:
        os.dup2(2, 1)
        yield keep
    finally:
        keep.close()  # flushes; the descriptor stays open until it is put back
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def cmd_run(ns) -> int:
    cfg = config_from_args(ns)
    rank0 = int(os.environ.get("RANK", 0)) == 0
    shown = rank0 and not ns.json and sys.stderr.isatty()  # a pipe or --json gets no progress line
    with _stdout_to_stderr(), Progress(cfg.steps, "run", delay=1.0 if shown else math.inf) as bar:
        res = run(cfg, on_step=lambda rec: bar.update(
            rec["update"], f"loss {rec['loss']:.4f} · {rec['tokens_per_s']:,.0f} tokens/s"))
    if not rank0:
        return 0
    if ns.json:
        print(json.dumps(res.summary))
    else:
        if res.summary.get("status") != "completed":
            print(say("run-ended", status=res.summary.get("status"), updates=res.summary.get("updates_done")))
            return 1
        print(table(res.summary))
    return 0


def cmd_env(ns) -> int:
    rep = env_report(ns.device, measure=not ns.no_measure, remeasure=ns.remeasure)
    if ns.json:
        print(json.dumps(rep))
        return 0
    print(f"device        {rep['kind']}: {rep['name']}  ({rep['reason']})")
    print(f"torch         {rep['torch_version']}, Python {rep['python']}")
    if rep["compute_capability"]:
        print(f"capability    {rep['compute_capability']}, {counted(rep['n_devices'], 'GPU')}")
    print(f"precisions    {', '.join(rep['precisions'])}")
    print(f"memory        {_fmt_bytes(rep['memory_bytes'])}")
    print(f"cpu           {rep['cores']} cores ({rep['cores_from']}); flags: {' '.join(rep['cpu_flags']) or 'n/a'}")
    for p, v in rep["peak_flops"].items():
        print(f"peak {p:<8} {_fmt(v['flops'] and v['flops'] / 1e12)} TFLOP/s  ({v['source']})")
    if rep["peak_flops"]:
        fast = rep["fast_formats"]
        print(f"fast formats  {', '.join(fast) if fast else say('env-none-fast')}"
              + ("  " + say("env-against-fp32") if rep["kind"] == "cpu" else ""))
        print(f"peak cache    {rep['peak_cache']}")
    return 0


_BOOLEANS = {"true": True, "on": True, "1": True, "false": False, "off": False, "0": False}


def _parse_grid(items) -> dict:
    """{field: [value text, ...]} from the --grid options; a field given twice (in either spelling) is an
    error, never a silent merge. Values stay text here: a million of them are counted before any is read."""
    grid, given = {}, {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError("grid", item, "FIELD=v1,v2,... e.g. precision=fp32,bf16")
        key, vals = item.split("=", 1)
        key = key.strip().replace("-", "_")
        if key not in Config.__dataclass_fields__:
            raise ConfigError("grid", key, "a Config field: " + ", ".join(_CONFIG_FIELDS))
        if key in given:
            raise ConfigError("grid", item, f"each field once: {key} is already given by --grid {given[key]}; "
                                            f"list all its values in one --grid")
        given[key] = item
        grid[key] = vals.split(",")
    return grid


def _coerce(key, v):
    """One grid value as its field's type ('none' for a field that may be None); text that is no number
    stays text, and Config names the field. A boolean is one of six words, never a guess."""
    hint = typing.get_type_hints(Config)[key]
    if hint is bool:
        word = v.strip().lower()
        if word not in _BOOLEANS:
            raise ConfigError(key, v, "true, false, on, off, 1 or 0")
        return _BOOLEANS[word]
    if v.lower() == "none" and type(None) in typing.get_args(hint):
        return None
    reader = _reader(hint, None)
    return reader(v) if reader else v


def _distinct(key: str, texts: list, values: list) -> None:
    """Two spellings of one value (off and 0, 1e-3 and 0.001) would run the same configuration twice."""
    seen = {}
    for text, v in zip(texts, values):
        if repr(v) in seen:
            raise ConfigError(key, ",".join(texts), f"each value once: {seen[repr(v)]} and {text} are both {v!r}")
        seen[repr(v)] = text


def _check_out(out):
    """--out is checked before any run: a folder, a device (/dev/full), a read-only or missing place is
    one line now, not a traceback after the whole grid ran."""
    if out is None:
        return None
    try:
        check_writable(out)
    except (OSError, ValueError) as e:
        raise ConfigError("out", out, f"a file labkit can write ({e})") from None
    return out


def _rows_text(rows: list, out: str) -> str:
    if out.endswith(".json"):
        return json.dumps(rows, indent=1)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for r in rows for k in r)), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def _save_rows(rows: list, out: str) -> bool:
    """Write the rows atomically; if that still fails (the disk filled up during the sweep), print them."""
    try:
        write_atomic(out, _rows_text(rows, out))
    except (OSError, ValueError) as e:
        print(say("rows-fallback", error=e, n=len(rows)), file=sys.stderr)
        print(json.dumps(rows))
        return False
    print(say("rows-wrote", n=len(rows), out=out), file=sys.stderr)
    return True


def _run_all(keys, combos, configs) -> list:
    """Every configuration once, through the one sweep (tools.sweep); the summaries, in grid order."""
    t0 = time.perf_counter()
    notes = [" ".join(f"{k}={v}" for k, v in zip(keys, combo)) for combo in combos]
    with _stdout_to_stderr():
        runs, _ = sweep.run_configs(configs, run, label="sweep", notes=notes)  # run: looked up here at call time
    rows = [runs[i][0] for i in range(len(configs))]
    print(say("sweep-done", done=len(rows), total=len(configs), time=sweep.fmt_s(time.perf_counter() - t0)),
          file=sys.stderr)
    return rows


def cmd_sweep(ns) -> int:
    base = config_from_args(ns)
    raw = _parse_grid(ns.grid)
    n = sweep.count_runs(raw, ns.max_runs)
    out = _check_out(ns.out)
    grid = {k: [_coerce(k, v) for v in vals] for k, vals in raw.items()}
    for k, vals in grid.items():
        _distinct(k, raw[k], vals)
        for v in vals:
            base.replace(**{k: v})  # each value alone first: a bad one is one line, before the count below
    print(say("sweep-start", runs=f"{n:,} run{'s' * (n != 1)}", dims=sweep.dims(raw),
              updates=counted(base.steps, "update")), file=sys.stderr, flush=True)
    keys = list(grid)
    combos = list(itertools.product(*grid.values())) if keys else [()]
    configs = [base.replace(**dict(zip(keys, c))) for c in combos]  # validate all before running any,
    for cfg in configs:
        check_device(cfg)  # also against this device
    rows = _run_all(keys, combos, configs)
    saved = _save_rows(rows, out) if out else True
    if (ns.json or not out) and saved:
        print(json.dumps(rows))
    return 0 if saved else 1


def parser() -> argparse.ArgumentParser:
    """The command line's parser: ``run``, ``env``, ``sweep``, ``course``, ``drill``, ``assignments`` and ``grade``."""
    ap = argparse.ArgumentParser(prog="python -m labkit", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_run = sub.add_parser("run", help=say("help-run"))
    _add_config_args(p_run)
    p_run.add_argument("--json", action="store_true", help=say("help-run-json"))
    p_env = sub.add_parser("env", help=say("help-env"))
    p_env.add_argument("--device", default="auto")
    p_env.add_argument("--json", action="store_true")
    p_env.add_argument("--no-measure", action="store_true", help=say("help-no-measure"))
    p_env.add_argument("--remeasure", action="store_true", help=say("help-remeasure"))
    p_sw = sub.add_parser("sweep", help=say("help-sweep"))
    _add_config_args(p_sw)
    p_sw.add_argument("--grid", action="append", metavar="FIELD=v1,v2", help=say("help-grid"))
    p_sw.add_argument("--out", default=None, help=say("help-sweep-out"))
    p_sw.add_argument("--max-runs", type=_int, default=MAX_RUNS, help=say("help-max-runs", n=MAX_RUNS))
    p_sw.add_argument("--json", action="store_true")
    p_co = sub.add_parser("course", help=say("help-course"))
    p_co.add_argument("dir", nargs="?", default=pages.DEFAULT_DIR, metavar="DIR",
                      help=say("help-course-dir", dir=pages.DEFAULT_DIR))
    p_dr = sub.add_parser("drill", help=say("help-drill"))
    p_dr.add_argument("--case", default=None, help=say("help-case"))
    p_dr.add_argument("--seed", type=_int, default=0, help=say("help-seed"))
    p_dr.add_argument("--timer", type=_float, default=180.0, help=say("help-timer"))
    p_dr.add_argument("--gauntlet", action="store_true", help=say("help-gauntlet"))
    p_dr.add_argument("--n", type=_int, default=10, help=say("help-n"))
    p_dr.add_argument("--answer", action="append", default=[], metavar="CAUSE,FIX", help=say("help-answer"))
    p_dr.add_argument("--out", default=None, help=say("help-drill-out"))
    p_as = sub.add_parser("assignments", help=say("help-assignments"))
    p_as.add_argument("--tool", choices=("nbgrader", "otter"), required=True, help="the grading tool")
    p_as.add_argument("--chapters", default=None, metavar="NN,NN", help=say("help-chapters"))
    p_as.add_argument("out", metavar="OUT", help=say("help-assignments-out"))
    p_as.add_argument("--force", action="store_true", help=say("help-force"))
    p_as.add_argument("--lang", choices=("en", "ru"), default="en",
                      help="the edition: en (notebooks/) or ru (the Russian chapters, notebooks/ru/)")
    p_gr = sub.add_parser("grade", help=say("help-grade"))
    p_gr.add_argument("submissions", metavar="SUBMISSIONS", help="one folder per learner, holding their NN_*.ipynb")
    p_gr.add_argument("out", metavar="OUT", help="where grades.csv and checks/<learner>.csv go")
    p_gr.add_argument("--chapters", default=None, metavar="NN,NN", help=say("help-grade-chapters"))
    p_gr.add_argument("--jobs", type=int, default=None, metavar="N", help=say("help-jobs"))
    return ap


def cmd_assignments(ns) -> int:
    from .instructor import assignments, otter  # deferred: they load the checkers (their points); only this needs them

    chapters = [c.strip() for c in ns.chapters.split(",")] if ns.chapters else None
    try:
        if ns.tool == "otter":  # labkit's own build of otter's source notebooks: otter itself is not imported
            built = otter.build_otter(ns.out, chapters, lang=ns.lang)
        else:
            built = assignments.build_nbgrader(ns.out, chapters, force=ns.force, lang=ns.lang)
    except OSError as e:  # a folder that cannot be written, a labkit without the reference solutions
        print(f"error: {e}", file=sys.stderr)
        return 1
    for name, one in built.items():  # an assignment's counts (not a run's summary)
        print(say("assignment", name=name, exercises=one["exercises"], checks=one["checks"],
                  points=counted(one["points"], "point")))
    for mine, new in (pair for one in built.values() for pair in one.get("kept", ())):
        print(say("assignment-kept", mine=mine, new=new))
    first = next(iter(built))
    if ns.tool == "otter":
        folder = os.path.join(ns.out, first)
        print(say("next-otter", notebook=os.path.join(folder, first + ".ipynb"), dist=os.path.join(folder, "dist")))
    else:
        print(say("next-nbgrader", out=ns.out, first=first))
    return 0


def cmd_grade(ns) -> int:
    from .instructor import classgrade  # deferred: it runs notebooks (nbclient); only this command needs it

    chapters = [c.strip() for c in ns.chapters.split(",")] if ns.chapters else None
    try:
        # progress goes to stderr: stdout holds the result only (the grades themselves when OUT cannot take them)
        rows = classgrade.grade_class(ns.submissions, ns.out, chapters, say=lambda line: print(line, file=sys.stderr),
                                      jobs=ns.jobs)
    except classgrade.GradesNotWritten as e:  # a full disk: the grades are not lost, they go to stdout
        print(f"error: {e}", file=sys.stderr)
        print(e.text, end="")
        return 1
    except OSError as e:  # a folder that cannot be read or written
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\n" + say("grade-interrupted", grades=os.path.join(ns.out, "grades.csv")), file=sys.stderr)
        return 130
    learners = len({grade["learner"] for grade in rows})  # grades.csv rows, not a run's records
    graded = [grade for grade in rows if not grade["status"].startswith("not graded")]
    print(say("graded", learners=counted(learners, "learner"), graded=counted(len(graded), "graded exercise"),
              grades=os.path.join(ns.out, "grades.csv"), checks=os.path.join(ns.out, "checks")))
    if not graded:  # nothing graded is a failed run, whatever the reasons listed above
        print(say("graded-none"), file=sys.stderr)
        return 1
    return 0


def cmd_drill(ns) -> int:
    from .drills import attempt  # deferred: the drills load the checkers' grade log; only this command needs it

    out = _check_out(ns.out)
    with _stdout_to_stderr() as keep:
        scorecard = attempt.main(ns.case, ns.seed, ns.timer, ns.gauntlet, ns.n if ns.gauntlet else 1, ns.answer,
                                  out, out=lambda text: print(text, file=keep, flush=True),
                                  read=lambda prompt: (print(prompt, end="", file=keep, flush=True), input())[1])
    return 130 if scorecard["stopped"] else 0  # Ctrl-C: the card of the answered drills was kept


def cmd_course(ns) -> int:
    try:
        report = pages.copy_course(ns.dir)
    except OSError as e:  # a folder that cannot be written, a package without its course files
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(pages.describe(report))
    return 0


def main(argv=None) -> int:
    ns = parser().parse_args(argv)
    try:
        return {"run": cmd_run, "env": cmd_env, "sweep": cmd_sweep, "course": cmd_course,
                "drill": cmd_drill, "assignments": cmd_assignments, "grade": cmd_grade}[ns.cmd](ns)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\n" + say("interrupted"), file=sys.stderr)
        return 130
    except RunError as e:  # one clear line, not a traceback, for expected failures
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
