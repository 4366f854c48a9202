"""Translate sentences with a checkpoint of train.py, from Python (``translate.py`` is its command line).

    from inference.translator import Translator

    translator = Translator.from_checkpoint("outputs/DATE/TIME/checkpoints/best.pt")  # device: auto
    for result in translator.translate(["Ein Mann schläft.", "Zwei Hunde."], nbest=3, alignments=True):
        print(result.text, result.score, result.alignment, [hyp.text for hyp in result.nbest])

Several checkpoints of one vocabulary decode as an ensemble (``models.ensemble``)::

    translator = Translator.from_checkpoints([rnn_checkpoint, transformer_checkpoint])

``translate`` returns one ``Translation`` per sentence, in the input order; a bad option raises
``ValueError`` at once (``models.search_options.SearchOptions`` checks them). Sentences are sorted by
length and decoded ``batch_size`` at a time by the translator's engine: ``models.search.search``
over a checkpoint's model (greedy for a beam of 1), or CTranslate2 over an export
(``inference.ctranslate2_engine.load_translator``; ``inference.engines.translator_for`` picks either
by name, as ``translate.py --engine`` does). ``Translation.lines`` is a result as ``translate.py`` prints it.
A blank sentence gives an empty translation (score 0) without decoding. A sentence longer than the
model takes is cut, with a warning on the logger ``inference.translator``.
"""

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from alignment.forced import batched_cross_maps, method_map, word_links
from alignment.method import DEFAULT_METHOD, Method, default_method
from alignment.scores import pharaoh
from alignment.words import piece_words
from common.checkpoint import CheckpointError, load_checkpoint
from common.device import decode_precision, native_bf16, pick_device, precision_name, use_precision
from data.batching import pad, source_mask
from data.specials import BOS_ID, EOS_ID, PAD_ID
from data.tokenizer import Tokenizer
from inference.markup import Markup, MarkupError, parse_markup, tagged_text
from models.build import build_model
from models.config import config_from_dict
from models.ensemble import Ensemble
from models.search import Hypothesis, search
from models.search_options import MAX_LEN_EXTRA, MAX_LEN_RATIO, SearchOptions

log = logging.getLogger(__name__)


# ----- a model back from its checkpoint -----
def weights_mismatch(expected: Dict[str, Any], given: Dict[str, Any]) -> str:
    """How the weights ``given`` differ from a model's ``expected`` state dict, in one line; empty
    when they fit. Weights of the other model family show as missing and unexpected names."""
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    shapes = [
        k
        for k in sorted(set(expected) & set(given))
        if not isinstance(given[k], torch.Tensor) or given[k].shape != expected[k].shape
    ]
    parts = []
    if missing:
        parts.append(f"{len(missing)} weights missing, e.g. {missing[0]}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected, e.g. {unexpected[0]}")
    if shapes:
        k = shapes[0]
        got = tuple(given[k].shape) if isinstance(given[k], torch.Tensor) else type(given[k]).__name__
        parts.append(f"{len(shapes)} of another shape, e.g. {k} {got} instead of {tuple(expected[k].shape)}")
    return "; ".join(parts)


def load_model(path: Path, device: Any = "cpu") -> Tuple[nn.Module, Tokenizer, Dict[str, Any]]:
    """The model (in eval mode, on ``device``) and the tokenizer of a checkpoint, and the checkpoint.

    Everything comes from the file: model config, weights and SentencePiece models.
    """
    return model_of(load_checkpoint(path), path, device)


def model_of(
    payload: Dict[str, Any], path: Path, device: Any = "cpu"
) -> Tuple[nn.Module, Tokenizer, Dict[str, Any]]:
    """``load_model`` of a checkpoint already read from ``path`` (named in the errors)."""
    if "tokenizer" not in payload:
        raise CheckpointError(f"{path} holds no tokenizer (not a checkpoint of this project)")
    try:
        cfg = config_from_dict(dict(payload["model_config"]))
        tokenizer = Tokenizer.from_state_dict(payload["tokenizer"])
        model = build_model(cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, PAD_ID)
        mismatch = weights_mismatch(model.state_dict(), payload["model"])
        if mismatch:
            raise ValueError(f"model {cfg.name}: {mismatch}")
    except (ValueError, TypeError, KeyError, RuntimeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"checkpoint {path} does not match its model config ({first})") from None
    model.load_state_dict(payload["model"])
    return model.to(device).eval(), tokenizer, payload


@dataclass
class Translation:
    """One translation. A result of ``Translator.translate`` has its best hypothesis's fields, and all its
    hypotheses (best first, the best included) in ``nbest``."""

    text: str
    score: float  # log-probability; beam search divides it by the GNMT length penalty, greedy does not
    alignment: Optional[List[Tuple[int, int]]] = None  # Pharaoh pairs (source word, output word), when asked
    nbest: List["Translation"] = field(default_factory=list)
    words: Optional[Tensor] = None  # (W_tgt, W_src) word attention, when alignments are asked (for plots)
    src_words: List[str] = field(default_factory=list)  # the axes of ``words``
    out_words: List[str] = field(default_factory=list)
    finished: bool = True  # False: cut at the length limit before EOS

    def lines(self, index: int, source: str, nbest: bool = False, alignments: bool = False) -> List[str]:
        """This translation of input line ``index``, ``source``, as ``translate.py`` prints it: its text,
        or with ``nbest`` one line ``index ||| text ||| score`` per hypothesis, best first.

        With ``alignments`` every line is 'translation, tab, Pharaoh pairs', also for an empty
        translation; only a blank source line stays an empty line (without ``nbest``).
        """
        lines = []
        for t in self.nbest if nbest else [self]:
            line = f"{index} ||| {t.text} ||| {t.score:.4f}" if nbest else t.text
            if alignments and (nbest or not is_blank(source)):
                line += "\t" + pharaoh(t.alignment or [])
            lines.append(line)
        return lines


def with_tags(result: Translation, markup: Markup) -> Translation:
    """``result`` (every hypothesis) with ``markup``'s tags carried into its text; untagged when its
    source words are not the markup's words (the tokenizer split or dropped one), or a hypothesis's
    text words are not its aligned words."""
    if len(result.src_words) != len(markup.word_spans()):
        return result

    def tagged(t: Translation) -> Translation:
        if len(t.out_words) != len(t.text.split()):  # not the aligned words (<unk> decodes as " ⁇ ")
            return t
        return replace(t, text=tagged_text(markup, t.text, t.alignment or []))

    hypotheses = [tagged(t) for t in result.nbest]
    return replace(hypotheses[0], nbest=hypotheses) if hypotheses else tagged(result)


def is_blank(sentence: str) -> bool:
    """Nothing to translate: an empty line or white space only."""
    return not sentence.strip()


def blank_translation(alignments: bool) -> Translation:
    """The result of a blank sentence: empty, score 0 (no alignment pairs, as there are no words)."""
    empty = Translation("", 0.0, [] if alignments else None)
    return replace(empty, nbest=[empty])


def detokenize(tokenizer: Tokenizer, hyps: List[Hypothesis]) -> List[str]:
    """Text of each hypothesis, on one line (a decoded line-break byte would shift a .hyp file)."""
    return [" ".join(text.splitlines()) for text in tokenizer.decode_tgt([h.tokens for h in hyps])]


# Sentences decoded together by default: on the CPU a batch of 64 keeps the cores busy; on a GPU a
# search step costs about the same for 64 sentences as for a thousand (inference/decoding.py).
CPU_BATCH_SIZE, GPU_BATCH_SIZE = 64, 1024


def default_batch_size(engine: Any) -> int:
    """``GPU_BATCH_SIZE`` for our search on a GPU, else ``CPU_BATCH_SIZE``."""
    device = getattr(engine, "device", None)
    on_gpu = isinstance(device, torch.device) and device.type != "cpu"
    return GPU_BATCH_SIZE if on_gpu else CPU_BATCH_SIZE


def length_batches(lengths: Sequence[int], batch_size: int) -> List[List[int]]:
    """Indices of ``lengths`` sorted by length (stable) and cut into batches of ``batch_size``."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def default_alpha(payload: Dict[str, Any]) -> float:
    """The length penalty a run was tested with (``trainer.length_penalty`` of its config), else 1.0."""
    trainer = (payload.get("config") or {}).get("trainer") or {}
    value = trainer.get("length_penalty")
    return 1.0 if value is None else float(value)


def shared_precision(
    dtype: Optional[str], payloads: Sequence[Dict[str, Any]], device: torch.device
) -> Dict[str, bool]:
    """``amp`` and ``tf32`` of decoding checkpoints together on ``device`` with ``dtype``
    (``decode_precision`` of each): a flag is on only when it is on for every one (auto: bf16 only
    when every run was validated in it, and the device computes in bf16)."""
    precisions = [decode_precision(dtype, payload, device, native_bf16()) for payload in payloads]
    return {flag: all(p[flag] for p in precisions) for flag in precisions[0]}


def mean_alpha(payloads: Sequence[Dict[str, Any]]) -> float:
    """The default length penalty of checkpoints decoding together: the mean of their runs'."""
    return sum(default_alpha(payload) for payload in payloads) / len(payloads)


def vocabularies(tokenizer: Dict[str, Optional[bytes]]) -> Dict[str, Optional[bytes]]:
    """The SentencePiece model of each side of a checkpoint's tokenizer state (a joint one serves both)."""
    return {"source": tokenizer["src_model"], "target": tokenizer["tgt_model"] or tokenizer["src_model"]}


def check_same_vocabulary(
    first: Union[str, Path], first_payload: Dict[str, Any], other: Union[str, Path], payload: Dict[str, Any]
) -> None:
    """Members of an ensemble read and write the same subword ids: the same SentencePiece model(s)
    on both sides. ``CheckpointError`` naming the two checkpoints and the side that differs."""
    mine, theirs = vocabularies(first_payload["tokenizer"]), vocabularies(payload["tokenizer"])
    for side in ("target", "source"):
        if mine[side] != theirs[side]:
            raise CheckpointError(
                f"checkpoints {first} and {other} have different {side} vocabularies (other SentencePiece "
                "models): an ensemble needs one; train its runs on the same data and tokenizer options "
                "(the runs of one sweep share theirs)"
            )


def trained_with_guidance(payload: Dict[str, Any]) -> bool:
    """Whether a checkpoint's run trained with guided alignment (``trainer.guided_alignment`` > 0)."""
    trainer = (payload.get("config") or {}).get("trainer") or {}
    return float(trainer.get("guided_alignment") or 0.0) > 0


def checkpoint_method(payload: Dict[str, Any]) -> Method:
    """How a checkpoint's model aligns when no method is chosen (``alignment.method.default_method``)."""
    return default_method(config_from_dict(dict(payload["model_config"])), trained_with_guidance(payload))


def shared_method(payloads: Sequence[Dict[str, Any]]) -> Method:
    """The default alignment method of checkpoints decoding together: their own when they share it,
    else ``DEFAULT_METHOD``."""
    methods = {checkpoint_method(payload) for payload in payloads}
    return methods.pop() if len(methods) == 1 else DEFAULT_METHOD


class TorchEngine:
    """Our own search (``models.search``) over a model on one device: the engine of a checkpoint.

    An engine (this one, or ``inference.ctranslate2_engine.CTranslate2Engine``) has ``decode(batch,
    options, attention)`` (each source's n-best hypotheses; ``attention``: alignments will be asked
    of them), ``check_method(method)`` (a one-line ``ValueError`` for a method it cannot align by)
    and ``align(batch, found, method)`` (each hypothesis's ``(T, S)`` source attention).

    ``amp`` and ``tf32``: the precision of ``common.device.use_precision``, as in training; ``method``:
    how it aligns when no method is chosen (a model trained with guided alignment: its supervised heads)."""

    def __init__(
        self,
        model: nn.Module,
        device: torch.device,
        amp: bool = False,
        tf32: bool = False,
        method: Method = DEFAULT_METHOD,
    ):
        self.model, self.device, self.method = model.eval(), device, method
        self.max_positions: Optional[int] = getattr(model, "max_positions", None)  # None: no limit
        self.autocast = use_precision(device, amp, tf32)
        self.dtype = precision_name(device, amp, tf32)

    def decode(
        self, batch: List[List[int]], options: SearchOptions, attention: bool = False
    ) -> List[List[Hypothesis]]:
        """The n-best hypotheses of a batch of source id lists (EOS included). The search is the same
        with ``attention``: ``align`` reads the attention from a pass over the hypotheses."""
        src = pad(batch, PAD_ID).to(self.device)  # (B, S)
        src_mask = source_mask(src)  # (B, S)
        with self.autocast():
            return search(self.model, src, src_mask, BOS_ID, EOS_ID, options, pad_id=PAD_ID)

    def members(self) -> List[nn.Module]:
        """The models that decode: the ensemble's members, or the one model."""
        return list(self.model.members) if isinstance(self.model, Ensemble) else [self.model]

    def check_method(self, method: Optional[Method]) -> None:
        """A one-line ``ValueError`` when a member has no such layer or head (None: the engine's method)."""
        members = self.members()
        for number, model in enumerate(members, start=1):
            cross = model.attention_modules()["cross"]
            try:
                (method or self.method).check(len(cross), cross[0].n_heads)
            except ValueError as error:
                which = f"ensemble member {number} ({model.cfg.name}): " if len(members) > 1 else ""
                raise ValueError(which + str(error)) from None

    def align(
        self, batch: List[List[int]], found: List[List[Hypothesis]], method: Optional[Method]
    ) -> List[List[Tensor]]:
        """Each hypothesis's ``(T, S)`` source attention by ``method`` (None: the engine's method), per
        source of ``batch``: every hypothesis fed teacher-forced
        (``alignment.forced``), the members' maps averaged."""
        sources = [src for src, hyps in zip(batch, found) for _ in hyps]
        tokens = [hyp.tokens for hyps in found for hyp in hyps]
        per_member = []
        for model in self.members():
            with self.autocast():
                maps = batched_cross_maps(model, sources, tokens)  # (L, H, T + 1, S) each
            chosen = method or self.method
            per_member.append([method_map(m, chosen) for m in maps])  # (T, S) each
        rows = iter([torch.stack(maps).mean(dim=0) for maps in zip(*per_member)])  # (T, S) each
        return [[next(rows) for _ in hyps] for hyps in found]


class Translator:
    """An engine and its tokenizer, turning lists of sentences into translations.

    The engine decodes batches of source ids into ``models.search.Hypothesis`` lists: our own search
    over a checkpoint's model (``TorchEngine``), or CTranslate2 over an export
    (``inference.ctranslate2_engine``). Everything around it (tokenizing, batching, blank lines, long
    inputs, detokenizing, alignments) is this class, the same for both.
    """

    def __init__(self, engine: Any, tokenizer: Tokenizer, alpha: float = 1.0):
        self.engine, self.tokenizer = engine, tokenizer
        self.alpha = alpha  # the default length penalty of ``translate``

    @property
    def dtype(self) -> str:
        """The precision of the engine's decoding: ``float32``, ``tf32``, ``bfloat16``, or CTranslate2's
        compute type."""
        return self.engine.dtype

    @classmethod
    def from_checkpoint(
        cls,
        path: Union[str, Path],
        device: Union[None, str, torch.device] = None,
        dtype: Optional[str] = None,
    ) -> "Translator":
        """Load a checkpoint of train.py (``common.checkpoint.CheckpointError`` when it cannot).

        ``device``: None or ``"auto"`` (CUDA when there is one), ``"cpu"``, ``"cuda:N"`` or a torch
        device. ``dtype``: None or ``"auto"`` decodes in the precision the run was validated and
        tested in (the checkpoint's ``precision``: bf16 autocast for a run with ``trainer.amp`` on
        CUDA or on a CPU with native bf16, else float32), as its ``results.json`` scores were, except
        that bf16 decodes in float32 on a CPU without native bf16; ``"float32"`` or ``"bfloat16"``
        choose. The default length penalty is the run's ``trainer.length_penalty``,
        else 1.0.
        """
        return cls.from_checkpoints([path], device, dtype)

    @classmethod
    def from_checkpoints(
        cls,
        paths: Sequence[Union[str, Path]],
        device: Union[None, str, torch.device] = None,
        dtype: Optional[str] = None,
    ) -> "Translator":
        """One checkpoint as ``from_checkpoint``; several decode as an ensemble
        (``models.ensemble.Ensemble``: the mean of their log-probabilities at every step, each model
        with its own decoder state), which needs one vocabulary: checkpoints trained with other
        SentencePiece models are a ``CheckpointError`` naming them. The ensemble's defaults: the
        mean of the runs' length penalties; ``dtype`` auto decodes in bf16 only when every run
        was validated in it."""
        if isinstance(paths, (str, Path)):
            raise TypeError("Translator.from_checkpoints takes a list of paths: wrap the path in [ ]")
        if not paths:
            raise ValueError("Translator.from_checkpoints: no checkpoint given")
        device = pick_device("auto" if device is None else str(device))
        loaded = [load_model(Path(path), device) for path in paths]
        for path, (_, _, payload) in zip(paths[1:], loaded[1:]):
            check_same_vocabulary(paths[0], loaded[0][2], path, payload)
        models = [model for model, _, _ in loaded]
        payloads = [payload for _, _, payload in loaded]
        model = models[0] if len(models) == 1 else Ensemble(models)
        engine = TorchEngine(
            model, device, **shared_precision(dtype, payloads, device), method=shared_method(payloads)
        )
        return cls(engine, loaded[0][1], mean_alpha(payloads))

    def translate(
        self,
        sentences: Sequence[str],
        beam: int = 5,
        alpha: Optional[float] = None,
        nbest: int = 1,
        alignments: bool = False,
        align_method: Optional[Method] = None,
        batch_size: Optional[int] = None,
        max_len_ratio: float = MAX_LEN_RATIO,
        max_len_extra: int = MAX_LEN_EXTRA,
        first_line: int = 1,
        tags: bool = False,
        progress: Optional[Callable[[int], object]] = None,
    ) -> List[Translation]:
        """One ``Translation`` per sentence, in the input order, with its ``nbest`` best hypotheses.

        ``beam`` 1 is greedy search; ``alpha`` the GNMT length penalty (None: the run's);
        ``alignments`` adds Pharaoh word alignments and word attention, by ``align_method`` (a
        layer, heads and reading: ``alignment.forced``; None: the model's, ``DEFAULT_METHOD`` unless it
        was trained with guided alignment, whose supervised heads align then);
        the longest output is
        ``max_len_ratio`` x source tokens + ``max_len_extra``. Warnings name sentence ``i`` as line
        ``first_line + i``. ``tags``: the sentences hold inline markup (``inference/markup.py``),
        translated without it and carried into each hypothesis's text by its word alignment (the
        ``alignment`` is of the words without tags). ``progress(n)`` is called as each batch of ``n``
        sentences is done (a progress bar's ``update``). Bad arguments, and markup that is not well
        formed, raise ``ValueError`` before anything is decoded.
        """
        if isinstance(sentences, str):
            raise TypeError("Translator.translate takes a list of sentences, not one string: wrap it in [ ]")
        if tags:  # the text without its markup, with alignments (``alignments`` is implied)
            return self.translate_tagged(
                sentences,
                first_line,
                beam=beam,
                alpha=alpha,
                nbest=nbest,
                align_method=align_method,
                batch_size=batch_size,
                max_len_ratio=max_len_ratio,
                max_len_extra=max_len_extra,
                progress=progress,
            )
        options = SearchOptions(
            beam_size=beam,
            alpha=self.alpha if alpha is None else alpha,
            nbest=nbest,
            max_len_ratio=max_len_ratio,
            max_len_extra=max_len_extra,
        )
        batch_size = default_batch_size(self.engine) if batch_size is None else batch_size
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: must be at least 1")
        if alignments:
            self.check_alignment(align_method)
        results = [blank_translation(alignments) for _ in sentences]
        todo = [i for i, sentence in enumerate(sentences) if not is_blank(sentence)]
        ids = self.encode([sentences[i] for i in todo], [first_line + i for i in todo])
        if progress is not None and len(todo) < len(sentences):
            progress(len(sentences) - len(todo))  # the blank lines: nothing to decode
        for chunk in length_batches([len(row) for row in ids], batch_size):
            batch = [ids[k] for k in chunk]
            found = self.engine.decode(batch, options, attention=alignments)
            maps = self.engine.align(batch, found, align_method) if alignments else [None] * len(found)
            for k, hyps, rows in zip(chunk, found, maps):
                results[todo[k]] = self.result(ids[k], hyps, rows)
            if progress is not None:
                progress(len(chunk))
        return results

    def translate_tagged(
        self, sentences: Sequence[str], first_line: int, **options: Any
    ) -> List[Translation]:
        """``translate(sentences, tags=True, ...)``: the markup taken out, the text translated with
        alignments, the tags carried into every hypothesis."""
        markups = []
        for number, sentence in enumerate(sentences, start=first_line):
            try:
                markups.append(parse_markup(sentence))
            except MarkupError as error:
                raise MarkupError(f"line {number}: {error}") from None
        texts = [markup.text for markup in markups]
        results = self.translate(texts, alignments=True, first_line=first_line, **options)
        return [with_tags(result, markup) for result, markup in zip(results, markups)]

    def check_alignment(self, method: Optional[Method]) -> None:
        """A one-line ``ValueError`` when the engine cannot align by ``method`` (None: the default
        method), before anything is decoded."""
        self.engine.check_method(method)

    def encode(self, sentences: Sequence[str], numbers: Sequence[int]) -> List[List[int]]:
        """Source ids with EOS; a sentence too long for the model is cut, with a warning naming its line."""
        if not sentences:
            return []
        limit = self.engine.max_positions  # source ids, EOS included (None: no limit)
        encoded = []
        for number, ids in zip(numbers, self.tokenizer.encode_src(sentences)):
            if limit is not None and len(ids) + 1 > limit:
                log.warning(
                    "line %d: %d subword tokens, more than the model takes (%d); translating the first %d",
                    number,
                    len(ids),
                    limit - 1,
                    limit - 1,
                )
                ids = ids[: limit - 1]
            encoded.append(ids + [EOS_ID])
        return encoded

    def result(self, src_ids: List[int], hyps: List[Hypothesis], maps: Optional[List[Tensor]]) -> Translation:
        """The ``Translation`` of one sentence: its best hypothesis, and all of them in ``nbest``
        (with ``maps``, each hypothesis's ``(T, S)`` source attention, their alignments)."""
        texts = detokenize(self.tokenizer, hyps)
        maps = maps or [None] * len(hyps)
        found = [self.describe(src_ids, hyp, text, rows) for hyp, text, rows in zip(hyps, texts, maps)]
        return replace(found[0], nbest=found)

    def describe(self, src_ids: List[int], hyp: Hypothesis, text: str, rows: Optional[Tensor]) -> Translation:
        """One hypothesis with its text and, given its ``(T, S)`` source attention ``rows``, its word
        attention and alignment."""
        if rows is None:
            return Translation(text, hyp.score, finished=hyp.finished)
        src_pieces = self.tokenizer.src_pieces(src_ids[:-1])  # without EOS
        out_pieces = self.tokenizer.tgt_pieces(hyp.tokens)
        words, links = word_links(rows, src_pieces, out_pieces)  # (W_tgt, W_src), [(i, j)]
        return Translation(
            text,
            hyp.score,
            links,
            words=words,
            src_words=piece_words(src_pieces),
            out_words=piece_words(out_pieces),
            finished=hyp.finished,
        )
