"""An exact, distribution-free interval for the ratio of two arms' timings, valid at any sample size.

``compare.verdict`` uses it below a comparison's ``min_repeats``, where a percentile bootstrap of
medians (four values whose medians take a handful of values) gives a "95 %" interval narrower than
95 %. Under the model "b's timings are a's scaled by some factor r", the m x n ratios b_j / a_i,
sorted, hold r between their k-th smallest and k-th largest with a probability read exactly from the
Mann-Whitney null distribution -- no normality, no resampling.

    low, high, level = ratio_interval([1.0, 1.1, 0.9, 1.0], [3.0, 3.1, 2.9, 3.2])   # 4 + 4 runs
    # (2.64, 3.56, 0.971): the smallest and largest ratio, at 1 - 2/70 = 97.1 % (70 = C(8, 4))

Three runs per arm cannot reach 95 % at all (the best is 1 - 2/20 = 90 %): ``ratio_interval`` is None.
"""
from __future__ import annotations

from functools import lru_cache
from math import comb

LEVEL = 0.95


@lru_cache(maxsize=256)
def null_counts(m: int, n: int) -> tuple:
    """How many of the C(m + n, m) orderings of m a's and n b's give each Mann-Whitney count U = 0 .. m*n
    (U: pairs with the b below the a). The coefficients of the Gaussian binomial [m + n, m]_q, built as
    the product over i = 1..m of (1 - q^(n+i)) / (1 - q^i); every step stays a polynomial."""
    poly = [1]
    for i in range(1, m + 1):
        grown = poly + [0] * (n + i)
        for j, c in enumerate(poly):  # times (1 - q^(n+i))
            grown[j + n + i] -= c
        for j in range(i, len(grown)):  # divided by (1 - q^i): a running sum with stride i
            grown[j] += grown[j - i]
        poly = grown[:m * n + 1]
    return tuple(poly)


def depth(m: int, n: int, level: float = LEVEL):
    """(k, confidence): the k-th smallest and k-th largest of the m*n ratios bound a ``level`` interval
    whose exact confidence is ``confidence`` (>= level); None when no k reaches ``level``."""
    counts, total = null_counts(m, n), comb(m + n, m)
    tail, k, cumulative = (1 - level) / 2, 0, 0
    while k < len(counts) and (cumulative + counts[k]) / total <= tail:
        cumulative += counts[k]
        k += 1
    if k == 0:
        return None
    return k, 1 - 2 * cumulative / total


def ratio_interval(samples_a, samples_b, level: float = LEVEL):
    """(low, high, confidence) for the ratio of b's timings to a's, or None when the samples are too few
    for ``level`` (fewer than 4 per arm for 95 %) or not all positive."""
    a, b = [float(x) for x in samples_a], [float(x) for x in samples_b]
    if not a or not b or min(a) <= 0 or min(b) <= 0:
        return None
    found = depth(len(a), len(b), level)
    if found is None:
        return None
    k, confidence = found
    ratios = sorted(y / x for x in a for y in b)
    return ratios[k - 1], ratios[-k], confidence


def fewest_runs(level: float = LEVEL) -> int:
    """The fewest runs per arm (both arms alike) for which a ``level`` interval exists: 4 for 95 %."""
    n = 1
    while depth(n, n, level) is None:
        n += 1
    return n
