"""TensorBoard output of a run: scalars, attention heatmaps, sample translations, hparams.

Attention images are matplotlib figures, drawn in a process of their own while training goes on
(``training/drawing.py``), with the real subword tokens on both axes, one colour scale (0 to 1) for
every image, and a title naming the sentence, the kind of attention, the layer and the head. Both
model families return one attention structure (``models/seq2seq.py``), so every model gets the same
kinds of images; tags sort naturally in TensorBoard's list::

    attention/sent0/cross_layer1_mean ...      every decoder layer, heads averaged
    attention/sent0/cross_layer3_head1 ...     every head of the last decoder layer
    attention/sent0/encoder_self_layer3_mean   the last encoder layer, heads averaged (if any)

A layer with a single head (the RNN's attention but ``multihead``: one layer, one head) is drawn as
it is, without ``_mean`` and without head images: such an RNN has the one image
``attention/sent0/cross_layer1``.

Beside the images, every map of every layer and head of the same sentences is stored for the
attention viewer's TensorBoard tab (``viewer/``): one summary per sentence, ``nmt_attention/sent0``.
"""

from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from tensorboard.compat.proto.summary_pb2 import Summary
from torch import Tensor
from torch.utils.tensorboard import SummaryWriter

from common.settings import flatten
from training.drawing import Drawing, Picture
from viewer.format import PLUGIN_NAME, summary_of
from viewer.summaries import Texts, encode

KINDS = {"cross": "cross-attention", "encoder_self": "encoder self-attention"}  # kind -> title


def _index(i: int, count: int) -> str:
    """``i`` (0-based) zero-padded to the width of ``count`` so that tags sort naturally."""
    return str(i).zfill(len(str(count - 1)))


class AttentionMap(NamedTuple):
    """One image: sentence ``b``, tag suffix, title, kind (a key of ``KINDS``), ``(query, key)`` weights."""

    b: int
    tag: str
    title: str
    kind: str
    weights: Tensor


def layer_map(kind: str, layers: Sequence[Tensor], layer: int, b: int) -> AttentionMap:
    """Sentence ``b`` of layer ``layer`` (1-based) of ``layers`` ``[(B, H, query, key)]``, heads averaged."""
    heads = layers[layer - 1][b]  # (H, query, key)
    tag, title = f"{kind}_layer{_index(layer, len(layers) + 1)}", f"{KINDS[kind]}, layer {layer}"
    if heads.size(0) == 1:
        return AttentionMap(b, tag, title, kind, heads[0])
    return AttentionMap(b, f"{tag}_mean", f"{title}, mean of heads", kind, heads.mean(0))


def head_maps(cross: Sequence[Tensor], b: int) -> Iterator[AttentionMap]:
    """Sentence ``b`` of every head of the last cross-attention layer, when it has several heads."""
    last = cross[-1][b]  # (H, T, S)
    n_layers, n_heads = len(cross), last.size(0)
    if n_heads == 1:
        return
    layer = _index(n_layers, n_layers + 1)
    for head in range(1, n_heads + 1):
        tag = f"cross_layer{layer}_head{_index(head, n_heads + 1)}"
        title = f"{KINDS['cross']}, layer {n_layers}, head {head}"
        yield AttentionMap(b, tag, title, "cross", last[head - 1])


def attention_maps(attention: Mapping[str, Sequence[Tensor]], n_sentences: int) -> Iterator[AttentionMap]:
    """Every image of the first ``n_sentences`` sentences of one batch of attention.

    ``attention`` is a model's ``forward(..., need_weights=True)`` output (``models/seq2seq.py``):
    ``cross`` ``[(B, H, T, S)]`` per decoder layer, ``encoder_self`` ``[(B, H, S, S)]`` per encoder
    layer (empty for the RNN). Per sentence: every cross layer (heads averaged), every head of the
    last cross layer, the last encoder self-attention layer (heads averaged).
    """
    cross, encoder = attention["cross"], attention["encoder_self"]
    for b in range(n_sentences):
        for layer in range(1, len(cross) + 1):
            yield layer_map("cross", cross, layer, b)
        yield from head_maps(cross, b)
        if encoder:
            yield layer_map("encoder_self", encoder, len(encoder), b)


class Board:
    """A run's TensorBoard writer (``<run>/tb``). Flushes after every evaluation."""

    def __init__(self, log_dir: Path, purge_step: Optional[int] = None):
        # purge_step: a resumed run hides the events its previous life logged at or after that step
        self.writer = SummaryWriter(log_dir=str(log_dir), flush_secs=30, purge_step=purge_step)
        self.drawing = Drawing()  # the attention images, drawn in a process of their own

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def attention(
        self,
        attention: Mapping[str, Sequence[Tensor]],
        src_tokens: List[List[str]],
        tgt_tokens: List[List[str]],
        step: int,
    ) -> None:
        """Draw every map of ``attention`` for sentences whose tokens are given (EOS included), in the
        background (``training/drawing.py``): written at ``step`` once drawn, by ``close`` at the latest."""
        count, pictures = len(src_tokens), []
        for image in attention_maps(attention, count):
            src, tgt = src_tokens[image.b], tgt_tokens[image.b]
            if image.kind == "cross":
                queries, x_label, y_label = tgt, "source", "output"
            else:
                queries, x_label, y_label = src, "source (key)", "source (query)"
            rows = image.weights[: len(queries), : len(src)].detach().float().cpu().numpy()  # (query, key)
            title = f"sentence {image.b}: {image.title}"
            tag = f"attention/sent{_index(image.b, count)}/{image.tag}"
            pictures.append(Picture(tag, rows, src, queries, title, x_label, y_label))
        self._write(self.drawing.submit(pictures, step))  # drawn while training goes on
        self._write_drawn()

    def attention_summaries(
        self,
        model: str,
        attention: Mapping[str, Sequence[Tensor]],
        src_tokens: List[List[str]],
        out_tokens: List[List[str]],
        texts: Sequence[Texts],
        step: int,
        tag: str = "sent",
        extras: Optional[Sequence[Mapping[str, Any]]] = None,
    ) -> None:
        """Every map of ``attention`` (model family ``model``) for the viewer, one summary for each
        sentence whose tokens (EOS included) and texts are given, under ``nmt_attention/<tag><i>``;
        ``extras``: each sentence's optional header fields (``viewer.summaries.encode``: gold links,
        the model's links, the heads' numbers)."""
        for b, (src, out, text) in enumerate(zip(src_tokens, out_tokens, texts)):
            header, weights = encode(attention, b, src, out, text, model, **(extras[b] if extras else {}))
            # unpadded, so that runs with other trainer.attention_samples line up (the plugin sorts by number)
            summary = summary_of(f"{PLUGIN_NAME}/{tag}{b}", header, weights)
            # SummaryWriter has no call for a summary built elsewhere; its add_* end in this one
            self.writer._get_file_writer().add_summary(summary, step)

    def samples(
        self, sources: Sequence[str], references: Sequence[str], hypotheses: Sequence[str], step: int
    ) -> None:
        for i, (src, ref, hyp) in enumerate(zip(sources, references, hypotheses)):
            text = f"**source:** {src}  \n**reference:** {ref}  \n**hypothesis:** {hyp}"
            self.writer.add_text(f"samples/sent{_index(i, len(sources))}", text, step)

    def hparams(self, config: Mapping[str, Any], metrics: Dict[str, float]) -> None:
        """The run's config (nested, flattened here to ``model.d_model``, ...) and its final scores
        for TensorBoard's HParams view (same run folder)."""
        self.writer.add_hparams(hparam_values(config), metrics, run_name=".")

    def _write_drawn(self, wait: bool = False) -> None:
        """Write the images drawn so far (``wait``: every one submitted) at their steps."""
        self._write(self.drawing.finished(wait))

    def _write(self, drawn: List[Tuple[int, List[bytes]]]) -> None:
        for step, summaries in drawn:
            for data in summaries:
                self.writer._get_file_writer().add_summary(Summary.FromString(data), step)

    def flush(self) -> None:
        """Write what is ready (the images drawn so far) to disk; drawings still under way stay so."""
        self._write_drawn()
        self.writer.flush()

    def close(self) -> None:
        """Wait for the images under way, write them, and close the events file."""
        try:
            self._write_drawn(wait=True)
        finally:
            self.drawing.close()
            self.writer.close()


def hparam_values(config: Mapping[str, Any]) -> Dict[str, Any]:
    """The flattened config as the values the HParams view takes: bool, str, int, float ("null" for None)."""

    def value(v: Any) -> Any:
        return "null" if v is None else v if isinstance(v, (bool, str, int, float)) else str(v)

    return {key: value(v) for key, v in flatten(config).items()}


class NullBoard:
    """A Board that writes nothing: the ranks of a data-parallel run other than rank 0.

    It has exactly Board's methods (same arguments, see there), so a call Board does not have
    fails here too.
    """

    def scalars(self, *args: Any) -> None:
        pass

    def attention(self, *args: Any) -> None:
        pass

    def attention_summaries(self, *args: Any) -> None:
        pass

    def samples(self, *args: Any) -> None:
        pass

    def hparams(self, *args: Any) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass
