"""TensorBoard output of a run: scalars, attention heatmaps, sample translations, hparams.

Attention images are matplotlib figures (``add_figure``) with the real subword tokens on both
axes, one colour scale (0 to 1) for every image, and a title naming the sentence, the kind of
attention, the layer and the head. Tags sort naturally in TensorBoard's list::

    attention/sent0/cross                      RNN: additive attention
    attention/sent0/cross_layer1_mean ...      Transformer: every decoder layer, heads averaged
    attention/sent0/cross_layer3_head1 ...     Transformer: every head of the last decoder layer
    attention/sent0/encoder_self_layer3_mean   Transformer: last encoder layer
"""
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from torch import Tensor
from torch.utils.tensorboard import SummaryWriter

from training.figures import attention_figure


def _index(i: int, count: int) -> str:
    """``i`` (0-based) zero-padded to the width of ``count`` so that tags sort naturally."""
    return str(i).zfill(len(str(count - 1)))


def attention_maps(attention: Mapping[str, Any], n_sentences: int) -> Iterator[Tuple[int, str, str, str, Tensor]]:
    """``(sentence, tag suffix, title part, kind, weights)`` for every image of one batch of attention.

    ``attention`` is a model's ``forward(..., need_weights=True)`` output: ``cross`` as ``(B, T, S)``
    (RNN) or per-layer lists ``cross`` ``[(B, H, T, S)]`` and ``encoder_self`` ``[(B, H, S, S)]``.
    ``kind`` is ``cross`` (target by source) or ``encoder_self`` (source by source).
    """
    cross = attention["cross"]
    for b in range(n_sentences):
        if isinstance(cross, Tensor):  # one additive attention
            yield b, "cross", "additive attention", "cross", cross[b]
            continue
        layers = len(cross)
        for layer, weights in enumerate(cross):
            name = _index(layer + 1, layers + 1)
            yield b, f"cross_layer{name}_mean", f"cross-attention, layer {layer + 1}, mean of heads", "cross", weights[b].mean(0)
        last = cross[-1][b]  # (H, T, S)
        for head in range(last.size(0)):
            tag = f"cross_layer{_index(layers, layers + 1)}_head{_index(head + 1, last.size(0) + 1)}"
            yield b, tag, f"cross-attention, layer {layers}, head {head + 1}", "cross", last[head]
        encoder = attention["encoder_self"]
        tag = f"encoder_self_layer{_index(len(encoder), len(encoder) + 1)}_mean"
        yield b, tag, f"encoder self-attention, layer {len(encoder)}, mean of heads", "encoder_self", encoder[-1][b].mean(0)


class Board:
    """A run's TensorBoard writer (``<run>/tb``). Flushes after every evaluation."""

    def __init__(self, log_dir: Path, purge_step: Optional[int] = None):
        # purge_step: a resumed run hides the events its previous life logged at or after that step
        self.writer = SummaryWriter(log_dir=str(log_dir), flush_secs=30, purge_step=purge_step)

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def attention(
        self, attention: Mapping[str, Any], src_tokens: List[List[str]], tgt_tokens: List[List[str]], step: int
    ) -> None:
        """Draw every map of ``attention`` for sentences whose tokens are given (EOS included)."""
        count = len(src_tokens)
        for b, suffix, what, kind, weights in attention_maps(attention, count):
            src, tgt = src_tokens[b], tgt_tokens[b]
            if kind == "cross":
                rows, x_tokens, y_tokens, x_label, y_label = weights[: len(tgt), : len(src)], src, tgt, "source", "output"
            else:
                rows, x_tokens, y_tokens, x_label, y_label = weights[: len(src), : len(src)], src, src, "source (key)", "source (query)"
            title = f"sentence {b}: {what}"
            fig = attention_figure(rows.detach().cpu(), x_tokens, y_tokens, title, x_label, y_label)
            self.writer.add_figure(f"attention/sent{_index(b, count)}/{suffix}", fig, step, close=True)

    def samples(self, sources: Sequence[str], references: Sequence[str], hypotheses: Sequence[str], step: int) -> None:
        for i, (src, ref, hyp) in enumerate(zip(sources, references, hypotheses)):
            text = f"**source:** {src}  \n**reference:** {ref}  \n**hypothesis:** {hyp}"
            self.writer.add_text(f"samples/sent{_index(i, len(sources))}", text, step)

    def hparams(self, params: Dict[str, Any], metrics: Dict[str, float]) -> None:
        """Hyper-parameters and final scores for TensorBoard's HParams view (same run folder)."""
        self.writer.add_hparams(params, metrics, run_name=".")

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def flat_params(tree: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """Flatten a nested config into ``{"model.d_model": 256, ...}`` of bool/str/int/float values."""
    flat: Dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_params(value, f"{name}."))
        elif value is None or isinstance(value, (bool, str, int, float)):
            flat[name] = "null" if value is None else value
        else:
            flat[name] = str(value)
    return flat


class NullBoard:
    """A Board that writes nothing: the ranks of a data-parallel run other than rank 0."""

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None
