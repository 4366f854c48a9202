"""Evaluation: teacher-forced validation loss and decoding whole splits back to text."""
import math
from contextlib import nullcontext
from typing import Dict, Iterator, List

import torch
from torch import nn

from data.batching import Batch, ParallelDataset, TokenBucketSampler, collate
from data.specials import BOS_ID, EOS_ID, PAD_ID
from data.tokenizer import Tokenizer
from models.masks import padding_mask_from_lengths
from models.search import Hypothesis, beam_search, greedy_search
from training.loss import label_smoothed_nll


def ordered_batches(dataset: ParallelDataset, batch_tokens: int) -> Iterator[Batch]:
    """Length-sorted batches of a whole split (``Batch.indices`` restore the input order)."""
    sampler = TokenBucketSampler(dataset.src_lengths(), dataset.tgt_lengths(), batch_tokens, shuffle=False)
    for indices in sampler:
        yield collate([dataset[i] for i in indices])


def src_mask_of(batch: Batch) -> torch.Tensor:
    return padding_mask_from_lengths(batch.src_lengths, batch.src.size(1))  # (B, S)


@torch.no_grad()
def validation_loss(model: nn.Module, dataset: ParallelDataset, batch_tokens: int, device: torch.device, autocast=nullcontext) -> Dict[str, float]:
    """Per-token NLL (no label smoothing) and perplexity of the references."""
    model.eval()
    total, tokens = 0.0, 0
    for batch in ordered_batches(dataset, batch_tokens):
        batch = batch.to(device)
        with autocast():
            logits, _ = model(batch.src, src_mask_of(batch), batch.tgt_in)  # (B, T, V)
        _, nll, n = label_smoothed_nll(logits, batch.tgt_out, PAD_ID, 0.0)
        total, tokens = total + float(nll), tokens + n
    loss = total / max(tokens, 1)
    return {"loss": loss, "ppl": math.exp(min(loss, 50.0))}


@torch.no_grad()
def decode_ids(
    model: nn.Module, dataset: ParallelDataset, batch_tokens: int, device: torch.device,
    beam_size: int = 1, alpha: float = 1.0, autocast=nullcontext,
) -> List[Hypothesis]:
    """The best hypothesis of every source sentence, in the split's order (greedy when ``beam_size`` is 1)."""
    model.eval()
    results: List[Hypothesis] = [None] * len(dataset)  # type: ignore[list-item]
    # Beam search runs K hypotheses per sentence: keep the batch's memory about the same.
    for batch in ordered_batches(dataset, max(batch_tokens // max(beam_size, 1), 64)):
        batch = batch.to(device)
        with autocast():
            if beam_size == 1:
                hyps = greedy_search(model, batch.src, src_mask_of(batch), BOS_ID, EOS_ID)
            else:
                hyps = [n[0] for n in beam_search(model, batch.src, src_mask_of(batch), BOS_ID, EOS_ID, beam_size, alpha)]
        for index, hyp in zip(batch.indices.tolist(), hyps):
            results[index] = hyp
    return results


def translate_split(
    model: nn.Module, dataset: ParallelDataset, tokenizer: Tokenizer, batch_tokens: int, device: torch.device,
    beam_size: int = 1, alpha: float = 1.0, autocast=nullcontext,
) -> List[str]:
    """Detokenized translations of a split, in its order."""
    hyps = decode_ids(model, dataset, batch_tokens, device, beam_size, alpha, autocast)
    return tokenizer.decode_tgt([h.tokens for h in hyps])
