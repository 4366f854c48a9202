"""An evaluation during training: validation loss and perplexity, greedy BLEU and chrF, attention
images and the attention viewer's maps, sample translations; the scores decide ``best.pt`` and
early stopping."""

import logging
from typing import Callable, ContextManager, Dict, List, Tuple

import torch
from torch import nn

from data.corpus import VALID
from data.pipeline import PreparedData
from inference.decoding import decode_ids, detokenize, output_attention
from models.search import Hypothesis
from training.board import Board
from training.evaluate import validation_loss
from training.metrics import corpus_scores
from training.progress import Progress
from viewer.summaries import Texts

log = logging.getLogger(__name__)


def validate(
    model: nn.Module,
    data: PreparedData,
    batch_tokens: int,
    device: torch.device,
    autocast: Callable[[], ContextManager],
) -> Tuple[Dict[str, float], List[Hypothesis], List[str]]:
    """Scores of the validation split (loss, ppl, bleu, chrf), its greedy hypotheses and their text."""
    valid = data.datasets[VALID]
    scores = validation_loss(model, valid, batch_tokens, device, autocast)
    found = decode_ids(model, valid, batch_tokens, device, 1, autocast=autocast)
    hyps = detokenize(data.tokenizer, found)
    scores.update(corpus_scores(hyps, data.references[VALID]))
    return scores, found, hyps


def record(p: Progress, scores: Dict[str, float], epochs: float) -> bool:
    """Add an evaluation to the history and the early-stopping count; whether it is the best so far."""
    improved = scores["bleu"] > p.best_bleu
    if improved:
        p.best_bleu, p.evals_without_improvement = scores["bleu"], 0
    else:
        p.evals_without_improvement += 1
    p.history.append(dict(scores, step=p.step, epoch=epochs))
    return improved


def draw_samples(
    board: Board,
    model: nn.Module,
    data: PreparedData,
    found: List[Hypothesis],
    hyps: List[str],
    n: int,
    step: int,
    device: torch.device,
) -> None:
    """Attention images, the attention viewer's maps and sample text of the first ``n`` validation
    sentences.

    The model's own greedy output ids are fed back teacher-forced, so each image row is the
    attention with which it produced that output token (EOS last when it emitted one).
    """
    n = min(n, len(hyps))
    if n == 0:
        return
    tok = data.tokenizer
    attention, src_ids, out_ids = output_attention(model, data.datasets[VALID], found[:n], device)
    src_tokens = [tok.src_pieces(ids) for ids in src_ids]
    tgt_tokens = [tok.tgt_pieces(ids) for ids in out_ids]
    sources, references = data.sources[VALID][:n], data.references[VALID][:n]
    board.attention(attention, src_tokens, tgt_tokens, step)
    texts = [Texts(*sentence) for sentence in zip(sources, references, hyps[:n])]
    board.attention_summaries(model.cfg.name, attention, src_tokens, tgt_tokens, texts, step)
    board.samples(sources, references, hyps[:n], step)


def log_scores(p: Progress, scores: Dict[str, float], improved: bool, seconds: float) -> None:
    log.info(
        "valid step %d: loss %.3f ppl %.2f BLEU %.2f chrF %.2f%s (%.0f s)",
        p.step,
        scores["loss"],
        scores["ppl"],
        scores["bleu"],
        scores["chrf"],
        (
            " *best*"
            if improved
            else f" (best {p.best_bleu:.2f}, {p.evals_without_improvement} without improvement)"
        )
        + (f"; EMA BLEU {scores['ema_bleu']:.2f}" if "ema_bleu" in scores else ""),
        seconds,
    )
