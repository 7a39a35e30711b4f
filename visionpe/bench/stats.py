"""The benchmark's statistics: a cell's mean and spread over seeds, Welch's t-test on per-seed values, Holm's
correction across a claim's comparisons, the 95% interval of a difference, and the smallest difference a seed count
can detect (docs/benchmark.md)."""

from __future__ import annotations

import math
import statistics

ALPHA = 0.05  # one-sided level of every verdict, after Holm's correction
POWER = 0.8  # the power at which `detectable_difference` is quoted


def mean_std(values: list[float]) -> dict:
    """{'mean', 'std', 'n'} over seeds (sample std; 0 for one value)."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return dict(mean=statistics.fmean(values), std=sd, n=len(values))


def _t():
    try:
        from scipy.stats import t
    except ImportError:
        raise ImportError("the benchmark's statistics need SciPy: pip install 'visionpe[bench]'") from None
    return t


def welch(a: list[float], b: list[float]) -> dict:
    """Welch's test of mean(a) > mean(b): {'diff', 'se', 'df', 'p' (one-sided), 'ci95' (two-sided, of the diff)}.
    With no spread on either side the difference is exact: p is 0 (a ahead), 1 (behind) or 0.5 (equal)."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError("Welch's test needs at least two values per side")
    diff = statistics.fmean(a) - statistics.fmean(b)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return dict(diff=diff, se=0.0, df=math.inf, p=0.0 if diff > 0 else 1.0 if diff < 0 else 0.5, ci95=[diff, diff])
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))  # Welch-Satterthwaite
    t = _t()
    half = float(t.ppf(0.975, df)) * se
    return dict(diff=diff, se=se, df=df, p=float(t.sf(diff / se, df)), ci95=[diff - half, diff + half])


def holm(p: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given (the family: one claim's comparisons)."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    adjusted, running = [1.0] * len(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        adjusted[i] = running
    return adjusted


def detectable_difference(std: float, n: int, alpha: float = ALPHA) -> float | None:
    """The smallest true difference two models with `n` seeds each and seed spread `std` show at a one-sided
    p < alpha with probability POWER (alpha = ALPHA: before Holm's correction; ALPHA / m: the first step of Holm's
    over m comparisons); None with fewer than two seeds."""
    if n < 2:
        return None
    t, df = _t(), 2 * n - 2
    return float(t.ppf(1 - alpha, df) + t.ppf(POWER, df)) * std * math.sqrt(2 / n)
