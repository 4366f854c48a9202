"""Word alignments from subword attention (alignment/words.py)."""

import torch

from alignment.scores import pharaoh
from alignment.words import hard_alignment, piece_words, pool, word_attention, word_ids


def test_word_ids_start_a_word_at_each_marker():
    assert word_ids(["▁Ein", "▁Mann", "es", "▁", "(", "x", ")"]) == [0, 1, 1, 2, 2, 2, 2]
    assert word_ids(["ab", "▁c"]) == [0, 1]  # a first piece without the marker still opens word 0
    assert word_ids([]) == []


def test_pool_sums_or_averages_the_pieces_of_a_word():
    weights = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    torch.testing.assert_close(
        pool(weights, [0, 0, 1], dim=1, reduce="sum"), torch.tensor([[3.0, 3.0], [9.0, 6.0]])
    )
    torch.testing.assert_close(pool(weights, [0, 0], dim=0, reduce="mean"), torch.tensor([[2.5, 3.5, 4.5]]))


def test_word_attention_drops_eos_and_pools_pieces():
    src = ["▁Ein", "▁Hund", "e"]  # 2 source words; the weights carry one more column for EOS
    out = ["▁Two", "▁dog", "s"]  # 2 output words; the weights carry one more row for EOS
    weights = torch.tensor(
        [
            [0.7, 0.1, 0.1, 0.1],
            [0.0, 0.6, 0.3, 0.1],
            [0.1, 0.2, 0.6, 0.1],
            [0.0, 0.0, 0.0, 1.0],  # EOS row
        ]
    )
    words = word_attention(weights, src, out)
    torch.testing.assert_close(words, torch.tensor([[0.7, 0.2], [0.05, 0.85]]))
    assert hard_alignment(words) == [(0, 0), (1, 1)]
    assert pharaoh(hard_alignment(words)) == "0-0 1-1"


def test_each_output_word_gets_its_most_attended_source_word():
    words = torch.tensor([[0.1, 0.8, 0.1], [0.6, 0.3, 0.1], [0.2, 0.3, 0.5], [0.0, 0.9, 0.1]])
    assert pharaoh(hard_alignment(words)) == "1-0 0-1 2-2 1-3"


def test_empty_output_has_no_alignment():
    words = word_attention(torch.ones(1, 3) / 3, ["▁a", "▁b"], [])
    assert words.shape == (0, 2) and hard_alignment(words) == [] and pharaoh([]) == ""


def test_piece_words_join_the_pieces_of_each_word():
    assert piece_words(["▁Ein", "▁Mann", "es", "▁", "(", "x", ")"]) == ["Ein", "Mannes", "(x)"]
