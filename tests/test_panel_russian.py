"""The lab panel speaks the learner's language (issue #51): with Russian chosen, every word its widgets and
charts show comes from the Russian pages -- buttons, knob labels, titles, column headers, status lines, chart
titles and keys -- and no sentence falls back to English; with English, the words are the ones it always showed."""
import html
import re

import matplotlib

matplotlib.use("Agg")

import ipywidgets as widgets  # noqa: E402
import pytest  # noqa: E402

import labkit as lk  # noqa: E402
from labkit.base import phrases  # noqa: E402
from labkit.tools import plots  # noqa: E402

# Three or more words in a row made of Latin letters only: English prose (code names such as micro_batch=8,
# bf16 or AllReduce/update are not such words).
WORD = re.compile(r"^[A-Za-z]{2,}$")


def english_runs(text: str) -> list:
    words = [w.strip(",.:;()[]«»'\"") for w in text.split()]
    runs, run = [], []
    for w in words + [""]:
        if WORD.match(w):
            run.append(w)
            continue
        if len(run) >= 3:
            runs.append(" ".join(run))
        run = []
    return runs


def shown_texts(w, out=None) -> list:
    """What a learner reads in a widget tree: descriptions, tooltips, option labels, titles, HTML as text."""
    out = [] if out is None else out
    for attr in ("description", "tooltip"):
        v = getattr(w, attr, None)
        if isinstance(v, str) and v:
            out.append(v)
    if isinstance(w, (widgets.HTML, widgets.Label)):
        out.append(html.unescape(re.sub(r"<[^>]+>", " ", re.sub(r"title='([^']*)'", r"> \1 <", w.value))))
    if isinstance(w, (widgets.Dropdown, widgets.ToggleButtons)):
        out += list(w._options_labels)
    if isinstance(w, widgets.Accordion):
        out += [w.get_title(i) or "" for i in range(len(w.children))]
    for child in getattr(w, "children", ()) or ():
        shown_texts(child, out)
    return out


def chart_texts(fig) -> list:
    out = []
    for ax in fig.axes:
        out += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()] + [t.get_text() for t in ax.texts]
        out += [t.get_text() for t in ax.get_xticklabels() + ax.get_yticklabels()]
    return [t for t in out if t]


def passed_through(lab, result) -> list:
    """Words the panel shows as the engine wrote them (not the panel's own): this device's refusal reasons,
    a run's precision note, the prediction's caveat, the machine's and the GPU catalogue's names."""
    out = [why for values in lab._knobs.disabled.values() for why in values.values()]
    out += [result.summary.get("precision_note") or "", lab.caps.name]
    out += [label for label, _ in lab._whatif.gpu.options]
    caveat = re.search(r"измерено: (.*?) \(", lab._whatif.text)
    return out + ([caveat.group(1)] if caveat else [])


def test_the_panel_built_in_russian_shows_no_english_words(speaks_russian):
    lab = lk.Lab(preset="all", model="tiny", steps=2)
    built = shown_texts(lab.widget)
    assert "Запустить" in built and "Остановить" in built and "микробатч" in " ".join(built)
    first = lab.run()
    lab.run(accum=2)
    texts = built + shown_texts(lab.widget) + lab.compare(0)
    for name in plots.CHARTS:
        texts += chart_texts(plots.LiveChart(name).draw(first))
        texts += chart_texts(plots.LiveChart(name).draw({"records": []}))
    texts += chart_texts(plots.compare(lab.history, 0)) + chart_texts(lab._whatif.fig)
    texts.append(plots.reference({}, []))
    skip = [s for s in passed_through(lab, first) if s]
    found = set()
    for text in texts:
        for s in skip:
            text = text.replace(s, " ")
        found.update(english_runs(text))
    assert not found, sorted(found)


def test_a_russian_panel_asks_for_no_english_fallback(speaks_russian):
    lab = lk.Lab(preset="precision", model="tiny", steps=2)
    lab._knobs.controls["checkpointing"].button("attention")  # the panel's own button words are said too
    assert lab._knobs.more.get_title(0) == "Другие настройки"
    assert [b.description for b in lab._knobs.controls["checkpointing"].box.children][-1] == "каждый k-й"


def test_english_words_stay_as_they_were():
    assert phrases.language() == "en"
    lab = lk.Lab(preset="precision", model="tiny", steps=2)
    assert (lab._run_button.description, lab._stop_button.description) == ("Run", "Stop")
    assert lab._all_charts.description == "all charts" and lab._knobs.more.get_title(0) == "More knobs"
    assert lab._history.box.get_title(0) == "Run history"
    rows = [row.children[0].value for row in lab._knobs.box.children + lab._knobs.more.children[0].children]
    for words in ("micro-batch", "accumulation steps", "loss scaling", "data cost (ms/sample)", "memory budget (GiB)"):
        assert any(f">{words}</span>" in r for r in rows), words
    assert lab._knobs.notes.value.startswith("<div class='labkit-unavailable'") and \
        "'>Not available on this device: " in lab._knobs.notes.value or not lab._knobs.notes.value
    lab.set(accum=3)
    assert "Set away from this panel&#x27;s defaults:" not in lab._knobs.changes.value
    assert "Set away from this panel's defaults: <b>accum</b> 3 (default 1)" in lab._knobs.changes.value
    assert [b.description for b in lab._knobs.controls["checkpointing"].box.children] == [
        "none", "full", "selective (SAC)", "attention core", "every k"]
    assert plots.LiveChart("step_time").draw({"records": []}).axes[0].get_title() == "Step time (ms), per update"
    from labkit.panel import parts
    assert parts.head()[:4] == ["run", "knobs", "device", "CPU threads"]
    assert parts.head()[-4:] == ["MFU % (of its format's own peak)", "AllReduce/update", "final loss", "notes"]


def test_an_ab_chart_and_its_status_speak_russian(speaks_russian):
    from labkit.tools.compare import Comparison
    cmp = Comparison(metric="tokens_per_s", ratio=1.3, low=1.2, high=1.4, verdict="higher", better="b",
                     samples_a=[1.0, 1.1, 1.0, 1.05, 1.0], samples_b=[1.3, 1.35, 1.3, 1.32, 1.3], busy=True,
                     sentence="", label_a="fp32", label_b="bf16")
    texts = chart_texts(plots.comparison(cmp))
    title = texts[0].replace("\n", " ")
    assert title.startswith("у bf16 выше: отношение 1.30 [1.20, 1.40] 95 %") and "(машина загружена)" in title
    assert not [r for t in texts for r in english_runs(t)], texts
    from labkit.panel import lab, parts
    assert [parts.label(k) for k in lab._COMPARED.values()] == ["сравнено: без разницы", "сравнено: выше",
                                                              "сравнено: ниже"]
