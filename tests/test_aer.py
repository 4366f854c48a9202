"""Alignment error rate, precision and recall against gold alignments (alignment/scores.py). The real
gold set is found through one fixture, ``alignments_dir``."""

import math
import os
from pathlib import Path

import pytest

from alignment.scores import (
    AlignmentError,
    alignment_scores,
    diagonal,
    pharaoh,
    read_gold,
    read_pharaoh,
    split_dev,
)

from helpers import ROOT, write_lines

SRC = ["a b c", "d e"]
TGT = ["x y z", "u v"]


@pytest.fixture(scope="session")
def alignments_dir() -> Path:
    """The gold alignments' folder: ``$ALIGNMENTS_DIR``, else ``../shared/data/alignments`` beside
    the repository (CI has it); skipped with the reason when neither is there."""
    folder = Path(os.environ.get("ALIGNMENTS_DIR") or ROOT.parent / "shared" / "data" / "alignments")
    if not (folder / "de-en" / "gold.talp").is_file():
        pytest.skip(f"no gold alignments in {folder}: set ALIGNMENTS_DIR to the folder that holds de-en/")
    return folder


def test_scores_count_sure_and_possible_links(tmp_path):
    # pair 1: S = {0-0, 1-1}, P = S + {2-1}; A = {0-0, 2-1, 2-2}: |A & S| = 1, |A & P| = 2
    # pair 2: S = {0-0, 1-1}, P = S + {0-1}; A = {1-1}:           |A & S| = 1, |A & P| = 1
    # sums: |A| = 4, |S| = 4, |A & S| = 2, |A & P| = 3
    # AER = 1 - (2 + 3) / (4 + 4) = 0.375; precision = 3 / 4; recall = 2 / 4
    gold = read_gold(write_lines(tmp_path / "gold.talp", ["1-1 2-2 3p2", "1-1 2-2 1p2"]), SRC, TGT)
    assert gold[0].sure == {(0, 0), (1, 1)} and gold[0].possible == {(0, 0), (1, 1), (2, 1)}
    predicted = read_pharaoh(write_lines(tmp_path / "pred.txt", ["0-0 2-1 2-2", "1-1"]))
    scores = alignment_scores(predicted, gold)
    assert (scores.predicted, scores.sure, scores.predicted_sure, scores.predicted_possible) == (4, 4, 2, 3)
    assert scores.aer == pytest.approx(0.375)
    assert scores.precision == pytest.approx(0.75) and scores.recall == pytest.approx(0.5)


def test_pharaoh_lines_round_trip(tmp_path):
    links = [{(2, 1), (0, 0), (10, 3)}, set()]
    assert [pharaoh(sorted(x)) for x in links] == ["0-0 2-1 10-3", ""]
    path = write_lines(tmp_path / "pred.txt", [pharaoh(sorted(x)) for x in links])
    assert read_pharaoh(path) == links


def test_no_predicted_links_give_aer_1_and_no_precision(tmp_path):
    gold = read_gold(write_lines(tmp_path / "gold.talp", ["1-1 2p2", "2-1"]), SRC, TGT)
    scores = alignment_scores([set(), set()], gold)
    assert scores.aer == 1.0 and scores.recall == 0.0 and math.isnan(scores.precision)


def test_a_pair_without_gold_links_counts_its_predictions_as_wrong(tmp_path):
    gold = read_gold(write_lines(tmp_path / "gold.talp", ["1-1", ""]), SRC, TGT)
    assert gold[1].sure == gold[1].possible == set()
    scores = alignment_scores([{(0, 0)}, {(0, 0)}], gold)
    # |A| = 2, |S| = 1, |A & S| = |A & P| = 1: AER = 1 - 2 / 3
    assert scores.aer == pytest.approx(1 / 3)
    assert scores.precision == 0.5 and scores.recall == 1.0
    nothing = alignment_scores([set(), set()], [gold[1], gold[1]])
    assert math.isnan(nothing.aer) and math.isnan(nothing.precision) and math.isnan(nothing.recall)


def test_scores_refuse_another_number_of_pairs(tmp_path):
    gold = read_gold(write_lines(tmp_path / "gold.talp", ["1-1", "1-1"]), SRC, TGT)
    with pytest.raises(AlignmentError, match="1 predicted alignments but 2 gold"):
        alignment_scores([{(0, 0)}], gold)


def test_zero_based_gold_reads_as_it_is(tmp_path):
    gold = read_gold(write_lines(tmp_path / "gold.txt", ["0-0 2p2", "1-1"]), SRC, TGT, one_based=False)
    assert gold[0] == ({(0, 0)}, {(0, 0), (2, 2)}) and gold[1].sure == {(1, 1)}


def test_diagonal_links_each_target_word_to_its_relative_position():
    assert diagonal(3, 3) == {(0, 0), (1, 1), (2, 2)}
    assert diagonal(2, 4) == {(0, 0), (0, 1), (1, 2), (1, 3)}  # floor((j + 0.5) / 2)
    assert diagonal(4, 2) == {(1, 0), (3, 1)}  # floor((j + 0.5) * 2)
    assert diagonal(1, 2) == {(0, 0), (0, 1)}
    assert diagonal(0, 3) == diagonal(3, 0) == set()
    for n_src in range(1, 13):
        for n_tgt in range(1, 13):
            links = diagonal(n_src, n_tgt)
            assert sorted(j for _, j in links) == list(range(n_tgt))
            assert all(0 <= i < n_src for i, _ in links)


def test_split_dev_keeps_the_first_pairs_for_choosing():
    dev, rest = split_dev(list(range(508)))
    assert dev == list(range(100)) and rest == list(range(100, 508))
    assert split_dev("abc", n_dev=1) == (["a"], ["b", "c"])
    for n_dev in (0, 3):  # one check of --dev: both parts must hold pairs
        with pytest.raises(AlignmentError, match=f"--dev {n_dev}: .* with 3 pairs give a number from 1 to 2"):
            split_dev("abc", n_dev=n_dev)


@pytest.mark.parametrize(
    "lines, message",
    [
        (["1-1 2-2", "1-1 5-1"], "gold.talp line 2: link 5-1, but source line 2 has 2 words: "),
        (["1-1 2p4", "1-1"], "gold.talp line 1: link 2p4, but target line 1 has 3 words: "),
        (["1-1 x-2", "1-1"], "gold.talp line 1: 'x-2' is not a link \\(i-j or ipj\\)"),
        (["1-1 0-2", "1-1"], "gold.talp line 1: link 0-2 has an index 0, but the file is read as 1-based"),
        (["1-1"], "gold.talp has 1 lines, the texts 2: "),
    ],
)
def test_a_gold_file_that_does_not_fit_its_texts_names_file_and_line(tmp_path, lines, message):
    path = write_lines(tmp_path / "gold.talp", lines)
    with pytest.raises(AlignmentError, match=message) as error:
        read_gold(path, SRC, TGT)
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_the_real_gold_set_reads_whole(alignments_dir):
    from data.corpus import read_lines

    folder = alignments_dir / "de-en"
    gold = read_gold(folder / "gold.talp", read_lines(folder / "test.de"), read_lines(folder / "test.en"))
    assert len(gold) == 508
    assert sum(len(pair.sure) for pair in gold) == 9612
    assert sum(len(pair.possible) for pair in gold) == 9612 + 921  # P holds S and the 921 ipj links
    assert all(pair.sure <= pair.possible for pair in gold)
