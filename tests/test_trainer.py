"""The training loop's own behaviour: seeding, schedule wiring, accumulation, resume, limits, loader workers."""

import multiprocessing
import os

import pytest
import torch

from common.checkpoint import load_checkpoint
from data.corpus import TRAIN
from data.loading import collated
from training.trainer import Trainer

from helpers import FLOAT32, HostReads, scalars

TINY = [
    "model.d_model=32",
    "model.n_heads=2",
    "model.ff_size=64",
    "model.encoder_layers=1",
    "model.decoder_layers=1",
]


def make_trainer(multi30k_slice, compose_config, tmp_path, *extra) -> Trainer:
    overrides = [
        f"data.root={multi30k_slice}",
        f"data.cache_dir={tmp_path.parent / 'cache'}",
        "data.vocab_size=500",
        "trainer.batch_tokens=1200",
        "trainer.warmup_steps=3",
        "trainer.log_every=1",
        "trainer.eval_every=1000000",
        "trainer.attention_samples=0",
        "trainer.guided_alignment=0",  # the default Transformer's guidance: test_guided_alignment.py
        *FLOAT32,
        *TINY,
        *extra,
    ]
    return Trainer(compose_config(overrides), tmp_path)


def losses(trainer: Trainer, steps: int):
    train = trainer.setup.data.datasets[TRAIN]
    from data.batching import collate

    batches = list(trainer.sampler)[:steps]
    return [trainer.train_step([collate([train[i] for i in b])]).loss for b in batches]


def test_same_seed_gives_the_same_losses_and_another_seed_does_not(multi30k_slice, compose_config, tmp_path):
    first = losses(make_trainer(multi30k_slice, compose_config, tmp_path / "a", "seed=7"), 3)
    second = losses(make_trainer(multi30k_slice, compose_config, tmp_path / "b", "seed=7"), 3)
    other = losses(make_trainer(multi30k_slice, compose_config, tmp_path / "c", "seed=8"), 3)
    assert first == second
    assert first != other


def test_learning_rate_follows_the_schedule(multi30k_slice, compose_config, tmp_path):
    trainer = make_trainer(
        multi30k_slice, compose_config, tmp_path, "trainer.lr=1e-3", "trainer.schedule=inverse_sqrt"
    )
    steps = losses(trainer, 1)
    assert len(steps) == 1
    assert trainer.setup.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 / 3)  # warm-up step 1 of 3


def test_max_steps_stops_inside_an_epoch_and_leaves_a_resumable_checkpoint(
    multi30k_slice, compose_config, tmp_path
):
    trainer = make_trainer(
        multi30k_slice, compose_config, tmp_path, "trainer.max_steps=3", "trainer.eval_every=3"
    )
    reason = trainer.fit()
    trainer.close()
    assert "max_steps" in reason and trainer.progress.step == 3 and trainer.progress.batches_done == 3
    payload = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert payload["progress"]["step"] == 3
    resumed = make_trainer(
        multi30k_slice,
        compose_config,
        tmp_path,
        "trainer.max_steps=5",
        "trainer.eval_every=3",
        f"trainer.resume={tmp_path / 'checkpoints' / 'last.pt'}",
    )
    resumed.resume()
    assert resumed.progress.step == 3 and resumed.progress.batches_done == 3
    for name, tensor in trainer.setup.model.state_dict().items():
        assert torch.equal(tensor, resumed.setup.model.state_dict()[name]), name


def test_accumulation_normalises_by_all_target_tokens(multi30k_slice, compose_config, tmp_path):
    """Two batches in one step give the loss and gradient of the two as one batch."""
    one = make_trainer(
        multi30k_slice, compose_config, tmp_path / "one", "model.dropout=0.0", "trainer.accumulate=2"
    )
    train = one.setup.data.datasets[TRAIN]
    from data.batching import collate

    a, b = list(one.sampler)[:2]
    stats = one.train_step([collate([train[i] for i in a]), collate([train[i] for i in b])])
    both = make_trainer(multi30k_slice, compose_config, tmp_path / "both", "model.dropout=0.0")
    together = both.train_step([collate([train[i] for i in [*a, *b]])])
    assert stats.tokens == together.tokens
    assert stats.loss == pytest.approx(together.loss, rel=1e-5)
    assert stats.grad_norm == pytest.approx(together.grad_norm, rel=1e-4)  # the same gradient


def test_a_non_finite_step_changes_nothing_and_training_goes_on(multi30k_slice, compose_config, tmp_path):
    """A NaN in one weight makes the loss non-finite: the update is skipped (weights, Adam's state and
    the step counter stay as they were); with the weight repaired the next step trains."""
    trainer = make_trainer(multi30k_slice, compose_config, tmp_path)
    train = trainer.setup.data.datasets[TRAIN]
    from data.batching import collate

    first, second = [collate([train[i] for i in b]) for b in list(trainer.sampler)[:2]]
    assert not trainer.train_step([first]).skipped
    weights = {k: v.clone() for k, v in trainer.setup.model.state_dict().items()}
    moments = {k: v.clone() for k, v in trainer.setup.optimizer.state_dict()["state"][0].items()}
    name, poisoned = next(iter(trainer.setup.model.named_parameters()))
    with torch.no_grad():
        poisoned.view(-1)[0] = float("nan")
    stats = trainer.train_step([second])
    assert stats.skipped and trainer.progress.step == 1
    with torch.no_grad():
        poisoned.view(-1)[0] = weights[name].view(-1)[0]
    assert all(torch.equal(v, weights[k]) for k, v in trainer.setup.model.state_dict().items())
    assert all(
        torch.equal(v, moments[k]) for k, v in trainer.setup.optimizer.state_dict()["state"][0].items()
    )
    assert all(p.grad is None for p in trainer.setup.model.parameters())
    stats = trainer.train_step([second])
    assert not stats.skipped and trainer.progress.step == 2


def test_a_run_shorter_than_log_every_logs_its_last_step(multi30k_slice, compose_config, tmp_path):
    """The steps since the last log line are logged when the run stops (here: all three)."""
    trainer = make_trainer(
        multi30k_slice, compose_config, tmp_path, "trainer.max_steps=3", "trainer.log_every=50"
    )
    trainer.fit(evaluate_last=False)
    trainer.close()
    assert [step for step, _ in scalars(tmp_path / "tb", "train/loss")] == [3]
    assert [step for step, _ in scalars(tmp_path / "tb", "train/lr")] == [3]


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_a_fitted_schedule_ends_at_min_lr_on_the_last_step_of_max_epochs(
    multi30k_slice, compose_config, tmp_path, schedule
):
    trainer = make_trainer(
        multi30k_slice,
        compose_config,
        tmp_path,
        f"trainer.schedule={schedule}",
        "trainer.max_epochs=2",
        "trainer.warmup_steps=100",  # longer than the run: a quarter of it
        "trainer.min_lr=1e-5",
        "trainer.log_every=1",
    )
    assert trainer.schedule.horizon == 2 * len(trainer.sampler)
    trainer.fit(evaluate_last=False)
    trainer.close()
    rates = dict(scalars(tmp_path / "tb", "train/lr"))
    assert trainer.progress.step == trainer.schedule.horizon == max(rates)
    assert rates[trainer.schedule.horizon] == pytest.approx(1e-5)
    assert max(rates, key=rates.get) == trainer.schedule.horizon // 4  # the warm-up: a quarter of the run


def test_max_steps_or_schedule_steps_set_the_horizon_and_minutes_alone_cannot(
    multi30k_slice, compose_config, tmp_path
):
    both = make_trainer(
        multi30k_slice, compose_config, tmp_path / "a", "trainer.schedule=cosine", "trainer.max_steps=5"
    )
    assert both.schedule.horizon == 5  # max_steps comes before the 30 epochs of trainer.max_epochs
    explicit = ["trainer.schedule=cosine", "trainer.max_epochs=null", "trainer.max_minutes=10"]
    assert (
        make_trainer(
            multi30k_slice, compose_config, tmp_path / "b", *explicit, "trainer.schedule_steps=70"
        ).schedule.horizon
        == 70
    )
    with pytest.raises(ValueError, match="set trainer.schedule_steps"):
        make_trainer(multi30k_slice, compose_config, tmp_path / "c", *explicit)


def test_sampling_resegments_training_pairs_each_epoch_and_never_validation(
    multi30k_slice, compose_config, tmp_path
):
    from data.corpus import VALID

    plain = make_trainer(multi30k_slice, compose_config, tmp_path / "plain")
    sampled = make_trainer(multi30k_slice, compose_config, tmp_path / "sampled", "data.sampling_alpha=0.5")
    batch = list(sampled.sampler)[0]
    assert list(plain.sampler)[0].tolist() == batch.tolist()  # the batches are packed by the plain lengths
    epoch0 = sampled.collate(batch, 0)
    again = sampled.collate(batch, 0)
    epoch1 = sampled.collate(batch, 1)
    unsampled = plain.collate(batch, 0)
    assert torch.equal(epoch0.src, again.src) and torch.equal(epoch0.tgt_out, again.tgt_out)
    assert not torch.equal(epoch0.src, unsampled.src)
    assert not torch.equal(epoch0.src, epoch1.src)
    tok = sampled.setup.data.tokenizer
    rows = lambda b: [[i for i in row.tolist() if i > 3] for row in b.tgt_out]  # noqa: E731 (no specials)
    assert tok.decode_tgt(rows(epoch0)) == tok.decode_tgt(rows(unsampled))  # the same text
    for split in (VALID, "test_2016_flickr"):
        assert list(sampled.setup.data.datasets[split].src) == list(plain.setup.data.datasets[split].src)


SAMPLED = ("data.sampling_alpha=0.5",)  # collation draws segmentations: the slow case workers are for


def same_batch(a, b) -> bool:
    """Every tensor of the two batches equal (a field both leave out, such as ``links``, too)."""
    return all(same_field(getattr(a, name), getattr(b, name)) for name in a.__dataclass_fields__)


def same_field(x, y) -> bool:
    return x is y is None or (x is not None and y is not None and torch.equal(x, y))


def test_workers_collate_the_same_batches_in_the_same_order(multi30k_slice, compose_config, tmp_path):
    trainer = make_trainer(multi30k_slice, compose_config, tmp_path, *SAMPLED)
    trainer.sampler.set_epoch(1)
    batches = list(trainer.sampler)[:7]
    here = list(collated(batches, lambda b: trainer.collate(b, 1), 0))
    ahead = list(collated(batches, lambda b: trainer.collate(b, 1), 2))
    assert len(here) == len(ahead) == 7
    assert all(same_batch(a, b) for a, b in zip(here, ahead))
    assert not same_batch(here[0], trainer.collate(batches[0], 0))  # another epoch, another segmentation


def test_training_with_workers_stops_resumes_and_crosses_epochs_as_one_process_does(
    multi30k_slice, compose_config, tmp_path
):
    """Two workers, stopped inside epoch 1 and resumed to the end of epoch 2, give the weights of
    one process training the 2 epochs straight; the batches were collated in the workers."""
    common = (*SAMPLED, "trainer.accumulate=2", "trainer.max_epochs=2")  # no evaluation but the stop's
    straight = make_trainer(multi30k_slice, compose_config, tmp_path / "straight", *common)
    straight.fit(evaluate_last=False)
    straight.close()
    run = tmp_path / "workers"
    first = make_trainer(multi30k_slice, compose_config, run, *common, "trainer.loader_workers=2")
    assert "max_steps" in first.fit(max_steps=3)  # evaluates and saves last.pt at step 3, in epoch 1
    first.close()
    assert multiprocessing.active_children() == []  # the stop ended the workers
    resumed = make_trainer(
        multi30k_slice,
        compose_config,
        run,
        *common,
        "trainer.loader_workers=2",
        f"trainer.resume={run / 'checkpoints' / 'last.pt'}",
    )
    assert resumed.resume() and resumed.progress.step == 3
    pids = run / "collated_by"
    real = resumed.collate

    def collate_and_record(indices, epoch):  # the real collation, and the process that ran it
        with open(pids, "a") as out:
            out.write(f"{os.getpid()}\n")
        return real(indices, epoch)

    resumed.collate = collate_and_record
    resumed.fit(evaluate_last=False)
    resumed.close()
    assert resumed.progress.epoch == 2 and resumed.progress.step == straight.progress.step
    collated_by = set(pids.read_text().split())
    assert str(os.getpid()) not in collated_by and len(collated_by) >= 2
    for name, tensor in straight.setup.model.state_dict().items():
        assert torch.equal(tensor, resumed.setup.model.state_dict()[name]), name


# The reads of tensor values in one training step: the loss, gradient norm and tokens together
# (training.step.step_numbers: whether the update is skipped); the RNN also sends its source lengths
# to the host to pack the batch (models/rnn.py), after which torch's packing reads its own host tensors.
STEP_READS = {"tiny_transformer": ["tolist"], "tiny_rnn": ["cpu", "__int__", "cpu", "tolist"]}


@pytest.mark.parametrize("model", sorted(STEP_READS))
def test_a_training_step_reads_the_device_once(model, multi30k_slice, compose_config, tmp_path):
    """A read of a tensor's values costs nothing on the CPU and waits for the device on a GPU
    (``HostReads`` counts them): a step reads the device only as ``STEP_READS`` says, and selects
    nothing by a mask (no ``masked_select``, ``nonzero`` or boolean index, whose size depends on
    the values). The fused optimizer's update is counted too (its step counters live on the
    device); left out: the batch's token count, read from the batch as collated on the host."""
    import training.step as step

    overrides = [
        f"data.root={multi30k_slice}",
        f"data.cache_dir={tmp_path.parent / 'cache'}",
        "data.vocab_size=500",
        f"model={model}",
        "trainer.batch_tokens=1200",
        "trainer.attention_samples=0",
        *FLOAT32,
    ]
    trainer = Trainer(compose_config(overrides), tmp_path)
    batch = trainer.collate(next(iter(trainer.sampler)), 0)
    assert batch.n_tgt_tokens > 0  # host data
    counted = HostReads()
    with counted:
        stats = step.optimizer_step(trainer.setup, [batch], 1e-3)
    assert not stats.skipped and counted.names == STEP_READS[model]


@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_the_optimizer_is_fused_on_the_cpu_and_updates_as_torchs_loop_does(kind):
    """One kernel updates every parameter (``make_optimizer``); its update is the one of torch's
    per-parameter loop, to float32 rounding, over a few steps with weight decay."""
    from training.config import TrainerConfig
    from training.setup import make_optimizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Linear(8, 5))
    twin = torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Linear(8, 5))
    twin.load_state_dict(model.state_dict())
    tc = TrainerConfig(optimizer=kind, lr=1e-2, weight_decay=0.1)
    fused = make_optimizer(model, tc)
    loop = type(fused)(twin.parameters(), lr=1e-2, betas=tuple(tc.betas), weight_decay=0.1, foreach=False)
    assert fused.defaults["fused"] and not loop.defaults["fused"]
    ids = torch.tensor([[1, 2, 3], [4, 5, 10]])
    for _ in range(3):
        for net, optimizer in ((model, fused), (twin, loop)):
            net(ids).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    for mine, theirs in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
