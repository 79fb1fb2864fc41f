"""lk.course.compare_prediction with a number, a set of names and a choice: what it says, and a clear error for
a prediction of the wrong kind."""
import pytest

import labkit as lk
import labkit.chapters.course  # noqa: F401
from labkit.base.runtime import ConfigError
from labkit.chapters import course


@pytest.fixture
def said(monkeypatch):
    out = []
    monkeypatch.setattr(course, "say", out.append)
    monkeypatch.setattr(course, "_nudged", False)  # a fresh kernel session: nothing said yet
    return out


def test_a_set_prediction_names_what_was_left_out_and_what_was_not_needed(said):
    assert course.compare_prediction({"model", "optimizer"}, {"model", "loader"}, "items") is None
    assert "Missing: loader" in said[-1] and "extra: optimizer" in said[-1]
    assert "**model, optimizer**" in said[-1]  # the learner's own guess is repeated
    course.compare_prediction(["loader", "model"], frozenset({"model", "loader"}), "items")
    assert "exactly" in said[-1]
    course.compare_prediction(None, {"model"}, "items")
    assert course.NUDGE in said[-1]
    with pytest.raises(ConfigError, match="a set of names"):
        course.compare_prediction("model", {"model"}, "items")


def test_a_choice_prediction_is_right_or_not_whatever_its_case(said):
    course.compare_prediction(" Rollback", "rollback", "action")
    assert said[-1].endswith("right.")
    course.compare_prediction("skip", "rollback", "action")
    assert "not this time" in said[-1]
    with pytest.raises(ConfigError, match="a word for action"):
        course.compare_prediction(3, "rollback", "action")


def test_a_number_prediction_still_compares_within_the_tolerance(said):
    course.compare_prediction(1.1, 1.0, "x")
    assert "close" in said[-1]
    course.compare_prediction(2.0, 1.0, "x")
    assert "off by more than" in said[-1]
    with pytest.raises(ConfigError):
        course.compare_prediction("2", 1.0, "x")


def test_the_advice_to_predict_first_is_said_once_per_kernel_session(said):
    """Issue 46 item 19: a chapter leaves many predictions empty; the advice comes with the first one only,
    whatever kind of prediction it is (number, set or choice)."""
    course.compare_prediction(None, 3.0, "a number")
    course.compare_prediction(None, {"model"}, "items")
    course.compare_prediction(Ellipsis, "skip", "action")
    course.compare_prediction(None, 4.0, "another number")
    assert [course.NUDGE in s for s in said] == [True, False, False, False]
    assert all(s.startswith("**") and "measured" in s for s in said)  # the measured figure is still said each time


def test_a_count_with_tolerance_zero_is_right_only_when_exact(said):
    """8 AllGathers predicted for 10 measured is a miscount, not 'close' (chapter 12's counts)."""
    course.compare_prediction(8, 10, "AllGathers", tolerance=0)
    assert "close" not in said[-1] and "not exact" in said[-1]
    course.compare_prediction(10, 10, "AllGathers", tolerance=0)
    assert "exactly right" in said[-1]
    course.compare_prediction(0, 0, "drops", tolerance=0)
    assert "exactly right" in said[-1]
    course.compare_prediction(8, 10, "AllGathers")  # the default tolerance is unchanged
    assert "close" in said[-1]
    with pytest.raises(ConfigError, match="tolerance"):
        course.compare_prediction(8, 10, "AllGathers", tolerance=-0.1)


def test_whole_numbers_are_echoed_in_full_and_floats_as_before(said):
    import numpy as np
    course.compare_prediction(131072, np.int64(131072), "bytes", tolerance=0)
    assert "**131,072**" in said[-1] and "131,000" not in said[-1]
    course.compare_prediction(131072.0, 6120.4, "x")  # floats keep the course's three digits
    assert "**131,000**" in said[-1] and "**6,120**" in said[-1]
