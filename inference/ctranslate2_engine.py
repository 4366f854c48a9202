"""Translate with a CTranslate2 export: the engine behind ``translate.py --engine ctranslate2``.

    from inference.ctranslate2_engine import load_translator

    translator = load_translator("exports/de-en-int8", threads=2)  # a inference.translator.Translator
    print(translator.translate(["Ein Mann schläft."], beam=5)[0].text)

Only the decoding changes: ``CTranslate2Engine`` decodes the same source ids as ``TorchEngine`` into
the same ``Hypothesis`` lists, so tokenizing, batching, long inputs, n-best lists, detokenizing and
words from attention are the Translator's, as for a checkpoint (the attention itself is the
engine's, returned while it decodes: ``align``). Kept as in our own search:

- the output never holds ``<pad>`` or ``<s>`` (suppressed), and may be empty (EOS first);
- the length limit of each sentence (``SearchOptions.output_limit``: ``max_len_ratio`` x its
  source tokens + ``max_len_extra``, at most the model's ``max_positions``). A batch decodes up to
  its longest limit; a sentence whose output ran past its own limit is decoded again alone with
  that limit (greedy output is then exactly ours; a beam that went past the limit and came back
  with shorter outputs only is kept);
- the GNMT length penalty ``((5 + |y|) / 6) ** alpha`` ranks the beam. The engine's own penalty is
  ``|y| ** alpha``, so it runs with none (raw log-probabilities) and returns its ``K`` best, which
  are ranked here with ours. Its beam stops on its own rule (once the best hypothesis and ``K`` in
  all have ended, where ours goes on while a live one can still win), so a beam may differ from
  ours in a rare sentence;
- scores: the sum of token log-probabilities (EOS included), divided by the penalty for beams.
  With ``<pad>`` and ``<s>`` suppressed the engine renormalises the other tokens' probabilities,
  so its scores can be slightly higher than ours (by the little mass a trained model gives them);
- alignments: the export's alignment layer and heads at the predicting step (set in the spec and
  in ``export.json``: a checkpoint trained with guided alignment keeps its supervised heads, another
  one aligns by its last layer's mean of heads; ``--align-*`` naming another method is refused); the
  first row of beam hypotheses is mended (``CTranslate2Engine.mend_first_attention``).
"""

import ctypes
import logging
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import ctranslate2
import torch
from torch import Tensor

from alignment.method import Method
from data.encoding import usable_cores
from data.tokenizer import Tokenizer
from inference.ctranslate2_export import ExportError, info_method, read_export, spm_files
from inference.translator import Translator
from models.search import Hypothesis, length_penalty
from models.search_options import SearchOptions

log = logging.getLogger(__name__)

NEVER_OUTPUT = [["<pad>"], ["<s>"]]  # as models.search never picks PAD or BOS
EOS_PIECE = "</s>"
# The CUDA libraries the pinned CTranslate2 (4.8.5) loads when it first runs on a GPU: its wheel
# is built against CUDA 12 and loads cuBLAS 12 at run time, so a machine with only CUDA 13 sees
# the GPU (``get_cuda_device_count``) but cannot run on it.
CUDA_LIBRARIES = ("libcublas.so.12",)


def ended(pieces: List[str]) -> bool:
    """Whether an output of the engine (run with its end token) ended with EOS, not at the limit."""
    return bool(pieces) and pieces[-1] == EOS_PIECE


def ran_past(pieces: List[str], limit: int) -> bool:
    """Whether an output went on after step ``limit``, where our search would have stopped it:
    ``limit`` tokens that are not EOS, or more."""
    return len(pieces) - int(ended(pieces)) >= limit


def missing_cuda_libraries(names: Sequence[str] = CUDA_LIBRARIES) -> List[str]:
    """The libraries of ``names`` that the dynamic loader cannot load in this process."""
    missing = []
    for name in names:
        try:
            ctypes.CDLL(name)
        except OSError:
            missing.append(name)
    return missing


def choose_device(device: str, gpus: int, missing: Sequence[str]) -> Tuple[str, int]:
    """``auto`` / ``cpu`` / ``cuda`` / ``cuda:N`` -> the engine's device name and index, given the
    CUDA devices it sees (``gpus``) and the CUDA libraries it needs that do not load (``missing``).
    ``auto`` takes the GPU only where the engine can run on it, else the CPU with a warning; an
    explicit ``cuda`` without them is a ``ValueError`` naming what is missing."""
    if device == "auto":
        if gpus > 0 and missing:
            log.warning(
                "CTranslate2 sees %d CUDA device(s) but cannot load %s (it needs CUDA 12's libraries): "
                "translating on the CPU",
                gpus,
                ", ".join(missing),
            )
        return ("cuda" if gpus > 0 and not missing else "cpu"), 0
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()):
        raise ValueError(f"device {device!r}: choose auto, cpu, cuda or cuda:N")
    if kind == "cuda" and int(index or 0) >= gpus:
        raise ValueError(f"device {device!r}: CTranslate2 sees {gpus} CUDA device(s) here; use --device cpu")
    if kind == "cuda" and missing:
        raise ValueError(
            f"device {device!r}: CTranslate2 {ctranslate2.__version__} cannot load {', '.join(missing)} "
            "(CUDA 12's cuBLAS) here: install it where the loader finds it (e.g. pip install nvidia-cublas-cu12 "
            "and its nvidia/cublas/lib folder on LD_LIBRARY_PATH) or use --device cpu"
        )
    return kind, int(index or 0)


def engine_device(device: str) -> Tuple[str, int]:
    """``choose_device`` for this machine: its CUDA devices and libraries as CTranslate2 sees them."""
    gpus = ctranslate2.get_cuda_device_count()
    return choose_device(device, gpus, missing_cuda_libraries() if gpus > 0 else [])


def export_tokenizer(folder: Path, info: Dict[str, Any]) -> Tokenizer:
    """The SentencePiece model(s) written beside the engine's files."""
    models = [(folder / name).read_bytes() for name in spm_files(bool(info["joint_vocabulary"]))]
    return Tokenizer(*models)


CT2_DEFAULT_THREADS = 4  # CTranslate2's intra_threads when given 0


class CTranslate2Engine:
    """A CTranslate2 ``Translator`` over an export folder, decoding source id lists like ``TorchEngine``."""

    def __init__(
        self,
        folder: Path,
        tokenizer: Tokenizer,
        max_positions: int,
        device: str = "auto",
        threads: int = 0,
        compute_type: str = "default",
        method: Optional[Method] = None,
    ):
        kind, index = engine_device(device)
        self.device = kind
        # the engine's own default is 4 threads: more threads than cores wait on each other
        threads = threads or min(CT2_DEFAULT_THREADS, usable_cores())
        try:
            self.translator = ctranslate2.Translator(
                str(folder), device=kind, device_index=index, compute_type=compute_type, intra_threads=threads
            )
        except (RuntimeError, ValueError, OSError) as error:  # a damaged model.bin, config or vocabulary
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            remedy = "export the checkpoint again" + (" or use --device cpu" if kind == "cuda" else "")
            raise ExportError(f"CTranslate2 cannot load {folder} on {kind} ({first}): {remedy}") from None
        self.max_positions = max_positions
        self.method = method or info_method(read_export(folder))  # the export's alignment layer and heads
        self.dtype = f"ctranslate2 {getattr(self.translator, 'compute_type', compute_type)}"
        self.src_pieces = tokenizer.src_pieces(range(tokenizer.src_vocab_size))  # id -> piece
        self.tgt_ids = {
            piece: i for i, piece in enumerate(tokenizer.tgt_pieces(range(tokenizer.tgt_vocab_size)))
        }

    def run(
        self, batch: Sequence[List[int]], max_length: int, beam_size: int, need_weights: bool
    ) -> List[Any]:
        """The engine's results for source id lists (EOS included), up to ``max_length`` output tokens."""
        return self.translator.translate_batch(
            [[self.src_pieces[i] for i in ids] for ids in batch],
            beam_size=beam_size,
            num_hypotheses=beam_size,
            length_penalty=0.0,  # raw log-probabilities: the GNMT penalty is applied in ``hypotheses``
            min_decoding_length=0,  # EOS may come first, as in our search
            max_decoding_length=max_length,
            max_input_length=0,  # the Translator has cut long sources already
            suppress_sequences=NEVER_OUTPUT,
            return_end_token=True,  # tells an ended output from one cut at the limit, with its attention row
            return_scores=True,
            return_attention=need_weights,
        )

    def hypotheses(self, result: Any, source_length: int, beam: int, alpha: float) -> List[Hypothesis]:
        """One sentence's hypotheses, best first, scored as ``models.search`` scores them."""
        found = []
        for k, pieces in enumerate(result.hypotheses):
            finished = ended(pieces)
            tokens = [self.tgt_ids[piece] for piece in (pieces[:-1] if finished else pieces)]
            score = result.scores[k]
            if beam > 1:  # |y| counts EOS, as in models.search
                score /= length_penalty(len(tokens) + int(finished), alpha)
            attention = None
            if result.attention:  # one row per output token, EOS included, as models.search gives
                rows = result.attention[k]
                attention = torch.tensor(rows, dtype=torch.float32).reshape(
                    len(rows), source_length
                )  # (T + 1, S)
            found.append(Hypothesis(tokens, score, attention, finished=finished))
        return sorted(found, key=lambda hyp: hyp.score, reverse=True)

    def check_method(self, method: Optional[Method]) -> None:
        """The export gives one attention (its alignment layer and heads, set in the spec): another
        chosen method is a one-line ``ValueError``."""
        if method is not None and method != self.method:
            raise ValueError(
                f"alignments by {method.label}: the CTranslate2 engine gives only the export's alignment "
                f"({self.method.label}); choose the method with --engine torch"
            )

    def align(
        self, batch: List[List[int]], found: List[List[Hypothesis]], method: Optional[Method]
    ) -> List[List[Tensor]]:
        """The attention the engine returned with each hypothesis (``decode(..., attention=True)``),
        ``(T + 1, S)`` (EOS row last: dropped with the words)."""
        return [[hyp.alignment for hyp in hyps] for hyps in found]

    def decode(
        self, batch: List[List[int]], options: SearchOptions, attention: bool = False
    ) -> List[List[Hypothesis]]:
        """The ``options.nbest`` best hypotheses of each source id list of ``batch`` (EOS included),
        with the attention of each output token when ``attention`` (``Hypothesis.alignment``)."""
        beam, need_weights = options.beam_size, attention
        limits = [options.output_limit(len(ids), self.max_positions) for ids in batch]
        longest = max(limits)
        results = self.run(batch, longest, beam, need_weights)
        for i, (ids, limit) in enumerate(zip(batch, limits)):
            if limit < longest and any(ran_past(pieces, limit) for pieces in results[i].hypotheses):
                results[i] = self.run([ids], limit, beam, need_weights)[0]  # ran past its own limit
        found = [
            self.hypotheses(result, len(ids), beam, options.alpha)[: options.nbest]
            for result, ids in zip(results, batch)
        ]
        if need_weights and beam > 1:
            self.mend_first_attention(batch, found)
        return found

    def mend_first_attention(self, batch: Sequence[List[int]], found: List[List[Hypothesis]]) -> None:
        """Put the right attention into the first row of beam hypotheses.

        CTranslate2 4.8's beam search returns, as the first row of every sentence's attention, the
        first step's attention of one sentence of the batch (the rows after it are right; greedy
        search is right). The first step reads ``<s>`` alone, the same in every hypothesis, so one
        greedy step gives each sentence's row.
        """
        # with its end token, a first step that is EOS has its row too
        first = self.run(batch, max_length=1, beam_size=1, need_weights=True)
        for result, hyps in zip(first, found):
            row = torch.tensor(result.attention[0][0], dtype=torch.float32)  # (S,)
            for hyp in hyps:
                if hyp.alignment is not None and len(hyp.alignment):
                    hyp.alignment[0] = row


def load_translator(
    folder: Union[str, Path], device: str = "auto", threads: int = 0, compute_type: str = "default"
) -> Translator:
    """A ``Translator`` over an export of ``scripts/export_ctranslate2.py`` (``inference.ctranslate2_export.ExportError``
    when ``folder`` is not one). ``threads``: the engine's threads (0: its default of 4, at most the
    cores this process may use); ``compute_type``:
    ``default`` runs the stored weight type, ``int8`` / ``float32`` / ... convert when loading."""
    folder = Path(folder)
    info = read_export(folder)
    tokenizer = export_tokenizer(folder, info)
    engine = CTranslate2Engine(
        folder, tokenizer, int(info["max_positions"]), device, threads, compute_type, info_method(info)
    )
    return Translator(engine, tokenizer, float(info["length_penalty"]))
