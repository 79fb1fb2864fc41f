"""Issue 46.18: chapter 09 showed a critical batch of 0 (interval 0-14) for runs in which batch 4 needed fewer
updates than batch 16, unexplained. The fit's verdict (``pb.fit_verdict``) says when a B_crit means something;
the table shows "not meaningful" (or a bound) instead of a number, and the chapter words each verdict. Planted
curves for each case."""
import pytest

from labkit.chapters import ch09_playbook as pb


def _curves(steps: dict, lr=1e-3, start=5.0, target=2.0):
    """Loss curves that fall linearly and cross ``target`` after exactly ``steps[b]`` updates."""
    out = {}
    for b, s in steps.items():
        drop = (start - target) / s
        out[b, lr] = [start - drop * i for i in range(int(2 * s) + 2)]
        out[b, lr * 3] = [start - drop / 2 * i for i in range(int(4 * s) + 2)]  # a slower lr: never the best
    return out


def _estimate(steps):
    return pb.critical_batch_estimate(_curves(steps), 2.0, resamples=0)


def test_a_larger_batch_needing_more_updates_is_not_meaningful():
    est = _estimate({4: 3.0, 16: 6.0, 64: 1.5})  # batch 16 needed more updates than batch 4
    assert est["ok"] and est["verdict"] == "not_falling"
    row = pb.critical_batch_rows([est])[0]
    assert row["b_crit"] == "not meaningful" and row["interval"] is None
    assert all(r["side"] is None for r in pb.batch_rows(est))  # no batch is placed against a meaningless fit


def test_a_trade_off_within_the_batches_is_fitted():
    s_min, e_min = 10.0, 200.0  # B_crit = 20, between the batches measured
    est = _estimate({b: s_min + e_min / b for b in (4, 16, 64)})
    assert est["verdict"] == "fitted" and est["b_crit"] == pytest.approx(20.0, rel=1e-6)
    assert pb.critical_batch_rows([est])[0]["b_crit"] == "20"


@pytest.mark.parametrize("steps, verdict, shown", [
    ({4: 40.0, 16: 10.0, 64: 2.5}, "beyond", "beyond 64"),     # updates fall like 1/B: B_crit past the largest
    ({4: 5.0, 16: 5.0, 64: 5.0}, "below", "below 4"),          # updates do not fall: B_crit under the smallest
])
def test_a_fit_outside_the_batches_measured_is_shown_as_a_bound(steps, verdict, shown):
    est = _estimate(steps)
    assert est["verdict"] == verdict and pb.critical_batch_rows([est])[0]["b_crit"] == shown


def test_an_unreached_target_has_no_estimate():
    curves = _curves({4: 3.0, 16: 2.0, 64: 1.5})
    est = pb.critical_batch_estimate(curves, -100.0, resamples=0)  # below every curve
    assert not est["ok"] and est["verdict"] == "unreached"


def test_the_chart_draws_a_fit_only_where_it_means_something():
    good = _estimate({b: 10.0 + 200.0 / b for b in (4, 16, 64)})
    bad = _estimate({4: 3.0, 16: 6.0, 64: 1.5})
    lines = lambda est: len(pb.critical_batch_chart([est]).axes[0].lines)  # noqa: E731
    assert lines(good) > 0 and lines(bad) == 0
