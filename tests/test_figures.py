"""Attention heatmaps (inference/figures.py): readable at the width TensorBoard's Images card shows them."""

import pytest
import torch

from inference.figures import (
    CARD_WIDTH_PX,
    DPI,
    LABEL_PX,
    LINE,
    PIXELS_PER_CARD_PIXEL,
    attention_figure,
    layout,
)


def screen_px(points: float) -> float:
    """The height on the screen of text of ``points`` once the image is scaled to the card's width."""
    return points * DPI / 72 / PIXELS_PER_CARD_PIXEL


def test_a_figure_is_the_cards_width_and_its_labels_are_readable_there():
    tokens = [f"▁word{i}" for i in range(12)]
    fig = attention_figure(torch.rand(10, 12), tokens, tokens[:10], "title", "source", "output")
    width, _ = fig.get_size_inches() * DPI
    assert width == CARD_WIDTH_PX * PIXELS_PER_CARD_PIXEL
    ax = fig.axes[0]
    labels = ax.get_xticklabels() + ax.get_yticklabels()
    assert [t.get_text() for t in ax.get_xticklabels()] == tokens  # every column labelled
    assert all(screen_px(t.get_fontsize()) >= LABEL_PX for t in labels)


def test_a_long_sentence_makes_the_figure_taller_never_the_text_smaller():
    short, long = layout(10, 10, 8), layout(60, 64, 8)
    assert long.font_pt == short.font_pt and long.width == short.width
    # every one of the 50 more rows adds a row label's height and its spacing
    assert long.height - short.height == pytest.approx(50 * LABEL_PX * PIXELS_PER_CARD_PIXEL * LINE / DPI)
    assert long.x_step > 1  # 64 columns cannot all be labelled in the card's width: every k-th is
    fig = attention_figure(
        torch.rand(60, 64), [f"s{i}" for i in range(64)], [f"o{i}" for i in range(60)], "t", "x", "y"
    )
    ax = fig.axes[0]
    assert len(ax.get_yticklabels()) == 60
    assert len(ax.get_xticklabels()) == len(range(0, 64, long.x_step))


def test_a_wider_card_gives_a_wider_figure_with_the_same_text():
    assert layout(10, 10, 8, card_px=400).width > layout(10, 10, 8).width
    assert layout(10, 10, 8, card_px=400).font_pt == layout(10, 10, 8).font_pt


def test_a_figure_of_its_own_labels_every_column_however_many():
    """translate.py --plot: no card to fit, so a long sentence makes the figure wider instead."""
    words = [f"w{i}" for i in range(64)]
    fig = attention_figure(torch.rand(5, 64), words, words[:5], "t", "x", "y", card_px=None)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == words
    assert layout(5, 64, 3, card_px=None).width > layout(5, 64, 3).width
    assert layout(5, 4, 3, card_px=None).width == layout(5, 4, 3).width  # a short one: a card's width
