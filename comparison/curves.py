"""Validation curves: each run's validation BLEU against training minutes and against epochs, read
from its TensorBoard events, the value of a curve at any point (interpolated, never extrapolated),
and the mean, lowest and highest of several runs' curves where every run has data.
"""

import bisect
import functools
import statistics
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from comparison.runs import Run
from comparison.statistics import EPS

AXES = ("minutes", "epochs")  # the x axes of validation curves
Points = Tuple[List[float], List[float]]  # (x of each evaluation, increasing; its validation BLEU)
Curves = Dict[str, Points]  # one run's validation BLEU against each of AXES


@functools.lru_cache(maxsize=None)
def run_events(folder: Path):
    """The scalars of the TensorBoard events in ``folder/tb``, read once a report (the curves and
    the learning-rate tables both read them); None without events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not (folder / "tb").is_dir():
        return None
    events = EventAccumulator(str(folder / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    return events


def bleu_curve(run: Run) -> Optional[Tuple[List[int], List[float], List[float]]]:
    """``(steps, minutes, valid BLEU)`` of every evaluation, from the run's TensorBoard events."""
    events = run_events(run.path)
    if events is None:
        return None
    tags = set(events.Tags().get("scalars", []))
    if "valid/bleu" not in tags:
        return None
    bleu = {
        e.step: e.value for e in events.Scalars("valid/bleu")
    }  # a resumed run logs a step again: keep the last
    if "valid/train_seconds" in tags:
        seconds = {e.step: e.value for e in events.Scalars("valid/train_seconds")}
    else:  # older runs: wall-clock time since the first event
        first = min(e.wall_time for tag in tags for e in events.Scalars(tag))
        seconds = {e.step: e.wall_time - first for e in events.Scalars("valid/bleu")}
    steps = sorted(s for s in bleu if s in seconds)
    return steps, [seconds[s] / 60 for s in steps], [bleu[s] for s in steps]


def _increasing(xs: Sequence[Optional[float]], ys: Sequence[float]) -> Points:
    """The points with a known x, sorted by x (stable: a later evaluation at the same x comes last)."""
    points = sorted(((x, y) for x, y in zip(xs, ys) if x is not None), key=lambda point: point[0])
    return [x for x, _ in points], [y for _, y in points]


def run_curves(run: Run) -> Optional[Curves]:
    """The run's validation BLEU against training minutes and against epochs (``bleu_curve``; the
    epoch of each evaluation's step from ``valid_history`` in results.json: train.py logs no epoch
    scalar), or None without events."""
    curve = bleu_curve(run)
    if curve is None:
        return None
    steps, minutes, bleu = curve
    epoch_of = {h["step"]: h["epoch"] for h in run.results.get("valid_history") or [] if "epoch" in h}
    return {
        "minutes": _increasing(minutes, bleu),
        "epochs": _increasing([epoch_of.get(s) for s in steps], bleu),
    }


def group_curves(group: Sequence[Run], curves: Dict[Path, Optional[Curves]]) -> List[Curves]:
    """The curves of the group's runs that have one (``curves``: ``run_curves`` by run path)."""
    return [curves[run.path] for run in group if curves.get(run.path) is not None]


def value_at(points: Points, x: float) -> Optional[float]:
    """Validation BLEU at ``x``, linearly interpolated between the evaluations around it; None
    before the first evaluation and after the last (not reached: no extrapolation)."""
    xs, ys = points
    if not xs or x < xs[0] - EPS or x > xs[-1] + EPS:
        return None
    i = bisect.bisect_right(xs, x + EPS) - 1  # the last evaluation at or before x
    if xs[i] >= x - EPS:
        return ys[i]
    return ys[i] + (ys[i + 1] - ys[i]) * (x - xs[i]) / (xs[i + 1] - xs[i])


def mean_curve(points: Sequence[Points]) -> Tuple[List[float], List[float], List[float], List[float]]:
    """``(x, mean, lowest, highest)`` over the runs' curves, on the span every run has data for: from
    the latest first evaluation to the earliest last one (empty lists when the runs share none).

    Outside that span a mean would be over fewer runs, and it would jump where a run starts or
    stops (a weak seed ending early lifts the mean at once). Inside it the grid is every evaluation
    of any run; between two neighbours every run is linear, so the mean is drawn exactly by its two
    ends (the lowest and highest only approximately: where two runs cross inside an interval the
    band is a little narrow). A span of one x: its point.
    """
    start, end = max(xs[0] for xs, _ in points), min(xs[-1] for xs, _ in points)
    if start > end + EPS:
        return [], [], [], []
    grid: List[float] = []
    for x in sorted({start, end, *(x for xs, _ in points for x in xs if start <= x <= end)}):
        if not grid or x - grid[-1] > EPS:
            grid.append(x)
    rows = []
    for x in grid:
        values = [value_at(p, x) for p in points]
        rows.append((x, statistics.fmean(values), min(values), max(values)))
    xs, means, lows, highs = (list(column) for column in zip(*rows))
    return xs, means, lows, highs
