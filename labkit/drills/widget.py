"""The drills in a notebook: ``Drill`` (one case) and ``Gauntlet`` (ten in a row, a score card). A thin
layer over ``attempt.Attempt``: every rule (the draw, the timer, the score, the reveal) is there.

    drill = lk.drills.Drill(seed=0)            # press Start: the run, its evidence, the clock
    drill.start(); drill.answer(cause, fix); drill.reveal()   # the same from code (blocking)

Start and Reveal run on a thread of their own, so the clock keeps ticking and the buttons answer while
a run goes; the clock is a thread that redraws the time left once a second and locks the drill when the
time is up (scored as timed out). On Colab, which shows a thread's widget changes only when another cell
runs (colabtools issue 3373), Start and Reveal run on the kernel's thread so their results show.
"""
from __future__ import annotations

import html
import math
import threading
import time
from typing import Optional

import ipywidgets as widgets
from matplotlib.ticker import MaxNLocator

from ..base.frontend import display_widget, threads_draw_late
from ..base.frontend import Progress
from ..engine.warm import prestart
from ..panel.parts import DRAW_LOCK
from ..tools import plots
from .attempt import (DEFAULT_LIMIT_S, Attempt, card, card_words, device_words, gauntlet_draw, record, row_words,
                      save_card)
from .bank import PAGE
from .evidence import budget, evidence_rows

_BOX = "border-left:3px solid {};padding:4px 8px;line-height:1.45"
say = PAGE.say


# The widest a chart is drawn, in CSS pixels: JupyterLab's output column at 1366 x 768 with the file browser
# open is about 900 px. A chart is shown at exactly its own size (``show_chart``), never stretched to the column.
CHART_MAX_PX = 880


def evidence_figure(ev: dict):
    """The run's curves: the step-time split (when the run timed its steps), the loss, the gradient norm, and
    where the ranks logged their parameters' norms, each rank's difference from rank 0 (identical under DDP).
    A chart with nothing to draw is left out; None when none has anything (``no_curves`` says why)."""
    recs = ev.get("records") or []
    norms = ev.get("param_norms_per_rank") or []
    panels = ([_step_time] if any(r.get("step_time_s") is not None for r in recs) else [])
    panels += [_loss, _grad_norm] if recs else []
    panels += [_rank_norms] if len(norms) > 1 and min(map(len, norms)) > 0 else []
    if not panels:
        return None
    width = min(2.6 * len(panels), CHART_MAX_PX / plots.DPI)
    fig = plots.new_figure(width, 2.4)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for draw_panel, ax in zip(panels, axes):
        draw_panel(ev, ax)
    return fig


def no_curves(ev: dict) -> str:
    """Why a run has no curves to draw, in one line (an empty chart would say nothing)."""
    if ev.get("timed_out"):
        return say("no-curves-hang")
    if ev.get("oom_at_update") == 1:
        return say("no-curves-oom")
    return say("no-curves")


def _step_time(ev, ax):
    plots.step_time({"records": ev["records"]}, ax=ax)


def _loss(ev, ax):
    plots.loss({"records": ev["records"]}, ax=ax)


def _grad_norm(ev, ax):
    recs = ev["records"]
    ax.plot([r["update"] for r in recs], [r["grad_norm"] for r in recs], marker="o", ms=2, color="#4c72b0")
    ax.set_ylim(bottom=0)
    ax.set_title(say("chart-grad-norm"), fontsize=plots.TITLE)
    ax.tick_params(labelsize=plots.FONT)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # updates are whole numbers


def _rank_norms(ev, ax):
    """Each rank's parameter norm minus rank 0's, per update: the norms agree to the 5th digit, so their
    difference is what a reader can see (0 while the ranks hold the same parameters)."""
    norms = ev["param_norms_per_rank"]
    n = min(map(len, norms))
    for r in range(1, len(norms)):
        ax.plot(range(1, n + 1), [norms[r][u] - norms[0][u] for u in range(n)], marker="o", ms=2,
                label=say("rank", rank=r))
    ax.axhline(0, color="#888888", lw=0.8)
    ax.set_title(say("chart-rank-norms"), fontsize=plots.TITLE)
    ax.set_xlabel(say("chart-update"), fontsize=plots.FONT)
    ax.tick_params(labelsize=plots.FONT)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def show_chart(image, fig) -> None:
    """Put ``fig`` into the Image widget ``image`` as a PNG shown at its own pixel size (a VBox would stretch
    it to the column, blurring it): narrower columns scale it down, none scales it up."""
    w, h = round(fig.get_figwidth() * fig.dpi), round(fig.get_figheight() * fig.dpi)
    with DRAW_LOCK:
        image.value = plots.to_png(fig)
    image.layout.width, image.layout.height, image.layout.max_width = f"{w}px", "auto", "100%"
    image.layout.display = None


def _span(kind: str, text: str, style: str = "") -> str:
    """``text`` (escaped) in the drill's span of ``kind`` (status, gpu): the class a test or a theme finds it by."""
    css = f" style='{style}'" if style else ""
    return f"<span class='labkit-drill-{kind}'{css}>{html.escape(text)}</span>"


def _bold(text: str) -> str:
    return f"<b>{html.escape(text)}</b>"


def _table(rows) -> str:
    cells = "".join(f"<tr><td style='padding:1px 12px 1px 0;vertical-align:top'><b>{html.escape(k)}</b></td>"
                    f"<td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table class='labkit-drill-table' style='font-size:0.9em;line-height:1.35'>{cells}</table>"


class Drill:
    """One drill: ``case`` (an id; None: drawn from ``seed``), ``timer`` seconds (None: off, for self-study).
    Start runs the case; pick a cause and a fix, Answer, then Reveal. ``on_done(row)`` is called once the
    answer is in (the gauntlet's next step)."""

    _ipython_display_ = display_widget  # as its ipywidgets box, on ipywidgets 7 and 8 (base.frontend)

    def __init__(self, case=None, seed: int = 0, timer: Optional[float] = DEFAULT_LIMIT_S,
                 title: Optional[str] = None, on_done=None, clock=time.monotonic):
        self.attempt = Attempt(case, seed, timer, clock)
        self._on_done, self._thread, self._ticking, self._shown = on_done, None, threading.Event(), None
        self._half_answer = False  # Answer pressed with no cause or no fix: the clock keeps saying what is missing
        a, title = self.attempt, say("drill-title") if title is None else title
        self._start = widgets.Button(description=say("button-start"), button_style="success", icon="play")
        self._progress = widgets.IntProgress(min=0, max=2, value=0, layout=widgets.Layout(width="200px"))
        self._status = widgets.HTML(_span("status", say("press-start", limit=self._limit_words())))
        if a.cannot_show_here():  # a case named by id that this machine cannot show: said before it runs
            self._status.value += "<br>" + _span("gpu", say("needs-gpu", why=a.cannot_show_here()))
        self._clock = widgets.HTML()
        self._evidence, self._chart = widgets.HTML(), widgets.Image(format="png")
        self._chart.layout.display = "none"
        self._cause = widgets.RadioButtons(options=a.causes, value=None, layout=widgets.Layout(width="auto"))
        self._fix = widgets.Dropdown(options=[(say("choose-fix"), None)] + [(f, f) for f in a.fixes], value=None,
                                     layout=widgets.Layout(width="560px"))
        self._answer = widgets.Button(description=say("button-answer"), button_style="primary", disabled=True)
        self._score, self._reveal_out = widgets.HTML(), widgets.HTML()
        self._reveal = widgets.Button(description=say("button-reveal"), icon="eye", disabled=True)
        self._cmp_chart = widgets.Image(format="png")
        self._cmp_chart.layout.display = "none"
        self._start.on_click(lambda _: self._background(self.start))
        self._answer.on_click(lambda _: self._answer_clicked())
        self._reveal.on_click(lambda _: self._background(self.reveal))
        self._choices = widgets.VBox([widgets.HTML(_bold(say("what-is-wrong"))), self._cause,
                                      widgets.HTML(_bold(say("what-to-change"))), self._fix,
                                      widgets.HBox([self._answer, self._clock])])
        self._choices.layout.display = "none"
        self.widget = widgets.VBox([
            widgets.HTML(f"{_bold(title)} &middot; {html.escape(say('drill-ask'))}"),
            widgets.HBox([self._start, self._progress, self._status]), self._evidence, self._chart, self._choices,
            self._score, self._reveal, self._reveal_out, self._cmp_chart], layout=widgets.Layout(max_width="1100px"))
        self.widget.add_class("labkit-drill")
        if self.attempt.case.mistake == "" and self.attempt.case.knobs.get("world_size", 1) > 1:
            prestart()  # the DDP processes' server starts while the learner reads

    def _limit_words(self) -> str:
        lim = self.attempt.timer.limit_s
        return say("limit-none") if lim is None else say("limit-seconds", seconds=f"{lim:g}")

    def _background(self, fn):
        """Run ``fn`` (Start, Reveal) on a thread of its own; returns the thread. Where the front end shows a
        thread's widget changes late (Colab, ``base.frontend``) on this one instead, the evidence shown when
        it ends: returns None."""
        if self._thread is not None and self._thread.is_alive():
            return None
        if threads_draw_late():
            self._guarded(fn)
            return None
        self._thread = threading.Thread(target=self._guarded, args=(fn,), daemon=True, name="labkit-drill")
        self._thread.start()
        return self._thread

    def _guarded(self, fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 -- a thread has nowhere to raise to: the drill says it
            self._status.value = _span("status", str(e), "color:#b71c1c")

    def wait(self, timeout=None) -> bool:
        """Wait for a Start or Reveal pressed in the notebook; True once none is going."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    # -- the drill's steps ---------------------------------------------------------------------------
    def start(self) -> dict:
        """Run the case (and, hidden, its twin), show the evidence, start the clock. Returns the evidence."""
        if self.attempt.evidence is not None:
            return self.attempt.evidence
        self._start.disabled = True

        def progress(done, total, words):
            self._progress.value = done
            self._status.value = _span("status", words + "…")
        try:
            ev = self.attempt.run(progress)
        except KeyboardInterrupt:  # Ctrl-C mid-run: the drill can start again; a gauntlet keeps its card
            self._start.disabled = False
            self._status.value = _span("status", say("stopped-restart"))
            raise
        self._evidence.value = _table(evidence_rows(ev))
        fig = evidence_figure(ev)
        if fig is None:
            self._evidence.value += f"<p class='labkit-drill-no-curves'>{html.escape(no_curves(ev))}</p>"
        else:
            show_chart(self._chart, fig)
        self._choices.layout.display = None
        self._answer.disabled = False
        self._status.value = _span("status", say("evidence-below", seconds=f"{self.attempt.run_s:.1f}",
                                                 limit=self._limit_words()))
        if self.attempt.timer.limit_s is not None:
            self._ticking.set()
            threading.Thread(target=self._tick_loop, daemon=True, name="labkit-drill-clock").start()
        return ev

    def _tick_loop(self):
        while self._ticking.is_set() and not self.tick():
            time.sleep(0.5)  # noqa: sleep-ok -- the drill's clock redraws twice a second; no work is faked

    def tick(self) -> bool:
        """Redraw the time left; lock the drill when the time is up. True once the drill is over."""
        a = self.attempt
        if a.row is not None:
            return True
        if a.time_up() is not None:
            self._done()
            return True
        left = a.timer.left()
        if left is not None:
            clock = html.escape(say("clock-left", time=f"{int(left // 60)}:{int(left % 60):02d}"))
            if self._half_answer and (self._cause.value is None or self._fix.value is None):
                # else the next redraw, half a second on, would erase it
                clock += f" &middot; {html.escape(say('pick-both'))}"
            self._clock.value = f"<span class='labkit-drill-clock'>&nbsp; {clock}</span>"
        return False

    def _answer_clicked(self):
        if self._cause.value is None or self._fix.value is None:  # a half answer is not locked in
            self._half_answer = True
            self._clock.value = f"<span class='labkit-drill-clock'>&nbsp; {html.escape(say('pick-both'))}</span>"
            return
        self.answer(self._cause.value, self._fix.value)

    def answer(self, cause, fix) -> dict:
        """Lock in ``cause`` and ``fix`` (None: no fix named) and score them; returns the score card's row."""
        row = self.attempt.answer(cause, fix)
        self._done()
        return row

    def _done(self):
        self._ticking.clear()
        row = self.attempt.row
        if self._shown is row:  # once: the clock and the Answer button may both get here
            return
        self._shown = row
        self._answer.disabled = self._cause.disabled = self._fix.disabled = True
        self._clock.value = ""
        self._score.value = (f"<div class='labkit-drill-score' style='{_BOX.format('#4c72b0')}'>"
                             f"{html.escape(row_words(row))}</div>")
        self._reveal.disabled = False
        if self._on_done:
            self._on_done(row)

    def reveal(self) -> dict:
        """Run the learner's fix against the right one and show the measured difference."""
        self._reveal.disabled = True
        self._status.value = _span("status", say("revealing"))
        # a speed reveal runs both fixes in turns for 20-45 s: the course's progress line, drawn in the drill
        with Progress(math.ceil(budget()["budget_s"]), say("reveal-progress"), delay=math.inf) as bar:
            def told(seconds, total_s, runs):
                bar.update(int(seconds), note=say("reveal-runs", runs=runs))
                self._status.value = _span("status", bar.text())
            out = self.attempt.reveal(progress=told)
        self._reveal_out.value = (f"<div class='labkit-drill-reveal' style='{_BOX.format('#55a868')}'>"
                                  f"{html.escape(out['sentence'])}</div>")
        if out["comparison"] is not None:
            show_chart(self._cmp_chart, plots.comparison(out["comparison"]))
        self._status.value = _span("status", say("revealed"))
        return out

    def __repr__(self):
        return f"Drill({self.attempt.case.id if self.attempt.row else '?'}, {self._limit_words()})"


# a widget's HTML is not JupyterLab's rendered markdown: without a style its links look like plain text (the
# quiz's "Measured in" links are styled the same way)
LINK_STYLE = "color:var(--jp-content-link-color,#1976d2);text-decoration:underline"


def missed_html(missed: list) -> str:
    """The score card's missed drills as a table: your answer, the right one, and a link to the chapter
    section that teaches it (its heading; JupyterLab opens the notebook there). "" when none was missed."""
    if not missed:
        return ""
    cell = "<td style='padding:2px 10px 2px 0;vertical-align:top;text-align:left'>{}</td>"
    rows = []
    for m in missed:
        yours = say("missed-no-answer") if m["timed_out"] else f"{m['answer_cause']} / {m['answer_fix']}"
        chapter = html.escape(say("missed-chapter", chapter=m["chapter"]))
        where = (f"<a href='{html.escape(m['href'], quote=True)}' target='_blank' style='{LINK_STYLE}'>{chapter}: "
                 f"{html.escape(m['heading'].replace('`', ''))}</a>" if m["heading"] else chapter)
        rows.append("<tr>" + "".join(cell.format(v) for v in (
            f"{m['index']}", html.escape(yours), html.escape(f"{m['right_cause']} / {m['right_fix']}"), where)) + "</tr>")
    head = "<tr>" + "".join(f"<th style='text-align:left;padding-right:10px'>{html.escape(say(h))}</th>" for h in (
        "missed-drill", "missed-yours", "missed-right", "missed-where")) + "</tr>"
    return (f"<table class='labkit-gauntlet-missed' style='font-size:0.9em;line-height:1.35'>"
            f"<caption style='text-align:left'>{_bold(say('missed-head'))}</caption>{head}{''.join(rows)}</table>")


class Gauntlet:
    """``n`` drills in a row, seeded (the same seed: the same cases in the same order), and a score card.
    ``save(path)`` writes it as JSON (``attempt.card``'s schema); ``export()`` adds it to the grade log that
    ``lk.check.export_csv`` writes."""

    _ipython_display_ = display_widget  # as its ipywidgets box, on ipywidgets 7 and 8 (base.frontend)

    def __init__(self, seed: int = 0, n: int = 10, timer: Optional[float] = DEFAULT_LIMIT_S, clock=time.monotonic):
        self.seed, self.timer, self._clock = seed, timer, clock
        self.cases = gauntlet_draw(seed, n)  # never the drill of the same seed, shown above it in the notebook
        self.drills, self.rows, self._exported, self.stopped = [], [], 0, False
        self._next = widgets.Button(description=say("button-next"), icon="forward", disabled=True)
        self._next.on_click(lambda _: self.next())
        self._card = widgets.HTML()
        self._missed = widgets.Output()  # an output area: JupyterLab opens its links to the chapters in the app
        self._slot = widgets.VBox()
        self.widget = widgets.VBox([widgets.HTML(f"{_bold(say('gauntlet-title'))} &middot; "
                                                 f"{html.escape(say('gauntlet-about', n=n, seed=seed))}"),
                                    self._slot,
                                    self._next, self._card, self._missed])
        self.widget.add_class("labkit-gauntlet")
        self.next()

    @property
    def drill(self) -> Drill:
        return self.drills[-1]

    def next(self) -> Optional[Drill]:
        """The next drill (None after the last: the score card is shown)."""
        if self.stopped or len(self.drills) == len(self.cases) or (self.drills and self.drill.attempt.row is None):
            return None
        i = len(self.drills)
        d = Drill(self.cases[i], self.seed, self.timer, title=say("gauntlet-drill", i=i + 1, n=len(self.cases),
                                                                  seed=self.seed),
                  on_done=self._answered, clock=self._clock)
        self.drills.append(d)
        self._slot.children = [d.widget]
        self._next.disabled = True
        return d

    def _answered(self, row):
        if self.stopped:  # answered after stop(): the card was closed
            return
        self.rows.append(row)
        self._next.disabled = len(self.rows) == len(self.cases)
        self._show_card()

    def _show_card(self):
        last = self.stopped or len(self.rows) == len(self.cases)
        scorecard = self.card()
        words = html.escape(card_words(scorecard))
        self._card.value = (f"<div class='labkit-gauntlet-card' style='{_BOX.format('#8172b2')}'>"
                            f"{_bold(say('card-final' if last else 'card-so-far'))}: {words}</div>")
        # set as the output area's data, not printed into it: this may run on the drill's clock thread
        missed = missed_html(scorecard["missed"])
        self._missed.outputs = ({"output_type": "display_data", "metadata": {},
                                 "data": {"text/html": missed, "text/plain": "missed drills"}},) if missed else ()

    def stop(self) -> dict:
        """End the gauntlet now (after a Ctrl-C, or to stop early): the card keeps the drills answered so
        far, marked stopped; the drill under way is not scored. Returns the card."""
        self.stopped, self._next.disabled = True, True
        self._show_card()
        return self.card()

    def card(self) -> dict:
        return card(self.rows, seed=self.seed, limit_s=self.timer, device=device_words(), stopped=self.stopped)

    def save(self, path) -> str:
        return save_card(path, self.card())

    def export(self) -> int:
        """Add the drills answered since the last export to the grade log; returns how many."""
        c = self.card()
        c["drills"] = c["drills"][self._exported:]
        self._exported += record(c)
        return len(c["drills"])
