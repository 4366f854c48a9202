"""The summaries of the attention viewer as they are stored: one blob sequence per sentence and step.

Training writes them (``viewer/summaries.py`` builds them from a model's attention), the plugin
(``viewer/plugin.py``) reads them back. A summary holds two blobs:

- blob 0, the header: UTF-8 JSON with the sentence's texts, its tokens (EOS included), the word
  index of each token and one entry per map: ``{"kind", "layer" (1-based), "heads", "rows"
  (queries), "cols" (keys), "offset" (into blob 1)}``;
- blob 1, the weights: every map ``(heads, rows, cols)`` row-major, concatenated, as uint8
  (``round(weight * SCALE)``), so a row of a head sums to about ``SCALE``.

Optional header fields, absent from a sentence that has none (a reader must not require them):

- ``"gold": {"sure": [[i, j], ...], "possible": [[i, j], ...]}``: a gold word alignment of the
  pair, ``i`` a source word and ``j`` an output word, both 0-based indices into ``src_words`` and
  ``out_words`` (the final EOS is a word no link uses). ``possible`` may or may not repeat the sure
  links; a link in ``sure`` is sure. ``"gold_label"``: what those links are when they are not a
  person's (e.g. an aligner's), the tab's name for them.
- ``"links": [[i, j], ...]`` and ``"links_method": "..."``: the model's own hard word alignment of
  the same pair (same convention) and how it was read from the attention, a label.
- ``"head_stats"``: one list per entry of ``"maps"``, in its order, with one
  ``{"entropy": float, "importance": float or null}`` per head, measured over a validation set:
  ``entropy`` the mean over query rows of the row's attention entropy (nats), ``importance`` the
  rise of the validation loss when that head alone is masked (null: not measured).

Weights are stored at 8 bits because a heatmap shows no more, and they keep a run's event files
small (a few kilobytes per sentence and evaluation for the default Transformer).

This module imports neither torch nor numpy: TensorBoard loads it with the plugin.
"""

import json
import math
from typing import Any, Dict, List, Tuple

from tensorboard.compat.proto.summary_pb2 import DATA_CLASS_BLOB_SEQUENCE, Summary, SummaryMetadata
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.compat.proto.types_pb2 import DT_STRING

PLUGIN_NAME = "nmt_attention"  # the plugin's name; tags are nmt_attention/sent<i> (training/board.py)
VERSION = 1  # of the header and of the plugin content; a reader refuses other versions
SCALE = 255  # a weight of 1 is stored as 255
KINDS = ("cross", "encoder_self", "decoder_self")  # a model's attention keys (models/seq2seq.py)

Header = Dict[str, Any]


def summary_of(tag: str, header: Header, weights: bytes) -> Summary:
    """The ``Summary`` of one sentence: a blob sequence of the JSON header and the uint8 weights."""
    metadata = SummaryMetadata(
        plugin_data=SummaryMetadata.PluginData(
            plugin_name=PLUGIN_NAME, content=json.dumps({"version": VERSION}).encode()
        ),
        data_class=DATA_CLASS_BLOB_SEQUENCE,  # the fast loader drops summaries without a data class
    )
    tensor = TensorProto(
        dtype=DT_STRING,
        tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=2)]),
        string_val=[json.dumps(header, ensure_ascii=False).encode("utf-8"), weights],
    )
    return Summary(value=[Summary.Value(tag=tag, tensor=tensor, metadata=metadata)])


def decode(header_blob: bytes, weights: bytes) -> Header:
    """The header of a stored sentence, checked against its weights blob (ValueError if they disagree)."""
    header = json.loads(header_blob.decode("utf-8"))
    version = header.get("version") if isinstance(header, dict) else None
    if version != VERSION:
        raise ValueError(f"attention summary of version {version!r}: this viewer reads version {VERSION}")
    expected = sum(size for _, size in spans(header))
    if expected != len(weights):
        raise ValueError(
            f"attention summary: the maps need {expected} bytes of weights, the blob has {len(weights)}"
        )
    check_optional(header)
    return header


def check_optional(header: Header) -> None:
    """Check the optional fields of ``header`` that it has (the words their links name exist, one
    entry of ``head_stats`` per map and head); ValueError if one is malformed."""
    words = {side: max(header[f"{side}_words"], default=-1) + 1 for side in ("src", "out")}
    if "gold" in header:
        gold = header["gold"]
        if not isinstance(gold, dict):
            raise ValueError("attention summary: gold is not {'sure': [...], 'possible': [...]}")
        for name in ("sure", "possible"):
            check_links(f"gold {name}", gold.get(name, []), words)
    if "links" in header:
        check_links("links", header["links"], words)
    if "head_stats" in header:
        stats, maps = header["head_stats"], header["maps"]
        heads = [len(s) if isinstance(s, list) else None for s in stats] if isinstance(stats, list) else None
        if heads != [m["heads"] for m in maps]:
            raise ValueError("attention summary: head_stats needs one list per map with one entry per head")
        for head in (h for per_map in stats for h in per_map):
            if not is_head_stat(head):
                raise ValueError(
                    f"attention summary: head_stats entry {head!r} is not {{entropy, importance}}"
                )


def is_head_stat(head: Any) -> bool:
    """``{"entropy": number, "importance": number or None}``?"""

    def finite(x: Any) -> bool:  # NaN and infinity are not JSON a browser reads
        return isinstance(x, (int, float)) and math.isfinite(x)

    return (
        isinstance(head, dict)
        and finite(head.get("entropy"))
        and (head.get("importance") is None or finite(head["importance"]))
    )


def check_links(name: str, links: Any, words: Dict[str, int]) -> None:
    """``links`` must be ``[[i, j], ...]`` with ``i`` a source word and ``j`` an output word."""
    for link in links if isinstance(links, list) else [links]:
        if not (
            isinstance(link, list)
            and len(link) == 2
            and all(isinstance(k, int) for k in link)
            and 0 <= link[0] < words["src"]
            and 0 <= link[1] < words["out"]
        ):
            raise ValueError(
                f"attention summary: {name} link {link!r} is not [source word, output word] "
                f"within {words['src']} source and {words['out']} output words"
            )


def spans(header: Header) -> List[Tuple[int, int]]:
    """``(offset, size)`` in the weights blob of each map of ``header``, in its order."""
    return [(m["offset"], m["heads"] * m["rows"] * m["cols"]) for m in header["maps"]]
