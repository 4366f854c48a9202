"""The figure ``comparison.png``: validation BLEU against training minutes and against epochs, per
group of seeds (matplotlib, imported when drawn).
"""

from pathlib import Path
from typing import Dict, List, Optional, Sequence

from common.files import AtomicFile
from comparison.curves import AXES, Curves, group_curves, mean_curve
from comparison.runs import Run, group_labels


def figure(groups: Sequence[List[Run]], curves: Dict[Path, Optional[Curves]]):
    """The figure of ``comparison.png``: validation BLEU against training minutes and against
    epochs; per group the mean over its seeds (``mean_curve``: only where every seed has data) with
    a band from the lowest to the highest and each seed's evaluations as dots, a group of one run as
    its curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, panels = plt.subplots(1, 2, figsize=(12, 4.8), dpi=100)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    banded = False
    for g, (group, label) in enumerate(zip(groups, group_labels(groups))):
        color = colors[g % len(colors)]
        found = group_curves(group, curves)
        for ax, axis in zip(panels, AXES):
            points = [c[axis] for c in found if c[axis][0]]
            if not points:
                continue
            if len(points) == 1:
                ax.plot(*points[0], color=color, marker="o", markersize=3, label=f"{label} (one run)")
                continue
            xs, means, lows, highs = mean_curve(points)
            if xs:  # the span every seed has data for (one x: a point)
                mean = f"{label} (mean of {len(points)} seeds)"
                ax.plot(xs, means, color=color, marker="o" if len(xs) == 1 else None, label=mean)
                ax.fill_between(xs, lows, highs, color=color, alpha=0.2, linewidth=0)
                banded = True
            # each seed's evaluations, in the legend only when there is no mean
            alone = None if xs else f"{label} ({len(points)} seeds, no span they all reached)"
            every = [(x, y) for p in points for x, y in zip(*p)]
            ax.plot(*zip(*every), "o", color=color, markersize=2.5, alpha=0.6, label=alone)  # no line
    panels[0].set_xlabel("training time (minutes, evaluations included)", fontsize=11)
    panels[1].set_xlabel("epochs", fontsize=11)
    for ax in panels:
        ax.set_ylabel("validation BLEU (greedy)", fontsize=11)
        ax.tick_params(labelsize=10)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=10, loc="lower right")
    bands = (
        ": mean over seeds and band from the lowest to the highest seed where every seed has data"
        if banded
        else ""
    )
    fig.suptitle(f"Validation BLEU{bands}", fontsize=12)
    fig.tight_layout()
    return fig


def plot(groups: Sequence[List[Run]], curves: Dict[Path, Optional[Curves]], path: Path) -> None:
    """Write ``figure`` to ``path`` (PNG)."""
    import matplotlib.pyplot as plt

    fig = figure(groups, curves)
    with AtomicFile(path, "wb") as out:
        fig.savefig(out, format="png")
    plt.close(fig)
