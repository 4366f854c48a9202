"""One sentence's attention as the viewer stores it (``viewer/format.py``): every map of the model,
every layer and every head, with the sentence's tokens, words and texts.

The attention is a model's ``forward(..., need_weights=True)`` output (``models/seq2seq.py``) over
a batch in which the model's own output was fed back teacher-forced
(``inference/decoding.py``: ``output_attention``); the maps of sentence ``b`` are cut to its real
tokens:

    cross         (H, T, S)   output tokens over source tokens
    encoder_self  (H, S, S)   source over source
    decoder_self  (H, T, T)   output tokens over the decoder's inputs (``<s>``, then the outputs)

A sentence may also carry a gold word alignment, the model's own hard links and statistics of
every head measured over a validation set (``encode``'s keyword arguments; the optional fields of
``viewer/format.py``). ``head_stats_of`` builds the last from each head's entropy (``alignment.heads.row_entropy``).

The training side only: this module uses torch; the plugin reads summaries through
``viewer/format.py`` alone.
"""

from typing import Dict, Iterable, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor

from alignment.heads import HeadStats
from alignment.words import word_ids
from data.specials import BOS_ID, EOS_ID, SPECIAL_TOKENS
from viewer.format import KINDS, SCALE, VERSION, Header, check_optional

PIECE = {i: piece for piece, i in SPECIAL_TOKENS.items()}  # id -> piece of the special tokens

Link = Tuple[int, int]  # (source word, output word), 0-based, as in Pharaoh "i-j"
HeadStat = Dict[str, Optional[float]]  # {"entropy": nats, "importance": loss rise or None}


class Texts(NamedTuple):
    """A sentence's source, reference and hypothesis as text (detokenized)."""

    source: str
    reference: str
    hypothesis: str


def words_of(pieces: Sequence[str]) -> List[int]:
    """The word index of each piece (``word_ids``); a final EOS is a word of its own: it ends the
    sentence but belongs to no word (alignments drop it too)."""
    if pieces and pieces[-1] == PIECE[EOS_ID]:
        words = word_ids(pieces[:-1])
        return words + [words[-1] + 1 if words else 0]
    return word_ids(pieces)


def sentence_maps(
    attention: Mapping[str, Sequence[Tensor]], b: int, n_src: int, n_out: int
) -> Iterator[Tuple[str, int, Tensor]]:
    """``(kind, layer (1-based), (H, rows, cols) weights)`` of every map of sentence ``b``, cut to its
    ``n_src`` source and ``n_out`` output tokens; kinds in ``KINDS`` order, layers first to last."""
    sizes = {"cross": (n_out, n_src), "encoder_self": (n_src, n_src), "decoder_self": (n_out, n_out)}
    for kind in KINDS:
        rows, cols = sizes[kind]
        for layer, weights in enumerate(attention.get(kind, ()), start=1):  # (B, H, query, key)
            yield kind, layer, weights[b, :, :rows, :cols]  # (H, rows, cols)


def quantize(weights: Tensor) -> bytes:
    """Weights in [0, 1] as uint8 bytes (``round(w * SCALE)``), row-major."""
    scaled = (weights.detach().float().clamp(0.0, 1.0) * SCALE).round()
    return scaled.to(torch.uint8).cpu().contiguous().numpy().tobytes()


def encode(
    attention: Mapping[str, Sequence[Tensor]],
    b: int,
    src_tokens: Sequence[str],
    out_tokens: Sequence[str],
    texts: Texts,
    model: str,
    *,
    gold: Optional[Mapping[str, Iterable[Link]]] = None,
    links: Optional[Iterable[Link]] = None,
    links_method: Optional[str] = None,
    head_stats: Optional[Sequence[Sequence[HeadStat]]] = None,
    gold_label: Optional[str] = None,
) -> Tuple[Header, bytes]:
    """The header and the weights blob of sentence ``b`` of ``attention``; ``src_tokens`` and
    ``out_tokens`` are its pieces (EOS included), ``model`` the family ("rnn" or "transformer").

    Optional, stored only when given (``viewer/format.py``): ``gold`` ``{"sure": links,
    "possible": links}`` (``gold_label``: what they are, when not a person's links), the model's
    own ``links`` (with a ``links_method`` label), each link ``(source word, output word)``;
    ``head_stats`` one list per map (in the header's order: see ``head_stats_of``) of
    ``{"entropy", "importance"}`` per head. ValueError if one does not fit.
    """
    maps, blobs, offset = [], [], 0
    for kind, layer, weights in sentence_maps(attention, b, len(src_tokens), len(out_tokens)):
        heads, rows, cols = weights.shape
        maps.append(
            {"kind": kind, "layer": layer, "heads": heads, "rows": rows, "cols": cols, "offset": offset}
        )
        blobs.append(quantize(weights))
        offset += len(blobs[-1])
    header = {
        "version": VERSION,
        "model": model,
        **texts._asdict(),
        "src_tokens": list(src_tokens),
        "out_tokens": list(out_tokens),
        # the decoder's input at each position: the keys of decoder_self
        "in_tokens": [PIECE[BOS_ID], *out_tokens[:-1]],
        "src_words": words_of(src_tokens),
        "out_words": words_of(out_tokens),
        "maps": maps,
        "dtype": "uint8",
        "scale": SCALE,
    }
    if gold is not None:
        header["gold"] = {name: link_list(gold.get(name, ())) for name in ("sure", "possible")}
    if gold_label is not None:
        header["gold_label"] = str(gold_label)
    if links is not None:
        header["links"] = link_list(links)
    if links_method is not None:
        header["links_method"] = str(links_method)
    if head_stats is not None:
        header["head_stats"] = [[dict(head) for head in per_map] for per_map in head_stats]
    check_optional(header)
    return header, b"".join(blobs)


def link_list(links: Iterable[Link]) -> List[List[int]]:
    """Links as JSON pairs ``[[i, j], ...]``, each once, in their first order."""
    pairs = [[int(i), int(j)] for i, j in links]
    return [pair for k, pair in enumerate(pairs) if pair not in pairs[:k]]


def head_stats_of(
    entropy: Mapping[str, Sequence[Sequence[float]]],
    importance: Optional[Mapping[str, Sequence[Sequence[Optional[float]]]]] = None,
) -> List[List[HeadStat]]:
    """``encode``'s ``head_stats`` from ``{kind: [per layer: [per head: value]]}`` of entropy and,
    optionally, importance (a kind it lacks, or a head given as None: not measured). One list per
    map in the order ``encode`` stores the maps: ``KINDS`` order, layers first to last."""
    stats = []
    for kind in KINDS:
        rises = (importance or {}).get(kind)
        for layer, heads in enumerate(entropy.get(kind, ())):
            layer_rises = rises[layer] if rises is not None else [None] * len(heads)
            stats.append([head_stat(h, rise) for h, rise in zip(heads, layer_rises)])
    return stats


def head_stat(entropy: float, importance: Optional[float]) -> HeadStat:
    return {"entropy": float(entropy), "importance": None if importance is None else float(importance)}


def head_stats_by_map(stats: Sequence[HeadStats]) -> List[List[HeadStat]]:
    """``alignment.heads.head_stats``' list as ``viewer.summaries.encode``'s ``head_stats``."""
    entropy: Dict[str, List[List[float]]] = {}
    importance: Dict[str, List[List[float]]] = {}
    for s in stats:
        for table, value in ((entropy, s.entropy), (importance, s.importance)):
            layers = table.setdefault(s.kind, [])
            while len(layers) < s.layer:
                layers.append([])
            layers[s.layer - 1].append(value)
    return head_stats_of(entropy, importance)
