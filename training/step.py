"""One optimizer step: forward and label-smoothed loss over the step's batches (gradient
accumulation), backward, gradient clipping, the learning rate of the step, the update. A step
whose loss or gradient norm is not finite changes nothing: no update, no step counted.

The loss is label-smoothed cross-entropy over target tokens, padding ignored (Szegedy et al. 2016);
validation takes its plain NLL from the same function. With ``trainer.guided_alignment`` the
guided alignment loss (``training/guided.py``) is added, weighted; with ``trainer.rdrop_alpha``
each batch runs twice and R-Drop's KL (``training/rdrop.py``) is added."""

import logging
import math
from pathlib import Path
from typing import Callable, ContextManager, List, Optional, Tuple, Union

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from data.batching import Batch
from data.specials import PAD_ID
from training import distributed
from training.config import TrainerConfig, cuda_graphs
from training.distributed import World
from training.guided import guided_alignment_loss
from training.progress import Progress, StepStats
from training.rdrop import symmetric_kl, twice
from training.setup import Setup

log = logging.getLogger(__name__)


# Logits per block of ProjectedSmoothedNLL, by device type: on a CPU 8 MiB of float32, under the C
# library's limit for memory it keeps for reuse (32 MiB), so a block's buffers come back for the
# next, where whole (B, T, V) tensors were fresh, zeroed pages at every step (the fastest of 2^19 to
# 2^23, docs/benchmarks.md); on a GPU blocks large enough to keep the kernels few.
CPU_BLOCK_ELEMENTS = 2**21
GPU_BLOCK_ELEMENTS = 2**26


def label_smoothed_nll(
    logits: Tensor, target: Tensor, pad_id: int, smoothing: float
) -> Tuple[Tensor, Tensor, Tensor]:
    """Summed losses over the non-padding positions of ``target``.

    ``logits`` ``(B, T, V)``, ``target`` ``(B, T)``. The smoothed loss is
    ``(1 - eps) * NLL + eps * mean_v(-log p_v)``: the cross-entropy against a target distribution
    that puts ``1 - eps`` on the reference token and spreads ``eps`` uniformly over the vocabulary.

    Returns (smoothed loss sum, NLL sum, number of target tokens), scalars on the logits' device;
    the NLL gives perplexity. Padding is zeroed by ``torch.where`` over the whole ``(B, T)`` grid, not
    selected out: a selection's size depends on the mask's values, so on CUDA it would wait for the
    device. The gradient is ``SmoothedNLL``'s.
    """
    keep = target != pad_id  # (B, T)
    loss, nll = SmoothedNLL.apply(logits, target, keep, smoothing)
    return loss, nll.detach(), keep.sum()


def projected_smoothed_nll(
    states: Tensor,
    weight: Tensor,
    target: Tensor,
    pad_id: int,
    smoothing: float,
    block_elements: Optional[int] = None,
) -> Tuple[Tensor, Tensor, Tensor]:
    """``label_smoothed_nll`` of the logits ``states @ weight.T``, without making them whole.

    ``states`` ``(B, T, E)`` (a model's ``forward(..., project=False)``), ``weight`` ``(V, E)`` (its
    ``output_layer``'s), ``target`` ``(B, T)``. The same three numbers as ``label_smoothed_nll`` of
    the output layer's logits, and the same gradients (``ProjectedSmoothedNLL``); ``block_elements``:
    logits per block (None: ``CPU_BLOCK_ELEMENTS`` or ``GPU_BLOCK_ELEMENTS``). Under autocast the
    products run in its precision, as the output layer's would.
    """
    device = states.device.type
    if block_elements is None:
        block_elements = CPU_BLOCK_ELEMENTS if device == "cpu" else GPU_BLOCK_ELEMENTS
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else states.dtype
    keep = target != pad_id  # (B, T)
    block_rows = max(1, block_elements // weight.size(0))
    with torch.autocast(device, enabled=False):  # the precisions are ProjectedSmoothedNLL's own
        loss, nll = ProjectedSmoothedNLL.apply(states, weight, target, keep, smoothing, block_rows, dtype)
    return loss, nll.detach(), keep.sum()


def smoothed_losses(
    log_probs: Tensor, target: Tensor, keep: Tensor, smoothing: float
) -> Tuple[Tensor, Tensor]:
    """``log_probs`` ``(..., V)``, ``target`` and ``keep`` ``(...)`` -> the smoothed loss and the NLL
    of each position ``(...)``, 0 where ``keep`` is False."""
    nll = torch.where(keep, -log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1), 0.0)  # (...)
    if smoothing == 0:
        return nll, nll
    uniform = torch.where(keep, -log_probs.sum(dim=-1) / log_probs.size(-1), 0.0)  # (...)
    return (1.0 - smoothing) * nll + smoothing * uniform, nll


def smoothed_gradient_(probs: Tensor, target: Tensor, keep: Tensor, smoothing: float, scale) -> Tensor:
    """The smoothed loss's gradient with respect to the logits, written over their softmax ``probs``
    ``(..., V)``: ``scale * (p - (1 - eps) [j = y] - eps / V)``, 0 where ``keep`` ``(...)`` is False."""
    if smoothing > 0:
        probs.sub_(smoothing / probs.size(-1))
    reference = torch.full(target.shape + (1,), smoothing - 1.0, dtype=probs.dtype, device=probs.device)
    probs.scatter_add_(-1, target.unsqueeze(-1), reference)  # (..., V) less 1 - eps at the reference
    return probs.mul_((keep.unsqueeze(-1) * scale).to(probs.dtype))  # (..., V) zero at padding


class SmoothedNLL(torch.autograd.Function):
    """``label_smoothed_nll``'s two sums, and the smoothed loss's gradient in one step.

    For a token with reference ``y``, ``d loss / d logit_j = p_j - (1 - eps) [j = y] - eps / V``
    (the softmax less the target distribution), zero at padding: three passes over ``(B, T, V)``
    where autograd's chain through the gather, the mean and the log-softmax takes about six (on two
    CPU cores, about a tenth of an RNN's training step went there).
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, keep: Tensor, smoothing: float) -> Tuple[Tensor, Tensor]:
        """``logits`` ``(B, T, V)``, ``target`` and ``keep`` ``(B, T)`` -> the smoothed loss's and the
        NLL's sums over the kept positions (float32 at least, whatever the logits' precision)."""
        log_probs = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        loss, nll = smoothed_losses(log_probs, target, keep, smoothing)  # (B, T) each
        ctx.save_for_backward(log_probs, target, keep)
        ctx.smoothing, ctx.dtype = smoothing, logits.dtype
        nll_sum = nll.sum()
        ctx.mark_non_differentiable(nll_sum)
        return loss.sum(), nll_sum

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        log_probs, target, keep = ctx.saved_tensors
        grad = smoothed_gradient_(log_probs.exp(), target, keep, ctx.smoothing, grad_loss)  # (B, T, V)
        return grad.to(ctx.dtype), None, None, None


class ProjectedSmoothedNLL(torch.autograd.Function):
    """The output layer's product and ``SmoothedNLL`` in one, ``block_rows`` positions at a time,
    so that no ``(B, T, V)`` tensor is made: each block's logits, then its log-probabilities, which
    become its gradient in place. The gradients are computed in the forward pass, where each
    block's softmax is at hand (the logits' gradient is the softmax less the target distribution,
    ``SmoothedNLL``), and only where an input needs one; the backward pass scales them. The
    products run in ``dtype`` (autocast's, where the model ran under it), the loss in float32 at
    least; the blocks' products for the weight's gradient are added up in the weight's precision.
    """

    @staticmethod
    def forward(
        ctx,
        states: Tensor,
        weight: Tensor,
        target: Tensor,
        keep: Tensor,
        smoothing: float,
        block_rows: int,
        dtype: torch.dtype,
    ) -> Tuple[Tensor, Tensor]:
        """``states`` ``(B, T, E)``, ``weight`` ``(V, E)``, ``target`` and ``keep`` ``(B, T)`` -> the
        smoothed loss's and the NLL's sums over the kept positions."""
        rows = states.reshape(-1, states.size(-1)).to(dtype)  # (N, E)
        targets, kept = target.reshape(-1), keep.reshape(-1)  # (N,)
        w = weight.to(dtype)  # (V, E)
        need_rows, need_weight = ctx.needs_input_grad[:2]
        grad_rows = torch.empty_like(rows) if need_rows else None  # (N, E)
        grad_weight = torch.zeros_like(weight) if need_weight else None  # (V, E)
        loss_type = torch.promote_types(dtype, torch.float32)
        loss = torch.zeros((), dtype=loss_type, device=rows.device)
        nll = torch.zeros((), dtype=loss_type, device=rows.device)
        for start in range(0, rows.size(0), block_rows):
            block = slice(start, start + block_rows)
            log_probs = torch.log_softmax((rows[block] @ w.t()).to(loss_type), dim=-1)  # (n, V)
            block_loss, block_nll = smoothed_losses(log_probs, targets[block], kept[block], smoothing)  # (n,)
            loss += block_loss.sum()
            nll += block_nll.sum()
            if not (need_rows or need_weight):
                continue
            grad = smoothed_gradient_(log_probs.exp_(), targets[block], kept[block], smoothing, 1.0).to(
                w.dtype
            )
            if need_rows:
                torch.mm(grad, w, out=grad_rows[block])  # (n, E)
            if need_weight and w.dtype == grad_weight.dtype:
                grad_weight.addmm_(grad.t(), rows[block])  # (V, E)
            elif need_weight:  # the blocks' bf16 products added up in float32
                grad_weight += grad.t() @ rows[block]  # (V, E)
        ctx.save_for_backward(grad_rows, grad_weight)
        ctx.states_shape, ctx.states_dtype = states.shape, states.dtype
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    @once_differentiable  # the gradients are numbers of the forward pass, not functions of it
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        grad_rows, grad_weight = ctx.saved_tensors
        grad_states = None
        if grad_rows is not None:  # scaled in float32 at least, then in the states' precision
            wide = grad_rows.to(torch.promote_types(grad_rows.dtype, grad_loss.dtype))
            grad_states = (wide * grad_loss).to(ctx.states_dtype).view(ctx.states_shape)  # (B, T, E)
        if grad_weight is not None:
            grad_weight = grad_weight * grad_loss.to(grad_weight.dtype)  # (V, E)
        return grad_states, grad_weight, None, None, None, None, None


def accumulate_gradients(
    forward: nn.Module,
    output_weight: Tensor,
    batches: List[Batch],
    tc: TrainerConfig,
    world: World,
    device: torch.device,
    autocast: Callable[[], ContextManager],
) -> Tuple[Tensor, Union[int, Tensor], Tensor]:
    """Backward of the loss of every batch, normalised per target token of the whole step; the
    summed loss (a device scalar), the target tokens, every rank's together (an int, or under
    DDP a device scalar), and guided alignment's summed loss and linked pieces (``(2,)`` on the
    device; zeros when ``trainer.guided_alignment`` is 0). ``forward`` runs the model (itself, its
    DDP wrapper or its compiled form; ``training/efficiency.py`` counts the FLOPs of a bare model
    with it) up to its output layer, whose weight ``output_weight`` the loss multiplies by
    (``projected_smoothed_nll``); R-Drop, which compares the two passes' distributions, takes the
    logits whole. Nothing here waits for the device."""
    # Every rank's target tokens together: DDP averages the ranks' gradients, hence the factor world_size.
    n_tokens = distributed.total_on_device(sum(b.n_tgt_tokens for b in batches), device)
    total = torch.zeros((), dtype=torch.float64, device=device)
    aligned = torch.zeros(2, dtype=torch.float64, device=device)  # guided loss sum, linked pieces
    guided = tc.guided_alignment > 0
    rdrop = tc.rdrop_alpha > 0
    passes = 2 if rdrop else 1  # R-Drop: each batch twice, the passes' mean loss
    graphs = cuda_graphs(tc, device.type)
    for k, batch in enumerate(batches):
        batch = batch.to(device)
        if rdrop:
            batch = twice(batch)
        if graphs:  # the last replay's outputs are spent (one batch a step: its backward ran and the
            # optimizer took its gradients), so its memory may be reused
            torch.compiler.cudagraph_mark_step_begin()
        with distributed.no_sync(forward, last=k == len(batches) - 1):  # one all-reduce per step
            with autocast():
                out, attention = forward(
                    batch.src, batch.src_mask, batch.tgt_in, alignment=guided, project=rdrop
                )  # (B, T, V) logits with R-Drop, else (B, T, E) states
                if not rdrop:  # the output layer's product in the model's precision
                    loss, _, _ = projected_smoothed_nll(
                        out, output_weight, batch.tgt_out, PAD_ID, tc.label_smoothing
                    )
                    objective = loss
            if rdrop:  # the two passes' whole distributions
                loss, _, _ = label_smoothed_nll(out, batch.tgt_out, PAD_ID, tc.label_smoothing)
                loss = loss / passes
                objective = loss + tc.rdrop_alpha * symmetric_kl(out, batch.tgt_out, PAD_ID) / 2
            if guided:
                align_loss, linked = guided_alignment_loss(attention["alignment"][0], batch.links)
                align_loss, linked = align_loss / passes, linked / passes
                objective = objective + tc.guided_alignment * align_loss
                aligned += torch.stack([align_loss.detach().double(), linked.double()])
            (objective / n_tokens * world.world_size).backward()
        total += loss.detach()
    # every rank sees the same loss: the same skip decisions
    if guided:  # one collective more a step, only with guidance
        aligned = distributed.total_on_device(aligned, device)
    return distributed.total_on_device(total, device), n_tokens, aligned


def step_numbers(
    loss_sum: Tensor, grad_norm: Tensor, n_tokens: Union[int, Tensor], aligned: Tensor
) -> Tuple[float, float, int, float]:
    """The summed loss, the gradient norm, the tokens of a step and guided alignment's loss per linked
    piece (NaN without any) on the host: the one wait for the device in a step, needed to skip a
    non-finite update."""
    tokens = n_tokens if isinstance(n_tokens, Tensor) else loss_sum.new_full((), n_tokens)
    numbers = torch.cat([torch.stack([loss_sum, grad_norm.double(), tokens.double()]), aligned.double()])
    loss, norm, count, align_sum, linked = numbers.tolist()
    return loss, norm, int(count), align_sum / linked if linked else float("nan")


def optimizer_step(setup: Setup, batches: List[Batch], lr: float) -> StepStats:
    """One optimizer step at rate ``lr`` over ``batches``. Skipped (``stats.skipped``, gradients
    dropped) when the loss or the gradient norm is not finite."""
    model, tc, optimizer = setup.model, setup.tc, setup.optimizer
    model.train()
    loss_sum, n_tokens, aligned = accumulate_gradients(
        setup.forward, model.output_layer.proj.weight, batches, tc, setup.world, setup.device, setup.autocast
    )
    clip = tc.clip_grad_norm if tc.clip_grad_norm is not None else float("inf")
    norm = nn.utils.clip_grad_norm_(model.parameters(), clip)
    loss_sum, grad_norm, tokens, alignment = step_numbers(loss_sum, norm, n_tokens, aligned)
    stats = StepStats(loss_sum / tokens, float("nan"), grad_norm, tokens, skipped=False, alignment=alignment)
    if not (math.isfinite(stats.loss) and math.isfinite(stats.grad_norm)):
        # no update: weights, optimizer state and step stay as they were
        optimizer.zero_grad(set_to_none=True)
        stats.skipped = True
        return stats
    stats.lr = lr
    for group in optimizer.param_groups:
        group["lr"] = stats.lr
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return stats


def count_skipped(p: Progress, stats: StepStats, where: str, max_bad_steps: int, last: Path) -> Optional[str]:
    """Count a skipped step in ``p`` and log it; the error that stops the run when it makes
    ``max_bad_steps`` in a row (``last`` is where the weights from before them are saved), else None."""
    p.skipped_steps += 1
    p.bad_in_a_row += 1
    what = "loss" if not math.isfinite(stats.loss) else "gradient"
    log.warning(
        "non-finite %s on %s: update skipped (%d in a row, %d in all)",
        what,
        where,
        p.bad_in_a_row,
        p.skipped_steps,
    )
    if p.bad_in_a_row < max_bad_steps:
        return None
    return (
        f"{p.bad_in_a_row} steps in a row with a non-finite loss or gradient (trainer.max_bad_steps), the last on "
        f"{where}; {last} holds the weights of step {p.step}, before them: lower trainer.lr or check the data, "
        "then resume with trainer.resume=auto"
    )
