"""The summaries of the attention viewer as they are stored: one blob sequence per sentence and step.

Training writes them (``viewer/summaries.py`` builds them from a model's attention), the plugin
(``viewer/plugin.py``) reads them back. A summary holds two blobs:

- blob 0, the header: UTF-8 JSON with the sentence's texts, its tokens (EOS included), the word
  index of each token and one entry per map: ``{"kind", "layer" (1-based), "heads", "rows"
  (queries), "cols" (keys), "offset" (into blob 1)}``;
- blob 1, the weights: every map ``(heads, rows, cols)`` row-major, concatenated, as uint8
  (``round(weight * SCALE)``), so a row of a head sums to about ``SCALE``.

Weights are stored at 8 bits because a heatmap shows no more, and they keep a run's event files
small (a few kilobytes per sentence and evaluation for the default Transformer).

This module imports neither torch nor numpy: TensorBoard loads it with the plugin.
"""

import json
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
    return header


def spans(header: Header) -> List[Tuple[int, int]]:
    """``(offset, size)`` in the weights blob of each map of ``header``, in its order."""
    return [(m["offset"], m["heads"] * m["rows"] * m["cols"]) for m in header["maps"]]
