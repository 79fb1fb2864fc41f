"""tests/output_rules.py: the reading rules conftest applies to every chapter cell nbval runs."""
from output_rules import problems


def _md(text):
    return [{"output_type": "display_data", "data": {"text/markdown": text, "text/plain": "<Markdown>"}}]


def test_a_wall_of_text_under_a_result_is_a_problem_and_a_table_is_not():
    wall = " ".join(["word"] * 200)  # ~1,000 characters: ten rendered lines
    assert any("prose block" in p for p in problems(_md(wall)))
    table = "\n".join(["| a | b |", "|---|---|"] + [f"| {i} | {'x' * 90} |" for i in range(30)])
    assert problems(_md(table)) == []
    assert problems(_md("A short verdict.")) == []


def test_provenance_and_stale_versions_are_problems():
    assert problems([{"output_type": "stream", "text": "verified on the 24.09 page"}])
    assert problems(_md("On torch 2.13 this raised."))
    assert problems(_md("On torch 2.13 this raised, and 2.14.1 traces it.")) == []


def test_code_shown_as_html_is_not_prose():
    assert problems([{"output_type": "display_data", "data": {"text/html": "<pre>" + "x " * 900 + "</pre>",
                                                              "text/plain": "x " * 900}}]) == []
