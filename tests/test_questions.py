"""The interview question bank: its markdown page is the only source (a malformed entry is refused with a
message naming it), every answer links the chapter section whose cells measure it, the page works from an
installed wheel, and the quiz widget's answer-then-reveal flow."""
import json
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import nbformat
import pytest

from labkit.base.runtime import ConfigError
from labkit.content import questions as bank
from labkit.drills.bank import CASES

NB_DIR = Path(__file__).resolve().parent.parent / "notebooks"
REQUIRED_TOPICS = ("measure", "precision", "accumulation", "checkpointing", "loader", "ddp", "network", "kernels",
                   "memory", "compose")


def notebook_tags(name):
    nb = nbformat.read(str(NB_DIR / name), as_version=4)
    return {t for c in nb.cells for t in c.get("metadata", {}).get("tags", [])}


def test_at_least_thirty_questions_with_unique_ids_over_every_topic():
    assert len(bank.QUESTIONS) >= 30
    ids = [q.id for q in bank.QUESTIONS]
    assert len(ids) == len(set(ids))
    for topic in REQUIRED_TOPICS:
        assert len(bank.by_topic(topic)) >= 2, f"topic {topic} has fewer than two questions"
    assert all(q.topic in bank.TOPICS for q in bank.QUESTIONS)
    assert all(q.question.strip() and len(q.answer) > 80 for q in bank.QUESTIONS)


def test_the_chapter_table_names_real_notebooks():
    for nn, name in bank.CHAPTER_NOTEBOOKS.items():
        assert name.startswith(nn + "_") and (NB_DIR / name).exists(), name


@pytest.mark.parametrize("q", bank.QUESTIONS, ids=[q.id for q in bank.QUESTIONS])
def test_every_referenced_tag_exists_in_the_notebook_it_names(q):
    assert q.tags, f"{q.id}: an answer must point at a measurement"
    for tag, notebook in q.backed_by():
        assert re.fullmatch(r"measure-\d\d-[a-z0-9-]+", tag), f"{q.id}: {tag!r} is not a measure-NN-topic tag"
        assert tag in notebook_tags(notebook), f"{q.id}: no cell tagged {tag} in {notebook}"


@pytest.mark.parametrize("chapter", ["07", "08", "12"])
def test_every_measurement_of_the_newest_chapters_backs_a_question(chapter):
    """Issue 18: the bank gains a question per section of chapters 07 and 08, each citing its cell -- so
    every measure-07-*/measure-08-* cell must be cited by at least one answer (issue 50: chapter 12's too)."""
    cited = {t for q in bank.QUESTIONS for t in q.tags}
    measured = {t for t in notebook_tags(bank.CHAPTER_NOTEBOOKS[chapter]) if t.startswith(f"measure-{chapter}-")}
    assert measured, f"chapter {chapter} has no measure-{chapter}-* cells"
    assert not measured - cited, f"no interview answer cites {sorted(measured - cited)}"


def test_the_page_is_the_source_one_question_a_section():
    """Issue 47.3: no generated copy; every ### section of the page is a question the quiz asks."""
    text = (NB_DIR / "interview_questions.md").read_text()
    assert bank.source_path() == NB_DIR / "interview_questions.md" and bank.to_markdown() == text
    assert "Generated" not in text and not hasattr(bank, "write_markdown")
    sections = re.findall(r"^### (.+)$", text, re.M)
    assert len(sections) == len(bank.QUESTIONS) == len(re.findall(r"^<details>", text, re.M))
    assert list(bank.TOPICS) == re.findall(r"^<!-- topic: (\w+) -->$", text, re.M)
    for q in bank.QUESTIONS:
        for link in q.links:
            assert f"({link.href} \"{' '.join(link.tags)}\")" in text


def test_every_link_names_a_heading_of_its_chapter_above_the_cells_it_tags():
    """Issue 46.9: the quiz links the chapter section (JupyterLab shows headings, not cell tags)."""
    assert bank.check_links() == []
    q = next(q for q in bank.QUESTIONS if q.id == "timing-gpu")  # the page's
    assert [(l.notebook, l.anchor) for l in q.links] == [
        ("00_start_here.ipynb", "PyTorch-on-a-GPU:-devices,-.to()-and-asynchronous-execution")]
    assert bank.link_for("measure-00-sync-timing") == q.links[0]
    # the quiz's: at the heading's cell, which JupyterLab scrolls to in a notebook the link opens
    assert [l.href for l in bank.get("timing-gpu").links] == ["00_start_here.ipynb#cell-id=00-06"]
    assert bank.check_links(None, bank.translate_bank("en").questions) == []


def test_check_links_finds_a_heading_that_moved(tmp_path):
    for name in {l.notebook for q in bank.QUESTIONS for l in q.links}:
        (tmp_path / name).write_text((NB_DIR / name).read_text().replace(
            "## Out of memory at step 2", "## OOM at step 2"))
    problems = bank.check_links(tmp_path)
    assert problems and {p[0] for p in problems} == {q.id for q in bank.QUESTIONS if "measure-08-step2" in q.tags}
    assert any(p[1] == "measure-08-step2" for p in problems)


def test_markdown_escapes_html_in_questions():
    """A raw "<module" in a heading would be an HTML tag: the page escapes it, the bank reads the character."""
    q = bank.get("spawn-main")
    assert "<module" in q.question and "\\<module" in bank.to_markdown("loader")
    assert "&lt;module" in bank.to_html(q.question) and "<module" not in bank.to_html(q.question)


# ---- a malformed entry is refused, naming it ------------------------------------------------------------------

PAGE = (NB_DIR / "interview_questions.md").read_text()
FIRST = "### You wrap a CUDA matmul"
LINK = ('[00 · PyTorch on a GPU: devices, `.to()` and asynchronous execution](00_start_here.ipynb#PyTorch-on-a-GPU:-'
        'devices,-.to()-and-asynchronous-execution "measure-00-sync-timing")')
MALFORMED = {  # what breaks -> (old, new, question id, field, value) in the message
    "missing id": ("<!-- id: timing-gpu -->\n", "", None, "id", "None"),
    "bad id": ("<!-- id: timing-gpu -->", "<!-- id: Timing GPU -->", None, "id", "'Timing GPU'"),
    "duplicate id": ("<!-- id: flops-6n -->", "<!-- id: timing-gpu -->", "timing-gpu", "id", "'timing-gpu'"),
    "missing answer": (None, None, "timing-gpu", "answer", "None"),
    "missing measured-in": ("Measured in: " + LINK + "\n\n", "", "timing-gpu", "Measured in", "None"),
    "unknown chapter": (LINK, LINK.replace("[00 ·", "[42 ·"), "timing-gpu", "chapter", "'42'"),
    "wrong notebook": (LINK, LINK.replace("(00_start_here", "(01_measure_first"), "timing-gpu", "notebook",
                       "'01_measure_first.ipynb'"),
    "stale anchor": (LINK, LINK.replace("#PyTorch-on", "#Pytorch-on"), "timing-gpu", "anchor", "'Pytorch-on"),
    "tag of another chapter": (LINK, LINK.replace('"measure-00-', '"measure-01-'), "timing-gpu", "tag",
                               "'measure-01-sync-timing'"),
    "unknown drill": ('`lk.drills.Drill("sync-every-micro")`', '`lk.drills.Drill("sync-evry-micro")`', "no-sync",
                      "drill", "'sync-evry-micro'"),
    "drill the answer does not back": (None, None, "timing-gpu", "drill", "'sync-every-micro'"),
    "unknown topic key": ("<!-- topic: measure -->", "<!-- topic: Measure! -->", None, "topic", "'Measure!'"),
    "duplicate topic": ("<!-- topic: precision -->", "<!-- topic: measure -->", None, "topic", "'measure'"),
    "no </details>": ("line, so both ways agree there.\n\nMeasured in: " + LINK + "\n\n</details>",
                      "line, so both ways agree there.\n\nMeasured in: " + LINK + "\n\n", "timing-gpu", "</details>",
                      None),
}


def _broken(old, new):
    assert PAGE.count(old) >= 1, old
    return PAGE.replace(old, new, 1)


@pytest.mark.parametrize("kind", MALFORMED)
def test_a_malformed_entry_is_refused_naming_question_field_and_value(kind):
    old, new, qid, field, value = MALFORMED[kind]
    if kind == "missing answer":
        text = _section_answer_removed("timing-gpu")
    elif kind == "drill the answer does not back":  # a drill whose teaching cell this answer's links lack
        text = _broken('measure-00-sync-timing")\n\n</details>',
                       'measure-00-sync-timing")\n\nDrill it: `lk.drills.Drill("sync-every-micro")`\n\n</details>')
    else:
        text = _broken(old, new)
    with pytest.raises(bank.BankError) as err:
        bank.check_drills(bank.parse(text, "interview_questions.md")[1], CASES, "interview_questions.md")
    msg = str(err.value)
    assert isinstance(err.value, ConfigError) and re.match(r"interview_questions\.md(:\d+)?: ", msg), msg
    assert "is not allowed: " in msg and msg.split("is not allowed: ")[1].strip(), msg  # says what is allowed
    if qid:
        assert f"question {qid!r}" in msg, msg
    assert field is None or f"{field}=" in msg, msg
    assert value is None or value in msg, msg


def test_every_drill_the_bank_names_is_a_case_that_teaches_a_cell_the_answer_links():
    """The bank does not import the drills: the cross-check of its "Drill it" ids runs here, on the page as it is
    (a bad id fails the parametrized test above)."""
    assert any(q.drills for q in bank.QUESTIONS)
    bank.check_drills(bank.QUESTIONS, CASES)
    assert "labkit.drills" not in subprocess.run(
        [sys.executable, "-c", "import sys, labkit.content.questions; print(sorted(sys.modules))"],
        capture_output=True, text=True, check=True).stdout


def _section_answer_removed(qid):
    """The page with question ``qid``'s answer paragraphs deleted (its Measured in line kept)."""
    lines = PAGE.splitlines()
    at = lines.index(f"<!-- id: {qid} -->")
    first = at + 3  # heading, front matter, blank, <details>, blank, answer...
    while not lines[first].strip() or lines[first].startswith("<details>"):
        first += 1
    last = first
    while lines[last].strip():
        last += 1
    return "\n".join(lines[:first] + lines[last + 1:]) + "\n"


def test_the_page_parses_as_it_is():
    topics, qs = bank.parse(PAGE)
    assert topics == bank.TOPICS and qs == bank.QUESTIONS


# ---- an installed labkit reads the page its wheel carries ------------------------------------------------------

def test_the_quiz_works_from_an_installed_wheel(labkit_wheel, tmp_path):
    """The wheel carries notebooks/*.md under labkit/coursefiles/ (setup.py): the bank is read from there."""
    site = tmp_path / "site"
    zipfile.ZipFile(labkit_wheel).extractall(site)
    code = ("import labkit as lk, labkit.content.questions as b; q = lk.quiz.Quiz(); "
            "print(b.source_path()); print(len(q.questions), len(b.TOPICS))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    path, counts = out.stdout.split()[-3], out.stdout.split()[-2:]
    assert path == str(site / "labkit" / "coursefiles" / "notebooks" / "interview_questions.md")
    assert counts == [str(len(bank.QUESTIONS)), str(len(bank.TOPICS))]


# ---- the quiz widget ------------------------------------------------------------------------------------

def test_quiz_answer_then_reveal_then_mark():
    from labkit.content.quiz import Quiz

    quiz = Quiz(topic="precision")
    assert [q.topic for q in quiz.questions] == ["precision"] * len(bank.by_topic("precision"))
    first = quiz.question
    assert quiz._reveal.disabled                      # nothing written yet: no reveal
    assert quiz.reveal() == "" and first.id not in quiz.revealed
    assert quiz._note.value                            # ... and a note says why
    quiz.mark(True)                                    # cannot mark before revealing
    assert quiz.marks == {}
    quiz.write("bf16 has fp32's range")
    assert not quiz._reveal.disabled
    assert quiz.reveal() == first.answer
    assert f"href='{first.links[0].href}'" in quiz._answer.value and quiz._reveal.disabled
    assert "measure-" not in quiz._answer.value        # cell tags, which JupyterLab does not show, are not named
    quiz.mark(False)
    assert quiz.score()["not_yet"] == [first.id]
    quiz.next()
    assert quiz.index == 1 and quiz._box.value == "" and quiz._answer.value == ""
    quiz.previous()
    assert quiz._box.value == "bf16 has fp32's range" and first.links[0].href in quiz._answer.value
    s = quiz.score()
    assert s["written"] == 1 and s["revealed"] == 1 and s["right"] == 0
    quiz.go(999)
    assert quiz.index == len(quiz.questions) - 1 and quiz._next.disabled


def test_quiz_topics_shuffle_and_display():
    from labkit.content.quiz import Quiz

    a, b = Quiz(shuffle=True, seed=3), Quiz(shuffle=True, seed=3)
    assert [q.id for q in a.questions] == [q.id for q in b.questions]
    assert len(a.questions) == len(bank.QUESTIONS)
    a.write("something").reveal()
    a._topic.value = "ddp"                         # the drop-down switches topic, keeps answers
    assert {q.topic for q in a.questions} == {"ddp"} and len(a.revealed) == 1
    from test_widgets_display import assert_displays_as_widget  # as a cell's last line, on ipywidgets 7 and 8

    assert_displays_as_widget(a)
    assert "revealed" in repr(a)
    assert Quiz(questions=[bank.get("pareto")]).question.id == "pareto"


# ---- the instructor kit --------------------------------------------------------------------------------

def test_instructor_kit_names_every_checker_and_notebook():
    import labkit as lk

    kit = (NB_DIR / "README.md").read_text()
    missing = [n for n in lk.check.names() if f"`{n}`" not in kit]
    assert not missing, f"notebooks/README.md does not say whether to grade: {missing}"
    for path in sorted(NB_DIR.glob("*.ipynb")):
        assert f"({path.name})" in kit, f"the course map does not link {path.name}"


# ---- errata (issue 16): statements an interviewer would mark wrong must not come back -------------------

def _all_course_text():
    """Every answer in the bank and every cell of every chapter, as (where, text)."""
    yield from ((f"questions.py:{q.id}", q.answer) for q in bank.QUESTIONS)
    for path in sorted(NB_DIR.glob("0*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        yield from ((f"{path.name}:{c.get('id')}", c.source) for c in nb.cells)


def test_below_the_critical_batch_size_progress_is_per_token_not_per_step():
    """McCandlish et al. (2018): below the critical batch size a bigger batch reaches the same loss on the
    same tokens in fewer steps; progress is per *step* only above it. The clause after "below the critical
    batch size" (up to the next full stop, semicolon or "above") must not say per update/step."""
    clause = re.compile(r"below the \W?critical batch size\W?(.*?)(?:[.;]|\babove\b)", re.I | re.S)
    wrong = [(where, m.group(0)) for where, text in _all_course_text() for m in clause.finditer(text)
             if re.search(r"per \W?(update|step)", m.group(1), re.I)]
    assert not wrong, f"the critical batch size stated backwards: {wrong}"


def test_errata_answers_carry_the_corrections():
    answer = {q.id: q.answer for q in bank.QUESTIONS}
    assert "fewer steps" in answer["bigger-batch"] and "McCandlish" in answer["bigger-batch"]
    assert "rule of thumb" in answer["low-mfu"] and "measure-01-mfu-sweep" in bank.get("low-mfu").tags
    assert '`checkpointing="selective"`' in answer["checkpointing-choice"]
    assert '`checkpointing="attention"`' in answer["checkpointing-choice"]
    assert "synchronisation" in answer["buggy-loop"] and "NaN" in answer["buggy-loop"]
    assert "forward_sync_buffers" in answer["ddp-how"] and "no buffers" in answer["ddp-how"]
    assert "16" in answer["bytes-per-param"] and "20" in answer["bytes-per-param"]
    assert "PyTorch's default keeps full-fp32" in answer["which-peak"]
    for qid, tag in (("mfu-small-model", "measure-01-mfu-sweep"), ("oom-puzzles", "measure-04-memory-budget"),
                     ("debug-hang", "measure-06-ddp-two-procs"), ("fsdp-accumulation", "measure-09-fsdp"),
                     ("bus-bandwidth", "measure-06-ring-model")):
        assert tag in bank.get(qid).tags, qid
    assert "2(n−1)/n" in answer["bus-bandwidth"]
    assert "expandable_segments" in answer["oom-puzzles"] and "TORCH_NCCL_DUMP_ON_TIMEOUT" in answer["debug-hang"]
    assert "set_requires_gradient_sync(False)" in answer["fsdp-accumulation"]


# ---- errata (issue 23): the third round of corrections must not come back ---------------------------------

def test_bigger_batch_teaches_the_two_asymptotes_and_the_fit():
    """Issue 23.2: B_crit = E_min / S_min; both regimes are asymptotes; a larger batch costs data at every size,
    so one comparison at equal tokens cannot place it; B_crit is fitted over at least three batch sizes."""
    a = bank.get("bigger-batch").answer
    for words in ("B_crit = E_min/S_min", "(S/S_min − 1)(E/E_min − 1) = 1", "asymptotes", "k times fewer steps",
                  "k times the data", "twice the minimum", "at least three batch sizes", "McCandlish"):
        assert words in a, words
    assert "costs nothing" not in a and "above the critical batch size" not in a
    assert "measure-09-critical-batch" in bank.get("bigger-batch").tags


def test_accum_memory_says_the_peak_rises_from_k1_to_k2():
    """Issue 23.5: at K = 1 no .grad is alive during the forward (zero_grad(set_to_none=True)); from K = 2
    micro-batches 2..K run with every gradient alive: up to the gradient bytes more, then flat."""
    a = bank.get("accum-memory").answer
    assert "set_to_none=True" in a and "K = 1 to K = 2" in a and "gradient bytes" in a and "flat from there" in a
    assert "does not change" not in a


def test_activation_scale_lists_every_way_to_shrink_activations():
    """Issue 23.8: not only micro-batch, checkpointing and tensor/sequence parallelism."""
    a = bank.get("activation-scale").answer
    for words in ("context parallelism", "activation offload", "ZeRO-R", "checkpointing",
                  "tensor and sequence parallelism"):
        assert words in a, words


PIPELINE_SHRINKS = re.compile(r"pipeline parallelism \((?:each GPU holds )?fewer layers", re.I)


def test_pipeline_parallelism_is_not_taught_as_shrinking_the_peak_stages_activations():
    """Issue 23 review: under 1F1B the first stage holds p micro-batches × L/p layers = L layers' worth of one
    micro-batch, as without a pipeline (Korthikanti et al. 2022, §4.2.3); interleaving holds more. Pipeline
    parallelism shards weights and model state, not the first stage's activations."""
    a = " ".join(bank.get("activation-scale").answer.split())
    assert "does not reduce the first stage's activations" in a and "1F1B" in a and "1 + (p−1)/(p·m)" in a
    assert "shards the weights and model state" in a
    wrong = [where for where, text in _all_course_text() if PIPELINE_SHRINKS.search(" ".join(text.split()))]
    assert not wrong, f"pipeline parallelism taught as shrinking activations: {wrong}"
    nb = nbformat.read(str(NB_DIR / bank.CHAPTER_NOTEBOOKS["09"]), as_version=4)
    cell = " ".join(next(c for c in nb.cells if c.get("id") == "699c6f44").source.split())
    assert "does not reduce the first stage's activations" in cell and "1F1B" in cell


def test_accum_memory_does_not_say_activations_and_gradients_never_coexist_at_k1():
    """Issue 23 review: at K = 1 backward builds the gradients while activations are alive; what is true is that
    the forward, and the start of backward where the peak usually is, run with no .grad alive."""
    a = " ".join(bank.get("accum-memory").answer.split())
    assert "never coexist" not in a
    assert "at K = 1 the forward, and the start of backward where the peak usually is, run with no `.grad` alive" in a


def test_roofline_answer_matches_the_per_op_model():
    """Issue 23.9: predict.py sums a roofline per operation; the answer says so and why a per-group max leans fast."""
    from labkit import whatif as predict

    assert "roofline per operation" in predict.__doc__
    a = bank.get("roofline-whatif").answer
    assert "charges each operation" in a and "sums the operations" in a and "hide behind" in a
    assert "each group of operations" not in a


def test_arithmetic_intensity_does_not_cap_elementwise_ops_at_one_flop_per_byte():
    """Issue 23.14: tanh-GELU or exp in bf16 reach a few FLOP/byte; still far below the ~300 ridge."""
    a = bank.get("arithmetic-intensity").answer
    assert "stay below one FLOP per byte" not in a
    assert "tanh-GELU" in a and "a few FLOPs per byte" in a and "300 FLOP/byte ridge" in a


def test_no_answer_gives_bf16_three_significant_digits():
    """Issue 23.13: bf16's 8 significant bits are about 2.4 decimal digits ("two to three" is right)."""
    bad = re.compile(r"bf16[^.]*?(?<!to )\b(?:about )?(?:3|three) significant (?:decimal )?digits", re.I)
    assert not [q.id for q in bank.QUESTIONS if bad.search(q.answer)]
    assert "two to three significant digits" in bank.get("fp16-vs-bf16").answer


# Facts the chapters 10-11 answers quote, read from the torch that runs them.
def _answer(qid):
    return next(q for q in bank.QUESTIONS if q.id == qid).answer


def test_bank_quotes_the_timeouts_torch_defines():
    from torch.distributed.constants import default_pg_nccl_timeout, default_pg_timeout
    if default_pg_nccl_timeout is None:
        pytest.skip("this torch build has no NCCL")
    nccl, gloo = (int(t.total_seconds() // 60) for t in (default_pg_nccl_timeout, default_pg_timeout))
    text = _answer("rank-failure")
    assert f"{nccl} minutes for NCCL" in text and f"{gloo} for gloo" in text


def test_skipped_collective_answer_is_backed_by_the_drill_cell():
    q = next(q for q in bank.QUESTIONS if q.id == "skipped-collective")
    from labkit.drills import case_by_id
    assert case_by_id("rank-skips-collective").teaches in q.tags
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" in q.answer  # what shows per-rank sequence numbers


# ---- the bank in Russian (issue #51) ------------------------------------------------------------------------

def _ru_page(tmp_path, entries, topics=()):
    """A Russian page in tmp_path/ru with the built Russian chapter 00 beside it: ``entries`` {id: (hash,
    question, answer)}, ``topics`` {key: (hash, title)} (the format of notebooks/ru/interview_questions.md)."""
    from labkit.content import translate as tr
    ru = tmp_path / "ru"
    ru.mkdir()
    shutil.copy(NB_DIR / "ru" / "00_start_here.ipynb", ru)
    shutil.copy(NB_DIR / "01_measure_first.ipynb", tmp_path)  # the English chapter the links fall back to
    text = "# Вопросы\n\n<!--\nкомментарий\n-->\n\nВступление.\n"
    for key, (h, title) in dict(topics).items():
        text += f"\n## {title}\n<!-- topic: {key} @{h} -->\n"
        for qid, (qh, question, answer) in entries.items():
            if bank.QUESTIONS[[q.id for q in bank.QUESTIONS].index(qid)].topic == key:
                text += (f"\n### {question}\n<!-- id: {qid} @{qh} -->\n\n<details><summary>Ответ</summary>\n\n"
                         f"{answer}\n\n</details>\n")
    (ru / "interview_questions.md").write_text(text, encoding="utf-8")
    assert "interview_questions" in tr.CHAPTERS  # the notebook has a Russian build
    return ru / "interview_questions.md"


def _russian_bank(tmp_path, english_text=PAGE):
    from labkit.base.phrases import entry_hash
    english = bank.parse(english_text)
    en_q = {q.id: q for q in english[1]}
    page = _ru_page(tmp_path, {
        "timing-gpu": (bank.question_hash(en_q["timing-gpu"]), "Почему матмул на CUDA кажется мгновенным?",
                       "Вызовы CUDA асинхронны.\n\nВторой абзац."),
        "flops-6n": (bank.question_hash(bank.get("flops-6n")), "Сколько FLOPs?", "Около 6·N·D."),
    }, {"measure": (entry_hash("Measuring: timing, FLOPs, MFU and HFU"), "Измерения")})
    return page, english


def test_a_russian_entry_replaces_the_english_and_its_link_lands_on_the_russian_heading(tmp_path):
    page, english = _russian_bank(tmp_path)
    ed = bank.translate_bank("ru", page, english)
    q = {q.id: q for q in ed.questions}
    assert ed.topics["measure"] == "Измерения" and ed.topics["precision"] == english[0]["precision"]
    assert q["timing-gpu"].question == "Почему матмул на CUDA кажется мгновенным?"
    assert q["timing-gpu"].answer == "Вызовы CUDA асинхронны.\n\nВторой абзац."
    en = bank.get("timing-gpu")
    assert q["timing-gpu"].tags == en.tags and q["timing-gpu"].drills == en.drills
    link = q["timing-gpu"].links[0]
    assert (link.notebook, link.heading) == ("00_start_here.ipynb",
                                             "PyTorch на GPU: устройства, `.to()` и асинхронное выполнение")
    # JupyterLab scrolls to a cell id, not to a Cyrillic heading's anchor: the cell holding the heading
    cells = json.loads((page.parent / link.notebook).read_text(encoding="utf-8"))["cells"]
    held = next(c for c in cells if c["id"] == link.anchor.removeprefix("cell-id="))
    assert link.anchor.startswith("cell-id=") and held["cell_type"] == "markdown"
    assert "## " + link.heading in "".join(held["source"]) and link.href == f"{link.notebook}#{link.anchor}"
    # the check names a link whose cell holds another heading
    other = next(c["id"] for c in cells if c["cell_type"] == "markdown" and c["id"] != held["id"])
    moved = replace(q["timing-gpu"], links=(replace(link, anchor="cell-id=" + other),))
    assert [p[0] for p in bank.check_links(page.parent, [moved])] == ["timing-gpu"]
    # a chapter with no Russian build (01 is not in tmp_path/ru): the English chapter, its English heading
    assert [(l.notebook, l.anchor) for l in q["flops-6n"].links] == [
        ("../" + l.notebook, l.anchor) for l in bank.get("flops-6n").links]
    assert bank.check_links(page.parent, [q["timing-gpu"], q["flops-6n"]]) == []  # each lands: ru or en
    left = bank.untranslated("ru", page, english)
    assert ("question", "timing-gpu", "missing") not in left and ("topic", "measure", "missing") not in left
    assert ("question", "pareto", "missing") in left and ("topic", "precision", "missing") in left
    assert len([x for x in left if x[0] == "question"]) == len(english[1]) - 2


def test_a_stale_russian_entry_falls_back_to_english_with_a_warning_and_the_check_names_it(tmp_path, monkeypatch):
    from labkit.base import phrases
    edited = PAGE.replace("the GPU runs it later.", "the GPU runs it some time later.", 1)
    assert edited != PAGE
    page, english = _russian_bank(tmp_path, PAGE)
    new = bank.parse(edited)
    ed = bank.translate_bank("ru", page, new)
    stale = next(q for q in ed.questions if q.id == "timing-gpu")
    assert stale.question == bank.get("timing-gpu").question and "some time later" in stale.answer
    assert ed.left[("question", "timing-gpu")] == "stale" and ("question", "flops-6n") not in ed.left
    assert ("question", "timing-gpu", "stale") in bank.untranslated("ru", page, new)
    # what the quiz and the notebook call: Russian where translated, else English with one warning
    monkeypatch.setattr(phrases, "_chosen", ["ru"])
    monkeypatch.setattr(phrases, "_said", set())
    monkeypatch.setattr(bank, "_editions", {})
    monkeypatch.setattr(bank, "translation_path", lambda lang: page)
    monkeypatch.setattr(bank, "QUESTIONS", new[1])
    with pytest.warns(UserWarning, match="'timing-gpu' stale"):
        assert "some time later" in bank.get("timing-gpu").answer
    with pytest.warns(UserWarning, match="'pareto' not translated"):
        assert bank.get("pareto").question == next(q for q in new[1] if q.id == "pareto").question
    assert bank.get("flops-6n").question == "Сколько FLOPs?" and bank.TOPICS["measure"] == "Измерения"
    with pytest.warns(UserWarning, match="topic 'ddp' not translated"):
        assert bank.TOPICS["ddp"] == english[0]["ddp"]


def test_a_malformed_russian_entry_is_refused_naming_it(tmp_path):
    page, english = _russian_bank(tmp_path)
    text = page.read_text(encoding="utf-8")
    for old, new, field in ((" @", " @x", "id"), ("<details><summary>Ответ</summary>", "<details>", "answer"),
                            ("<!-- id: flops-6n", "<!-- id: flops-7n", "id")):
        page.write_text(text.replace(old, new, 1) if field != "id" or "7n" in new else
                        text.replace("<!-- id: timing-gpu @", "<!-- id: timing-gpu @z", 1), encoding="utf-8")
        with pytest.raises(bank.BankError, match=field):
            bank.translate_bank("ru", page, english)


def test_the_translate_check_names_the_missing_bank_entries(capsys):
    from labkit.content import translate as tr
    left = bank.untranslated("ru")
    tr.main(["--check"])
    out = capsys.readouterr().out
    assert f"{bank.FILE}: {len(left)} entr" in out
    for kind, key, why in left:
        assert f"{bank.FILE} {kind} {key}: {why}" in out


def test_the_quiz_speaks_russian_and_its_english_words_are_the_templates(monkeypatch):
    from labkit.base import phrases
    from labkit.content import pages, quiz as qz
    for piece, words in qz.TEMPLATE_WORDS.items():  # a Russian sentence replaces exactly this English
        for w in words:
            assert pages.section("quiz.md", piece).count(qz.WORDS.sentences[w]) == 1, (piece, w)
    english = qz.Quiz(topic="precision")
    english.write("x").reveal()
    monkeypatch.setattr(phrases, "_chosen", ["ru"])
    monkeypatch.setattr(phrases, "_said", set())
    monkeypatch.setattr(bank, "_editions", {})
    quiz = qz.Quiz(topic="precision")
    assert quiz._reveal.description == "Показать ответ" and "Вопрос 1 из" in quiz._header.value
    quiz.write("ответ").reveal()
    assert "Где это измерено:" in quiz._answer.value and "Measured in" not in quiz._answer.value
    assert quiz._answer.value.replace("Где это измерено:", "") != english._answer.value
