"""``trainer.compile``: what torch's compiler makes of the Transformer's training forward pass over
an epoch of real batches (the Multi30k slice, the tiny config). Traced by Dynamo with its ``eager``
backend, which builds the graphs without compiling kernels: the graph count and the graph breaks
are what any backend gets. (The RNN's forward breaks at ``nn.GRU``, which Dynamo does not trace,
and at ``pack_padded_sequence``: docs/sweeps.md.) And ``trainer.compile_mode``: which modes record CUDA
graphs, and where."""

import pytest
import torch

from training.config import TrainerConfig, cuda_graphs
from training.distributed import World
from training.progress import describe_setup
from training.setup import compiled_forward
from training.trainer import Trainer

from helpers import FLOAT32, TINY


def epoch_graphs(trainer: Trainer) -> dict:
    """Dynamo's counters after the model's training forward and backward over one epoch, each batch
    as training passes it (the output layer's input, without and with guided alignment's heads)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = trainer.setup.model.train()
    compiled = torch.compile(model, backend="eager")
    try:
        for indices in trainer.sampler:
            batch = trainer.collate(indices, 0)  # as training pads it (data.pad_multiple)
            for guided in (False, True):
                states, attention = compiled(
                    batch.src, batch.src_mask, batch.tgt_in, alignment=guided, project=False
                )  # (B, T, E), {"alignment": [(B, H_a, T, S)]} when guided
                loss = states.float().mean() + sum(a.float().mean() for a in attention.get("alignment", []))
                loss.backward()
                model.zero_grad(set_to_none=True)
        return {"graphs": counters["stats"]["unique_graphs"], "breaks": dict(counters["graph_break"])}
    finally:
        torch._dynamo.reset()  # no compiled code left to the worker's next tests


def test_the_transformer_compiles_into_two_graphs_an_epoch_guided_or_not_without_a_break(
    multi30k_slice, compose_config, tmp_path
):
    """The first batch's shapes give a static graph; the next shape, one with dynamic batch and
    lengths, which every later batch reuses (no graph per shape, none at a new length; the same
    with ``data.pad_multiple=8``, measured): two graphs for each of the unguided and the guided
    forward."""
    overrides = [
        f"data.root={multi30k_slice}",
        f"data.cache_dir={tmp_path.parent / 'cache'}",
        "data.vocab_size=500",
        "trainer.batch_tokens=1200",
        *FLOAT32,
        *TINY["transformer"],
    ]
    trainer = Trainer(compose_config(overrides), tmp_path)
    assert len(trainer.sampler) > 5
    found = epoch_graphs(trainer)
    assert found == {"graphs": 4, "breaks": {}}


@pytest.mark.parametrize(
    "compile, mode, device, graphs",
    [
        (True, "reduce-overhead", "cuda", True),
        (True, "max-autotune", "cuda", True),
        (True, "reduce-overhead", "cpu", False),  # inductor records no graph of CPU tensors
        (True, "default", "cuda", False),
        (True, "max-autotune-no-cudagraphs", "cuda", False),
        (False, "default", "cuda", False),
    ],
)
def test_cuda_graphs_are_recorded_only_on_cuda_in_the_modes_that_record_them(compile, mode, device, graphs):
    tc = TrainerConfig(compile=compile, compile_mode=mode)
    assert cuda_graphs(tc, device) is graphs
    line = describe_setup("transformer", 10, torch.device(device), "float32", World(), tc)
    if compile:
        assert line.endswith(f", compiled (mode {mode}{', CUDA graphs' if graphs else ''})")
    else:
        assert "compiled" not in line


@pytest.mark.parametrize("mode, graphs", [("default", False), ("reduce-overhead", True)])
def test_the_training_forward_is_compiled_in_the_mode_asked_for(mode, graphs):
    """What torch.compile was given (its inductor options: CUDA graphs or not); nothing compiles
    before the first call."""
    module = torch.nn.Linear(2, 2)
    assert compiled_forward(module, TrainerConfig()) is module
    compiled = compiled_forward(module, TrainerConfig(compile=True, compile_mode=mode))
    assert compiled.get_compiler_config()["triton.cudagraphs"] is graphs
