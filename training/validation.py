"""An evaluation during training: validation loss and perplexity, greedy BLEU and chrF, attention
images and the attention viewer's maps, each attention's entropy (and a line when a cross-attention
collapses), sample translations; the scores decide ``best.pt`` and early stopping. Corpus BLEU and
chrF are sacrebleu's, on detokenized text against the raw references (the test splits are scored
by the same ``corpus_scores``)."""

import logging
import math
from collections import defaultdict
from contextlib import nullcontext
from typing import Dict, List, NamedTuple, Sequence, Set, Tuple

import torch
from sacrebleu.metrics import BLEU, CHRF
from torch import nn

from alignment.heads import Key, loss_and_entropy
from common.collapse import COLLAPSE_NATS
from common.progress_bar import progress_bar
from data.batching import ParallelDataset, ordered_batches
from data.corpus import VALID
from data.pipeline import PreparedData
from data.specials import PAD_ID
from inference.decoding import decode_ids, detokenize, output_attention
from models.search import Hypothesis
from training.board import Board
from training.progress import Progress
from training.setup import Setup
from training.step import label_smoothed_nll
from viewer.summaries import Texts

log = logging.getLogger(__name__)

# The entropy of every attention's weights (nats, the mean over real query rows, teacher-forced) is
# measured at each evaluation on the first ENTROPY_PAIRS validation pairs; a cross-attention head
# under COLLAPSE_NATS has collapsed (common/collapse.py).
ENTROPY_PAIRS = 200


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> Dict[str, float]:
    """``{"bleu": ..., "chrf": ...}`` of one hypothesis per reference (one reference stream)."""
    if len(hypotheses) != len(references):
        # sacrebleu zips the two silently: a length mismatch would give a meaningless score.
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    refs: List[List[str]] = [list(references)]
    return {
        "bleu": BLEU().corpus_score(list(hypotheses), refs).score,
        "chrf": CHRF().corpus_score(list(hypotheses), refs).score,
    }


def signatures() -> Dict[str, str]:
    """sacrebleu's signatures of the two metrics as ``corpus_scores`` computes them (one reference)."""
    bleu, chrf = BLEU(), CHRF()
    bleu.corpus_score(["a"], [["a"]])  # the signature needs the number of references: score once
    chrf.corpus_score(["a"], [["a"]])
    return {"bleu": str(bleu.get_signature()), "chrf": str(chrf.get_signature())}


@torch.no_grad()
def validation_loss(
    model: nn.Module, dataset: ParallelDataset, batch_tokens: int, device: torch.device, autocast=nullcontext
) -> Dict[str, float]:
    """Per-token NLL (no label smoothing) and perplexity of the references."""
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)  # summed on the device: one sync at the end
    tokens = torch.zeros((), dtype=torch.int64, device=device)
    for batch in ordered_batches(dataset, batch_tokens):
        batch = batch.to(device)
        with autocast():
            logits, _ = model(batch.src, batch.src_mask, batch.tgt_in)  # (B, T, V)
        _, nll, n = label_smoothed_nll(logits, batch.tgt_out, PAD_ID, 0.0)
        total, tokens = total + nll, tokens + n
    loss = float(total) / max(int(tokens), 1)
    return {"loss": loss, "ppl": math.exp(min(loss, 50.0))}


def validate(setup: Setup) -> Tuple[Dict[str, float], List[Hypothesis], List[str]]:
    """Scores of the validation split (loss, ppl, bleu, chrf), its greedy hypotheses and their text."""
    model, valid, batch_tokens, device = (
        setup.model,
        setup.data.datasets[VALID],
        setup.eval_batch_tokens,
        setup.device,
    )
    scores = validation_loss(model, valid, batch_tokens, device, setup.autocast)
    with progress_bar(len(valid), "validation: greedy decoding", "sentences") as bar:
        found = decode_ids(
            model, valid, batch_tokens, device, 1, autocast=setup.autocast, progress=bar.update
        )
    hyps = detokenize(setup.data.tokenizer, found)
    scores.update(corpus_scores(hyps, setup.data.references[VALID]))
    return scores, found, hyps


def attention_entropy(model: nn.Module, dataset: ParallelDataset, batch_tokens: int) -> Dict[Key, float]:
    """Every head's mean entropy over the first ``ENTROPY_PAIRS`` pairs of ``dataset``."""
    n = min(ENTROPY_PAIRS, len(dataset))
    first = ParallelDataset([dataset.src[i] for i in range(n)], [dataset.tgt[i] for i in range(n)])
    return loss_and_entropy(model, list(ordered_batches(first, batch_tokens)))[1]


def entropy_scalars(entropy: Dict[Key, float]) -> Dict[str, float]:
    """TensorBoard scalars of ``attention_entropy``: each attention kind's mean per layer
    (``entropy/<kind>/layer<l>``) and each cross-attention head (``entropy/cross/layer<l>/head<h>``)."""
    layers: Dict[Tuple[str, int], List[float]] = defaultdict(list)
    for (kind, layer, _), value in entropy.items():
        layers[kind, layer].append(value)
    scalars = {f"entropy/{kind}/layer{layer}": sum(v) / len(v) for (kind, layer), v in layers.items()}
    heads = {(layer, head): v for (kind, layer, head), v in entropy.items() if kind == "cross"}
    return scalars | {f"entropy/cross/layer{layer}/head{head}": v for (layer, head), v in heads.items()}


def collapsed_heads(entropy: Dict[Key, float]) -> List[Tuple[int, int, float]]:
    """``(layer, head, entropy)`` of every cross-attention head under ``COLLAPSE_NATS``."""
    found = sorted(entropy.items())
    return [(layer, head, v) for (kind, layer, head), v in found if kind == "cross" and v < COLLAPSE_NATS]


def collapse_line(layer: int, head: int, nats: float) -> str:
    """What ``train.log`` says when a cross-attention head collapses, and what to try."""
    return (
        f"cross-attention layer {layer} head {head} collapsed: mean entropy {nats:.3f} nats on the first "
        f"{ENTROPY_PAIRS} validation pairs (under {COLLAPSE_NATS}), nearly all its weight on one source "
        "position; try a lower trainer.lr, or model.qk_norm=true for a dot-product score"
    )


def watch_entropy(
    board: Board,
    model: nn.Module,
    dataset: ParallelDataset,
    batch_tokens: int,
    step: int,
    said: Set[Tuple[int, int]],
) -> None:
    """Every attention's entropy on ``dataset`` as scalars, and a line for each cross-attention head
    that has collapsed and is not in ``said`` (the heads said before in this run; added to it)."""
    entropy = attention_entropy(model, dataset, batch_tokens)
    board.scalars(entropy_scalars(entropy), step)
    for layer, head, nats in collapsed_heads(entropy):
        if (layer, head) not in said:
            said.add((layer, head))
            log.warning(collapse_line(layer, head, nats))


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
    attention, src_ids, out_ids = output_attention(model, data.datasets[VALID], found[:n])
    src_tokens = [tok.src_pieces(ids) for ids in src_ids]
    tgt_tokens = [tok.tgt_pieces(ids) for ids in out_ids]
    sources, references = data.sources[VALID][:n], data.references[VALID][:n]
    board.attention(attention, src_tokens, tgt_tokens, step)
    texts = [Texts(*sentence) for sentence in zip(sources, references, hyps[:n])]
    board.attention_summaries(model.cfg.name, attention, src_tokens, tgt_tokens, texts, step)
    board.samples(sources, references, hyps[:n], step)


class EvalSeconds(NamedTuple):
    """Where an evaluation's time went: scoring the validation split (its loss and greedy
    decoding), the attention (entropy, images and samples for TensorBoard), the checkpoint writes."""

    scoring: float
    attention: float
    checkpoints: float

    def __str__(self) -> str:
        return (
            f"{sum(self):.0f} s: scoring {self.scoring:.1f}, attention {self.attention:.1f}, "
            f"checkpoints {self.checkpoints:.1f}"
        )


def log_scores(p: Progress, scores: Dict[str, float], improved: bool, seconds: EvalSeconds) -> None:
    log.info(
        "valid step %d: loss %.3f ppl %.2f BLEU %.2f chrF %.2f%s (%s)",
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
