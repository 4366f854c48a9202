"""SentencePiece subword tokenization: train once per (training text, options), cache, encode, decode.

Special ids are fixed for every model (``data/specials.py``): pad 0, unk 1, bos 2, eos 3.

Normalization is SentencePiece's ``nmt_nfkc``: Unicode NFKC plus whitespace clean-up (runs of
spaces become one, leading and trailing spaces go). Case and punctuation are kept, so decoding
gives detokenized text that sacrebleu compares with the raw references. ``decode(encode(x))``
equals ``normalize(x)`` below (NFKC also turns compatibility characters such as ``…`` or full-width
forms into their plain equivalents).
"""

import hashlib
import io
import json
import logging
import math
import random
import time
import unicodedata
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import sentencepiece as spm

from common.files import AtomicFile
from data.errors import DataError
from data.specials import BOS_ID, EOS_ID, PAD_ID, UNK_ID

log = logging.getLogger(__name__)


def normalize(text: str) -> str:
    """What a sentence looks like after a round trip through the tokenizer (NFKC, single spaces)."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


class Tokenizer:
    """Source and target SentencePiece models; one shared model when the vocabulary is joint.

    Built from the models' bytes, which is also what checkpoints store (``state_dict``), so a
    checkpoint alone can tokenize and detokenize.
    """

    def __init__(self, src_model: bytes, tgt_model: Optional[bytes] = None):
        self.src_model = src_model
        self.tgt_model = tgt_model  # None: joint vocabulary, the source model serves both sides
        self.src = spm.SentencePieceProcessor(model_proto=src_model)
        self.tgt = self.src if tgt_model is None else spm.SentencePieceProcessor(model_proto=tgt_model)
        self._scores: Dict[int, List[float]] = {}  # piece log probabilities, for sampling

    @property
    def joint(self) -> bool:
        return self.tgt_model is None

    @property
    def src_vocab_size(self) -> int:
        return self.src.get_piece_size()

    @property
    def tgt_vocab_size(self) -> int:
        return self.tgt.get_piece_size()

    def encode_src(self, texts: Sequence[str]) -> List[List[int]]:
        return self.src.encode(list(texts), out_type=int)

    def encode_tgt(self, texts: Sequence[str]) -> List[List[int]]:
        return self.tgt.encode(list(texts), out_type=int)

    def sample_src(self, text: str, alpha: float, seed: int) -> List[int]:
        """One segmentation of ``text`` sampled with ``alpha``, the same for the same ``seed``."""
        return sample(self.src, self.piece_scores(self.src), text, alpha, seed)

    def sample_tgt(self, text: str, alpha: float, seed: int) -> List[int]:
        return sample(self.tgt, self.piece_scores(self.tgt), text, alpha, seed)

    def piece_scores(self, model: spm.SentencePieceProcessor) -> List[float]:
        """The log probability of every piece of ``model`` (once per model)."""
        if id(model) not in self._scores:
            self._scores[id(model)] = [model.get_score(i) for i in range(model.get_piece_size())]
        return self._scores[id(model)]

    def decode_src(self, ids: Sequence[Sequence[int]]) -> List[str]:
        return self.src.decode([list(seq) for seq in ids])

    def decode_tgt(self, ids: Sequence[Sequence[int]]) -> List[str]:
        """Detokenized text of target id sequences (pad, BOS and EOS decode to nothing)."""
        return self.tgt.decode([list(seq) for seq in ids])

    def src_pieces(self, ids: Sequence[int]) -> List[str]:
        """Subword pieces of source ids (EOS shown as ``</s>``), e.g. for attention plot axes."""
        return [self.src.id_to_piece(int(i)) for i in ids]

    def tgt_pieces(self, ids: Sequence[int]) -> List[str]:
        return [self.tgt.id_to_piece(int(i)) for i in ids]

    def state_dict(self) -> Dict[str, Optional[bytes]]:
        return {"src_model": self.src_model, "tgt_model": self.tgt_model}

    @classmethod
    def from_state_dict(cls, state: Dict[str, Optional[bytes]]) -> "Tokenizer":
        return cls(state["src_model"], state["tgt_model"])


NBEST = 64  # the segmentations that sampling draws from (Kudo 2018's l-best sampling, l = 64)
SAMPLE = "numpy-exact-1"  # how sample_sentences draws: part of the cache key


def sample(
    model: spm.SentencePieceProcessor, scores: List[float], text: str, alpha: float, seed: int
) -> List[int]:
    """One of the ``NBEST`` most likely segmentations of ``text`` under a unigram model, drawn with
    probability proportional to ``P(segmentation) ** alpha`` (``scores``: each piece's log
    probability) from a generator seeded with ``seed``. SentencePiece's own sampling cannot be
    seeded reproducibly across processes, which exact resume needs; this draw is ours."""
    candidates = model.nbest_encode_as_ids(text, nbest_size=NBEST)
    if len(candidates) < 2:
        return candidates[0] if candidates else []
    log_weights = [alpha * sum(scores[i] for i in ids) for ids in candidates]
    top = max(log_weights)
    weights = [math.exp(w - top) for w in log_weights]
    return random.Random(seed).choices(candidates, weights)[0]


def spm_options(vocab_size: int, model_type: str) -> Dict[str, object]:
    """SentencePiece trainer options: the fixed special ids, case- and punctuation-preserving."""
    return {
        "vocab_size": vocab_size,
        "model_type": model_type,
        "pad_id": PAD_ID,
        "unk_id": UNK_ID,
        "bos_id": BOS_ID,
        "eos_id": EOS_ID,
        "character_coverage": 1.0,
        "byte_fallback": True,  # unseen characters become byte pieces, not <unk>
        "normalization_rule_name": "nmt_nfkc",
        "input_sentence_size": 1_000_000,  # at most this many sentences, drawn by sample_sentences
        "shuffle_input_sentence": True,
        "num_threads": 2,
    }


def train_model(lines: Iterable[str], options: Dict[str, object]) -> bytes:
    """Train one SentencePiece model on ``lines`` and return its bytes."""
    spm.set_random_generator_seed(1)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_writer=model, minloglevel=2, **options
        )
    except RuntimeError as error:
        message = (str(error).strip().splitlines() or ["SentencePiece training failed"])[-1]
        message = message.split("] ", 1)[-1].strip()  # drop SentencePiece's source location
        if "too high" in message:  # "Vocabulary size too high (N). Please set it to a value <= M."
            advice = "lower data.vocab_size"
        elif "smaller than required" in message:  # too few pieces for the characters + byte pieces
            advice = "raise data.vocab_size"
        else:
            raise DataError(f"SentencePiece training failed: {message}") from None
        raise DataError(
            f"data.vocab_size={options['vocab_size']} does not fit this training data ({message}); {advice}"
        ) from None
    return model.getvalue()


def cache_key(pairs: Iterable[Tuple[str, str]], options: Dict[str, object], joint: bool) -> Tuple[str, int]:
    """Hash of the training text, the options, the sampling and the SentencePiece version (same
    inputs, same model), and the number of pairs."""
    settings = {k: v for k, v in options.items() if k != "num_threads"}  # threads do not change the model
    settings.update(joint=joint, sentencepiece=spm.__version__, sample=SAMPLE)
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    count = 0
    for src, tgt in pairs:
        digest.update(src.encode("utf-8") + b"\0" + tgt.encode("utf-8") + b"\n")
        count += 1
    return digest.hexdigest()[:16], count


def sample_sentences(sentences: Iterable[str], total: int, limit: int, seed: int = 1) -> Iterator[str]:
    """Exactly ``limit`` of the ``total`` sentences (all of them when there are no more), chosen by
    NumPy's generator seeded with ``seed``: the same sample in every process. SentencePiece samples
    ``input_sentence_size`` sentences itself otherwise, differently in each process."""
    if total <= limit:
        yield from sentences
        return
    chosen = np.sort(np.random.default_rng(seed).choice(total, size=limit, replace=False))  # (limit,)
    position = 0
    for index, sentence in enumerate(sentences):
        if position < limit and index == chosen[position]:
            position += 1
            yield sentence


def build_tokenizer(
    pairs: Iterable[Tuple[str, str]], vocab_size: int, joint: bool, model_type: str, cache_dir: str
) -> Tokenizer:
    """Train SentencePiece on the training pairs, or load the models cached for the same input.

    ``pairs`` is read more than once (a list, or a stream that reads its files anew each time):
    once for the cache key, then by the training, which gets a sample of ``input_sentence_size``
    sentences (``sample_sentences``), so the text is never held whole."""
    options = spm_options(vocab_size, model_type)
    key, count = cache_key(pairs, options, joint)
    folder = Path(cache_dir) / "spm" / key
    names = ["joint.model"] if joint else ["src.model", "tgt.model"]
    paths = [folder / name for name in names]
    if all(path.is_file() for path in paths):
        log.info("tokenizer: using the cached SentencePiece model(s) in %s", folder)
        return Tokenizer(*(path.read_bytes() for path in paths))
    start = time.perf_counter()
    limit = int(options["input_sentence_size"])
    if joint:
        sentences = (text for pair in pairs for text in pair)
        models = [train_model(sample_sentences(sentences, 2 * count, limit), options)]
    else:
        models = [
            train_model(sample_sentences((src for src, _ in pairs), count, limit), options),
            train_model(sample_sentences((tgt for _, tgt in pairs), count, limit), options),
        ]
    folder.mkdir(parents=True, exist_ok=True)
    for path, model in zip(paths, models):
        with AtomicFile(path, "wb") as out:  # a cached model is always complete
            out.write(model)
    log.info(
        "tokenizer: trained %s SentencePiece model(s) in %.1f s, saved in %s",
        model_type,
        time.perf_counter() - start,
        folder,
    )
    return Tokenizer(*models)
