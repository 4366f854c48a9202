"""``trainer.compile``: what torch's compiler makes of the Transformer's training forward pass over
an epoch of real batches (the Multi30k slice, the tiny config). Traced by Dynamo with its ``eager``
backend, which builds the graphs without compiling kernels: the graph count and the graph breaks
are what any backend gets. (The RNN's forward breaks at ``nn.GRU``, which Dynamo does not trace,
and at ``pack_padded_sequence``: docs/sweeps.md.)"""

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
