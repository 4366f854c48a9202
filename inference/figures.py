"""Attention heatmaps (matplotlib, no display) with the tokens or words on the axes, sized to be
read where they are shown.

TensorBoard's Images tab scales every image down to the width of its card, so a figure's width
and its fonts follow from that width (``CARD_WIDTH_PX``), not from fixed points: the figure is
drawn at ``PIXELS_PER_CARD_PIXEL`` times the card's width with labels that come out
``LABEL_PX`` high on the screen. A long sentence makes the figure taller (one label per row,
always) and labels every k-th column when the columns cannot all have a readable label; text never
gets smaller. A figure that is a file of its own (``translate.py --plot``) grows wide instead and
labels every column. The attention viewer's tab (``viewer/``) shows every label of any length.

``alignment_grid_figure`` is ``scripts/align.py``'s figure: each alignment method's AER, layers by heads.
"""

import io
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from alignment.method import READINGS, Method

if TYPE_CHECKING:  # no torch here: a process that only draws (training/drawing.py) never loads it
    from torch import Tensor

CARD_WIDTH_PX = 290  # an image card of TensorBoard 2.21's Images tab, in a 1600 x 1200 window
PIXELS_PER_CARD_PIXEL = 2  # image pixels per screen pixel of the card: sharp on dense screens too
LABEL_PX = 10  # the height of a label on the screen: the smallest that reads well
DPI = 100
LINE = 1.3  # the distance between two row labels, in label heights
COLUMN_LINE = 1.1  # between two (rotated) column labels
CHAR = 0.6  # the mean width of a character, in label heights (DejaVu Sans)
PLOT_SHARE = 0.6  # of the figure's width at least, left to the map beside y labels and colour bar


@dataclass(frozen=True)
class Layout:
    """A heatmap's size in inches (at ``DPI``), its font size in points, and which columns get a
    label (every ``x_step``-th)."""

    width: float
    height: float
    font_pt: float
    x_step: int


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display: render to images), imported when a
    figure is first drawn: a run that draws none starts half a second sooner."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def layout(rows: int, cols: int, longest_x: int, card_px: Optional[int] = CARD_WIDTH_PX) -> Layout:
    """The layout of a ``rows`` x ``cols`` map whose longest column label has ``longest_x``
    characters, for a card ``card_px`` pixels wide; ``card_px`` None: a figure of its own (a file
    of ``translate.py --plot``), as wide as every column's label needs, at least a card's width."""
    font_px = LABEL_PX * PIXELS_PER_CARD_PIXEL  # on the image
    pitch = font_px * LINE
    columns_px = cols * font_px * COLUMN_LINE / PLOT_SHARE  # the width that labels every column
    width_px = (card_px or CARD_WIDTH_PX) * PIXELS_PER_CARD_PIXEL
    if card_px is None:
        width_px = max(width_px, math.ceil(columns_px))
    x_step = max(1, math.ceil(columns_px / width_px))
    # the map's rows, the rotated column labels below it, and the title and axis labels
    height_px = max(rows, 4) * pitch + longest_x * CHAR * font_px + 5 * pitch
    return Layout(width_px / DPI, height_px / DPI, font_px * 72 / DPI, x_step)


def attention_figure(
    weights: Union["Tensor", np.ndarray],
    x_tokens: Sequence[str],
    y_tokens: Sequence[str],
    title: str,
    x_label: str,
    y_label: str,
    card_px: Optional[int] = CARD_WIDTH_PX,
):
    """A heatmap of ``(len(y_tokens), len(x_tokens))`` weights with the tokens as tick labels,
    readable in a card ``card_px`` pixels wide, or with every column labelled when it is None
    (``layout``)."""
    rows, cols = len(y_tokens), len(x_tokens)
    size = layout(rows, cols, max((len(t) for t in x_tokens), default=1), card_px)
    fig, ax = pyplot().subplots(figsize=(size.width, size.height), dpi=DPI)
    values = np.asarray(weights.float() if hasattr(weights, "float") else weights, dtype=np.float32)
    image = ax.imshow(values, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    shown = range(0, cols, size.x_step)
    ax.set_xticks(list(shown))
    ax.set_xticklabels([x_tokens[i] for i in shown], rotation=90, fontsize=size.font_pt)
    ax.set_yticks(range(rows))
    ax.set_yticklabels(y_tokens, fontsize=size.font_pt)
    every = f" (every {size.x_step})" if size.x_step > 1 else ""
    ax.set_xlabel(x_label + every, fontsize=size.font_pt)
    ax.set_ylabel(y_label, fontsize=size.font_pt)
    ax.set_title(title, fontsize=size.font_pt, wrap=True)
    bar = fig.colorbar(image, ax=ax, fraction=0.05, pad=0.02)
    bar.ax.tick_params(labelsize=size.font_pt * 0.8)
    fig.tight_layout()
    return fig


def png_of(fig) -> Tuple[bytes, int, int]:
    """The figure as PNG bytes, with its height and width in pixels; the figure is closed."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=fig.dpi)
    width, height = (round(v) for v in fig.get_size_inches() * fig.dpi)
    pyplot().close(fig)
    return buffer.getvalue(), height, width


def alignment_grid_figure(grid: Mapping[Method, Any], title: str):
    """AER on the dev part of every method (``grid``: ``alignment.evaluation.Scored`` by method):
    one panel per reading, rows the layers (then the mean of all), columns the heads (then their mean)."""
    layers = sorted({m.layer for m in grid if m.layer is not None}) + [None] * any(
        m.layer is None for m in grid
    )
    heads = sorted({m.heads for m in grid if m.heads is not None}) + [None]
    fig, axes = pyplot().subplots(
        1, len(READINGS), figsize=(3 + 1.6 * len(heads) * len(READINGS), 2 + 0.7 * len(layers))
    )
    aer = {(m.layer, m.heads, m.reading): 100 * scored.dev.aer for m, scored in grid.items()}
    for ax, reading in zip(axes, READINGS):
        # no method averages one head number over the layers: those cells stay empty
        values = [[aer.get((layer, head, reading), float("nan")) for head in heads] for layer in layers]
        image = ax.imshow(values, cmap="viridis_r", aspect="auto")
        for r, row in enumerate(values):
            for c, value in enumerate(row):
                if value == value:  # not an empty cell
                    ax.text(c, r, f"{value:.1f}", ha="center", va="center", color="white", fontsize=9)
        ax.set_xticks(range(len(heads)))
        ax.set_xticklabels(["mean" if h is None else ",".join(map(str, h)) for h in heads])
        ax.set_yticks(range(len(layers)))
        ax.set_yticklabels(["mean" if layer is None else str(layer) for layer in layers])
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(f"{reading} step")
        fig.colorbar(image, ax=ax, fraction=0.05, pad=0.02, label="AER (dev), lower is better")
    fig.suptitle(title)
    fig.tight_layout()
    return fig
