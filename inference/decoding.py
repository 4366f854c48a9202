"""Decoding whole splits: length-sorted batches, the best hypothesis of every sentence by beam or
greedy search, its text (the Translator's ``detokenize``, so a split's text is ``translate.py``'s),
and the attention a model gives its own outputs."""

from contextlib import nullcontext
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from alignment.forced import forced_attention
from data.batching import ParallelDataset, ordered_batches
from data.specials import BOS_ID, EOS_ID, PAD_ID
from data.tokenizer import Tokenizer
from inference.translator import detokenize
from models.search import Hypothesis, search
from models.search_options import SearchOptions

# Tokens per decoding batch on a GPU at least: a search step there costs about the same for 64
# sentences as for thousands (its time is the kernel launches and the host, not the arithmetic), so
# a whole validation split goes in a batch or two.
GPU_BATCH_TOKENS = 32768


def batch_tokens_for(device: torch.device, batch_tokens: int) -> int:
    """Tokens per decoding batch: ``batch_tokens`` on the CPU, at least ``GPU_BATCH_TOKENS`` on a GPU."""
    return batch_tokens if device.type == "cpu" else max(batch_tokens, GPU_BATCH_TOKENS)


@torch.no_grad()
def decode_ids(
    model: nn.Module,
    dataset: ParallelDataset,
    batch_tokens: int,
    device: torch.device,
    beam_size: int = 1,
    alpha: float = 1.0,
    autocast=nullcontext,
    progress: Optional[Callable[[int], object]] = None,
) -> List[Hypothesis]:
    """The best hypothesis of every source sentence, in the split's order (greedy when ``beam_size`` is 1).
    A ``beam_size`` or ``alpha`` out of range is a ``ValueError`` before anything is decoded.
    ``progress(n)`` is called as each batch of ``n`` sentences is done (a progress bar's ``update``)."""
    # Greedy search has no length penalty: a run's (unused) trainer.length_penalty is not checked then.
    options = SearchOptions(beam_size=beam_size, alpha=alpha if beam_size > 1 else 0.0)
    model.eval()
    results: List[Hypothesis] = [None] * len(dataset)  # type: ignore[list-item]
    # Beam search runs K hypotheses per sentence: keep the batch's memory about the same.
    for batch in ordered_batches(dataset, max(batch_tokens // max(beam_size, 1), 64)):
        batch = batch.to(device)
        with autocast():
            found = search(model, batch.src, batch.src_mask, BOS_ID, EOS_ID, options, pad_id=PAD_ID)
        for index, hyps in zip(batch.indices.tolist(), found):
            results[index] = hyps[0]
        if progress is not None:
            progress(len(found))
    return results


def output_attention(
    model: nn.Module, dataset: ParallelDataset, found: List[Hypothesis]
) -> Tuple[Dict[str, object], List[List[int]], List[List[int]]]:
    """Attention of the model over the first ``len(found)`` sentences of ``dataset`` while it
    produces its own outputs ``found`` (fed back teacher-forced, EOS last when it emitted one:
    ``alignment.forced.forced_attention``).

    Returns the model's attention (``forward(..., need_weights=True)``), the source ids (EOS
    included) and the output ids of each sentence: the axes of the attention maps.
    """
    out_ids = [(h.tokens + ([EOS_ID] if h.finished else [])) or [EOS_ID] for h in found]
    src_ids = [dataset.src[i] + [EOS_ID] for i in range(len(found))]
    attention = forced_attention(model, src_ids, [ids[:-1] for ids in out_ids])
    return attention, src_ids, out_ids


def translate_split(
    model: nn.Module,
    dataset: ParallelDataset,
    tokenizer: Tokenizer,
    batch_tokens: int,
    device: torch.device,
    beam_size: int = 1,
    alpha: float = 1.0,
    autocast=nullcontext,
    progress: Optional[Callable[[int], object]] = None,
) -> List[str]:
    """Detokenized translations of a split, in its order (``progress``: as ``decode_ids``)."""
    found = decode_ids(model, dataset, batch_tokens, device, beam_size, alpha, autocast, progress)
    return detokenize(tokenizer, found)
