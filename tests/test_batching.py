import random

import pytest
import torch
from torch.utils.data import DataLoader

from data.batching import ParallelDataset, TokenBucketSampler, collate, pack, pad, padding_ratio
from data.tokenizer import BOS_ID, EOS_ID, PAD_ID

BUDGET = 300


def random_lengths(n=500, seed=0):
    rng = random.Random(seed)
    return [rng.randint(1, 40) for _ in range(n)], [rng.randint(1, 45) for _ in range(n)]


def cost(batch, src, tgt):
    return len(batch) * (max(src[i] for i in batch) + max(tgt[i] for i in batch))


def test_token_budget_is_held():
    src, tgt = random_lengths()
    sampler = TokenBucketSampler(src, tgt, BUDGET)
    for batch in sampler:
        assert cost(batch, src, tgt) <= BUDGET


def test_a_pair_longer_than_the_budget_forms_its_own_batch():
    src, tgt = [5, 200, 6, 7], [5, 300, 6, 7]
    batches = [batch.tolist() for batch in TokenBucketSampler(src, tgt, 100)]
    assert [1] in batches
    assert sorted(i for batch in batches for i in batch) == [0, 1, 2, 3]


def test_every_pair_exactly_once_per_epoch():
    src, tgt = random_lengths()
    sampler = TokenBucketSampler(src, tgt, BUDGET)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        indices = [i for batch in sampler for i in batch]
        assert sorted(indices) == list(range(len(src)))


def test_order_depends_only_on_seed_and_epoch():
    src, tgt = random_lengths()

    def batches(sampler):
        return [batch.tolist() for batch in sampler]

    a, b = TokenBucketSampler(src, tgt, BUDGET, seed=7), TokenBucketSampler(src, tgt, BUDGET, seed=7)
    assert batches(a) == batches(b)
    b.set_epoch(1)
    assert batches(a) != batches(b)
    a.set_epoch(1)
    assert batches(a) == batches(b)
    assert batches(TokenBucketSampler(src, tgt, BUDGET, seed=8)) != batches(
        TokenBucketSampler(src, tgt, BUDGET, seed=7)
    )


def test_batches_group_similar_lengths():
    src, tgt = random_lengths()
    sampler = TokenBucketSampler(src, tgt, BUDGET)
    unsorted = pack(list(range(len(src))), src, tgt, BUDGET)
    unsorted_padding = (
        sum(cost(b, src, tgt) for b in unsorted) / sum(src[i] + tgt[i] for i in range(len(src))) - 1
    )
    assert padding_ratio(sampler) < 0.5 * unsorted_padding


@pytest.mark.parametrize("world_size", [2, 3])
def test_shards_are_disjoint_equal_and_cover_the_epoch_but_its_remainder(world_size):
    src, tgt = random_lengths()
    whole = TokenBucketSampler(src, tgt, BUDGET, seed=3)
    whole.set_epoch(2)
    batches = list(whole)
    usable = len(batches) - len(batches) % world_size
    shards = []
    for rank in range(world_size):
        sampler = TokenBucketSampler(src, tgt, BUDGET, seed=3, rank=rank, world_size=world_size)
        sampler.set_epoch(2)
        shards.append([i for batch in sampler for i in batch])
        assert len(sampler) == len(list(sampler)) == usable // world_size
    for r in range(world_size):
        for other in range(r + 1, world_size):
            assert not set(shards[r]) & set(shards[other])
    assert sorted(i for shard in shards for i in shard) == sorted(
        i for batch in batches[:usable] for i in batch
    )


def test_evaluation_batches_are_sorted_and_restore_the_input_order():
    src_ids = [[10 + j for j in range(n)] for n in (5, 1, 3, 8, 2)]
    dataset = ParallelDataset(src_ids, [[7] * n for n in (4, 2, 2, 6, 1)])
    sampler = TokenBucketSampler(dataset.src_lengths(), dataset.tgt_lengths(), 20, shuffle=False)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate)
    restored = {}
    for batch in loader:
        for row, index in enumerate(batch.indices.tolist()):
            restored[index] = batch.src[row, : batch.src_lengths[row] - 1].tolist()
    assert [restored[i] for i in range(len(src_ids))] == src_ids
    order = [i for batch in sampler for i in batch]
    assert [dataset.src_lengths()[i] for i in order] == sorted(dataset.src_lengths())


def test_collate_adds_eos_bos_and_shifts_the_target():
    batch = collate([(4, [11, 12, 13], [21, 22]), (9, [14], [23, 24, 25])])
    assert batch.src.tolist() == [[11, 12, 13, EOS_ID], [14, EOS_ID, PAD_ID, PAD_ID]]
    assert batch.src_lengths.tolist() == [4, 2]
    assert batch.tgt_in.tolist() == [[BOS_ID, 21, 22, PAD_ID], [BOS_ID, 23, 24, 25]]
    assert batch.tgt_out.tolist() == [[21, 22, EOS_ID, PAD_ID], [23, 24, 25, EOS_ID]]
    assert batch.tgt_lengths.tolist() == [3, 4] and batch.indices.tolist() == [4, 9]
    assert batch.n_tgt_tokens == 7
    for row, length in enumerate(batch.tgt_lengths.tolist()):  # tgt_in is tgt_out shifted right by one
        assert batch.tgt_in[row, 1:length].tolist() == batch.tgt_out[row, : length - 1].tolist()


def test_bad_sampler_arguments():
    with pytest.raises(ValueError):
        TokenBucketSampler([1], [1], 0)
    with pytest.raises(ValueError):
        TokenBucketSampler([1], [1], 10, rank=2, world_size=2)


def test_pad_fills_each_row_after_its_end():
    padded = pad([[5, 6, 7], [8], []])
    assert padded.dtype == torch.long
    assert padded.tolist() == [[5, 6, 7], [8, PAD_ID, PAD_ID], [PAD_ID, PAD_ID, PAD_ID]]
    assert pad([[4], [4, 4]], pad_id=-1).tolist() == [[4, -1], [4, 4]]
    assert pad([]).shape == (0, 0)


def greedy_pack(order, src, tgt, budget):
    """The definition that ``pack`` vectorises, one pair at a time."""
    batches, current, longest = [], [], (0, 0)
    for i in order:
        grown = (max(longest[0], src[i]), max(longest[1], tgt[i]))
        if current and (len(current) + 1) * sum(grown) > budget:
            batches.append(current)
            current, grown = [], (src[i], tgt[i])
        current.append(i)
        longest = grown
    return batches + ([current] if current else [])


@pytest.mark.parametrize("budget", [1, 7, 60, 300, 5000])
def test_pack_takes_the_same_batches_as_the_greedy_loop(budget):
    src, tgt = random_lengths(3000, seed=budget)
    order = random.Random(budget).sample(range(3000), 3000)  # any order, sorted or not
    assert [batch.tolist() for batch in pack(order, src, tgt, budget)] == greedy_pack(order, src, tgt, budget)
    by_length = sorted(order, key=lambda i: (src[i], tgt[i]))
    assert [batch.tolist() for batch in pack(by_length, src, tgt, budget)] == greedy_pack(
        by_length, src, tgt, budget
    )


def test_a_batch_from_the_arrays_equals_the_collated_examples():
    rng = random.Random(5)
    src = [[rng.randint(4, 99) for _ in range(rng.randint(0, 9))] for _ in range(50)]
    tgt = [[rng.randint(4, 99) for _ in range(rng.randint(1, 12))] for _ in range(50)]
    dataset = ParallelDataset(src, tgt)
    indices = [7, 3, 41, 0, 19]
    ours, reference = dataset.batch(indices), collate([(i, src[i], tgt[i]) for i in indices])
    for name in ("src", "src_lengths", "tgt_in", "tgt_out", "tgt_lengths", "indices"):
        assert torch.equal(getattr(ours, name), getattr(reference, name)), name
    assert ours.src[2, : len(src[41]) + 1].tolist() == src[41] + [EOS_ID]
    assert dataset[41] == (41, src[41], tgt[41])
    assert dataset.src_lengths().tolist() == [len(s) + 1 for s in src]


@pytest.mark.parametrize("longest", [40, 3000])  # a 16-bit sort key, then a 64-bit one
def test_evaluation_order_sorts_by_source_then_target_length(longest):
    rng = random.Random(longest)
    src = [rng.randint(1, longest) for _ in range(400)]
    tgt = [rng.randint(1, longest) for _ in range(400)]
    order = [i for batch in TokenBucketSampler(src, tgt, 10**6, shuffle=False) for i in batch]
    assert order == sorted(range(400), key=lambda i: (src[i], tgt[i], i))


def test_pad_multiple_rounds_every_length_in_the_tensors_and_in_the_budget():
    """``data.pad_multiple``: each batch's tensors are as wide as its longest pair rounded up to the
    multiple, the budget holds with those widths, the real tokens and the masks are unchanged, and
    the padding ratio counts the rounding."""
    rng = random.Random(8)
    src = [[rng.randint(4, 99) for _ in range(rng.randint(0, 30))] for _ in range(300)]
    tgt = [[rng.randint(4, 99) for _ in range(rng.randint(1, 30))] for _ in range(300)]
    dataset = ParallelDataset(src, tgt)
    plain = TokenBucketSampler(dataset.src_lengths(), dataset.tgt_lengths(), BUDGET)
    rounded = TokenBucketSampler(dataset.src_lengths(), dataset.tgt_lengths(), BUDGET, multiple=8)
    up = lambda n: -(-n // 8) * 8  # noqa: E731
    for indices in rounded:
        batch, exact = dataset.batch(indices, multiple=8), dataset.batch(indices)
        widths = (up(int(exact.src.size(1))), up(int(exact.tgt_in.size(1))))
        assert (batch.src.size(1), batch.tgt_in.size(1), batch.tgt_out.size(1)) == (
            widths[0],
            *widths[1:] * 2,
        )
        assert len(indices) * sum(widths) <= BUDGET
        assert torch.equal(batch.src[:, : exact.src.size(1)], exact.src)
        assert torch.equal(batch.tgt_out[:, : exact.tgt_out.size(1)], exact.tgt_out)
        assert (batch.src[:, exact.src.size(1) :] == PAD_ID).all()
        assert torch.equal(batch.src_lengths, exact.src_lengths)
        assert torch.equal(collate([dataset[i] for i in indices], multiple=8).tgt_in, batch.tgt_in)
    assert len(rounded) > len(plain)
    assert padding_ratio(rounded) > padding_ratio(plain) > 0


def test_pad_multiple_below_one_is_refused(compose_config):
    from training.config import checked_config

    with pytest.raises(ValueError, match=r"data.pad_multiple must be 1 or more \(1: no rounding\), got 0"):
        checked_config(compose_config(["data.pad_multiple=0"]))
