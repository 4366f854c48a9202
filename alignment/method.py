"""How word alignments are read from a model's cross-attention: a layer, heads and a reading.

A ``Method`` names which maps make the alignment (``alignment/forced.py`` applies it):

- the **layer**: one (1-based) or the mean of all decoder layers;
- the **heads**: some (1-based) or the mean of all;
- the **reading**: which decoder step stands for a target piece. ``predict`` takes the step that
  predicts it (its input is the piece before); ``read`` the step after, whose input is the piece.

No torch here: ``translate.py`` checks its ``--align-*`` flags before the heavy imports.
"""

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

READINGS = ("predict", "read")


@dataclass(frozen=True)
class Method:
    """Which maps make a word alignment: ``layer`` (1-based; None: the mean of all layers),
    ``heads`` (1-based; None: the mean of all heads) and the ``reading`` (``READINGS``)."""

    layer: Optional[int] = None
    heads: Optional[Tuple[int, ...]] = None
    reading: str = "predict"

    def __post_init__(self) -> None:
        if self.reading not in READINGS:
            raise ValueError(f"alignment reading {self.reading!r}: choose predict or read")
        if self.layer is not None and self.layer < 1:
            raise ValueError(f"alignment layer {self.layer}: layers count from 1")
        if self.heads is not None and self.layer is None:
            raise ValueError(
                "alignment heads without a layer: head h of one layer has nothing to do with head h of "
                "another; give the layer too (--align-layer N)"
            )
        if self.heads is not None and (not self.heads or min(self.heads) < 1):
            raise ValueError(f"alignment heads {','.join(map(str, self.heads))}: heads count from 1")

    @property
    def label(self) -> str:
        """``"layer 2, head 3, read"``, ``"all layers, all heads, predict"``."""
        layer = "all layers" if self.layer is None else f"layer {self.layer}"
        if self.heads is None:
            heads = "all heads"
        else:
            heads = ("head " if len(self.heads) == 1 else "heads ") + ",".join(map(str, self.heads))
        return f"{layer}, {heads}, {self.reading}"

    def check(self, n_layers: int, n_heads: int) -> None:
        """A one-line ``ValueError`` when the model has no such layer or head."""
        if self.layer is not None and self.layer > n_layers:
            raise ValueError(f"alignment layer {self.layer}: the model has {n_layers} decoder layer(s)")
        if self.heads is not None and max(self.heads) > n_heads:
            heads = ",".join(map(str, self.heads))
            raise ValueError(f"alignment heads {heads}: the model has {n_heads} head(s) per layer")


def parse_method(layer: str, heads: str, reading: str) -> Method:
    """The command line's ``--align-layer all|N``, ``--align-heads all|N[,N...]``, ``--align-reading``."""
    try:
        n_layer = None if layer == "all" else int(layer)
        head_ids = None if heads == "all" else tuple(int(h) for h in heads.split(","))
    except ValueError:
        raise ValueError(
            f"--align-layer {layer} --align-heads {heads}: give 'all' or numbers from 1 (heads: 1,3)"
        ) from None
    return Method(n_layer, head_ids, reading)


def every_method(n_layers: int, n_heads: int) -> List[Method]:
    """Each head of each layer and the mean of the layer's heads, and the mean of every map, under
    both readings. (Head ``h`` of one layer has nothing to do with head ``h`` of another, so no mean
    runs over one head number across the layers.)"""
    per_layer: List[Tuple[Optional[int], Optional[Tuple[int, ...]]]] = []
    for layer in range(1, n_layers + 1):
        per_layer += [(layer, (h,)) for h in range(1, n_heads + 1)] if n_heads > 1 else []
        per_layer.append((layer, None))
    if n_layers > 1:
        per_layer.append((None, None))
    return [Method(layer, heads, reading) for reading in READINGS for layer, heads in per_layer]


# The alignment method when none is chosen (translate.py --alignments, the Translator): the one with
# the lowest AER on the dev part (the first 100 pairs) of the German-English human gold set for each
# family's default recipe (Multi30k de->en, docs/alignment.md), which is the same for both: the mean
# of every cross-attention map at the predicting step (the RNN has one map).
DEFAULT_METHOD = Method(reading="predict")


def supervised_method(model_cfg: Any) -> Method:
    """The heads guided alignment trains in a model of ``model_cfg`` (``model.alignment_layer``, the
    first ``model.alignment_heads`` heads), read at the predicting step, where the loss reads them."""
    from models.config import alignment_layer

    heads = tuple(range(1, model_cfg.alignment_heads + 1))
    return Method(alignment_layer(model_cfg), heads, "predict")


def default_method(model_cfg: Any, guided: bool) -> Method:
    """How a model aligns when no method is chosen: by its supervised heads when it was trained with
    guided alignment (``guided``), else by ``DEFAULT_METHOD``."""
    return supervised_method(model_cfg) if guided else DEFAULT_METHOD
