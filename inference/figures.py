"""Attention heatmaps (matplotlib, no display) with the tokens or words on the axes."""

from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # no display: render to images
import matplotlib.pyplot as plt  # noqa: E402
from torch import Tensor  # noqa: E402


def attention_figure(
    weights: Tensor, x_tokens: Sequence[str], y_tokens: Sequence[str], title: str, x_label: str, y_label: str
):
    """A heatmap of ``(len(y_tokens), len(x_tokens))`` weights with the tokens as tick labels."""
    rows, cols = len(y_tokens), len(x_tokens)
    width, height = max(4.0, 0.28 * cols + 1.8), max(3.0, 0.28 * rows + 1.4)
    fig, ax = plt.subplots(figsize=(width, height), dpi=100)
    image = ax.imshow(
        weights.float().numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest"
    )
    ax.set_xticks(range(cols))
    ax.set_xticklabels(x_tokens, rotation=90, fontsize=8)
    ax.set_yticks(range(rows))
    ax.set_yticklabels(y_tokens, fontsize=8)
    ax.set_xlabel(x_label, fontsize=9)
    ax.set_ylabel(y_label, fontsize=9)
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    fig.tight_layout()
    return fig
