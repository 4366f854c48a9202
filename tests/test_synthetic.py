"""The synthetic reversal task (tests/synthetic.py) and each model family learning it.

Trained for a few hundred steps on one thread (``trained_synthetic_models`` in conftest.py), a
model reverses sequences it never saw: greedy decoding of the held-out split reaches about 88
BLEU (the Transformer) to 98-100 (the RNNs, over seeds 1-3) and gets most lines exactly right,
while an untrained model scores 0, a Transformer stopped at half its steps reaches 45 BLEU with
under one line in five exact (it drops or swaps letters), and an RNN that has not found the
reversal yet stays far below (with scaled dot-product attention and half the batch: 8 BLEU after
800 steps, 32 after 1,200, at most one line in four exact). So 60 BLEU and one line in three
exact separate "the loss, the gradients, the attention and decoding all work together" from
"something is broken".
"""

import pytest
import sacrebleu
import sentencepiece as spm
from synthetic import VOCAB_SIZE, WORDS, exact_match, write_corpus

from data.corpus import TEST_PREFIX, VALID, read_lines, split_files
from data.tokenizer import spm_options, train_model
from inference.decoding import decode_ids, output_attention, translate_split
from inference.translator import Translator
from viewer.summaries import Texts, encode

from helpers import SPLIT

VARIANTS = [
    "rnn general",
    "rnn scaled_dot",
    "rnn multihead",
    "transformer additive",
]  # conftest.py ATTENTION_VARIANTS


def test_the_corpus_is_the_same_bytes_for_the_same_seed_and_targets_are_reversed(synthetic_corpus, tmp_path):
    again = write_corpus(tmp_path / "again")
    files = split_files(synthetic_corpus)
    assert sorted(files) == sorted(["train", "val", SPLIT]) and SPLIT.startswith(TEST_PREFIX)
    for langs in files.values():
        assert sorted(langs) == ["de", "en"]
        for path in langs.values():
            assert path.name.endswith(".gz") and path.read_bytes() == (again / path.name).read_bytes()
    train = set(read_lines(files["train"]["de"]))
    for split, langs in files.items():
        sources, targets = read_lines(langs["de"]), read_lines(langs["en"])
        assert [t.split() for t in targets] == [s.split()[::-1] for s in sources]
        assert split == "train" or not train & set(sources)  # the held-out splits are unseen sequences


def test_every_word_is_one_piece_at_the_tasks_vocabulary_size(synthetic_corpus):
    files = split_files(synthetic_corpus)["train"]
    lines = read_lines(files["de"]) + read_lines(files["en"])
    model = spm.SentencePieceProcessor(model_proto=train_model(lines, spm_options(VOCAB_SIZE, "unigram")))
    assert model.get_piece_size() == VOCAB_SIZE
    assert all(len(model.encode(word)) == 1 for word in WORDS)


def held_out_scores(trainer):
    """BLEU and exact matches of greedy decoding of the held-out split, and the hypotheses."""
    test = trainer.setup.data.datasets[SPLIT]
    references = trainer.setup.data.tokenizer.decode_tgt(test.tgt)
    hypotheses = translate_split(
        trainer.setup.model, test, trainer.setup.data.tokenizer, 4000, trainer.setup.device
    )
    return (
        sacrebleu.corpus_bleu(hypotheses, [references]).score,
        exact_match(hypotheses, references),
        hypotheses,
    )


@pytest.mark.parametrize("name", ["rnn additive", "transformer scaled_dot", *VARIANTS])
def test_every_model_learns_to_reverse_unseen_sequences(name, trained_attention_variants):
    """Each family's default and every other attention function (with the steps and rate each
    needs: conftest.py), to the same bar."""
    trained = trained_attention_variants[name]
    trainer = trained.trainer
    bleu, exact, hypotheses = held_out_scores(trainer)
    print(
        f"{name}: {trainer.progress.step} steps, {trained.seconds:.0f} s, BLEU {bleu:.1f}, exact {exact:.2f}"
    )
    assert bleu > 60.0, f"{name} reached only {bleu:.1f} BLEU on the held-out reversals: {hypotheses[:3]}"
    assert exact > 1 / 3, f"{name} got only {exact:.2f} of the held-out reversals exactly right"


def test_every_attention_function_translates_and_ensembles_from_its_checkpoint(trained_attention_variants):
    """Each checkpoint translates with beam search, n-best and alignments; all of them (one vocabulary:
    the task's) decode as one ensemble that reverses as well as its members."""
    trainer = trained_attention_variants["rnn additive"].trainer
    sources = trainer.setup.data.sources[SPLIT][:20]
    references = [" ".join(reversed(source.split())) for source in sources]
    for name, trained in trained_attention_variants.items():
        results = Translator.from_checkpoint(trained.checkpoint, "cpu").translate(
            sources, beam=3, nbest=2, alignments=True
        )
        hypotheses = [result.text for result in results]
        assert exact_match(hypotheses, references) > 1 / 3, (name, hypotheses[:3])
        assert all(len(result.nbest) == 2 and result.alignment for result in results), name
    ensemble = Translator.from_checkpoints([t.checkpoint for t in trained_attention_variants.values()], "cpu")
    hypotheses = [result.text for result in ensemble.translate(sources, beam=3)]
    assert exact_match(hypotheses, references) > 1 / 2, hypotheses[:3]


def test_every_attention_function_shows_its_heads_in_the_attention_tab(trained_attention_variants):
    """The Attention tab's summary of one validation sentence (what training writes at every
    evaluation): the RNN's multi-head attention as its heads, the single-head functions as one."""
    expected_heads = {"rnn additive": 1, "rnn general": 1, "rnn scaled_dot": 1, "rnn multihead": 4}
    for name, trained in trained_attention_variants.items():
        trainer = trained.trainer
        found = decode_ids(
            trainer.setup.model, trainer.setup.data.datasets[VALID], 4000, trainer.setup.device
        )[:1]
        attention, src_ids, out_ids = output_attention(
            trainer.setup.model, trainer.setup.data.datasets[VALID], found
        )
        tok = trainer.setup.data.tokenizer
        texts = Texts("source", "reference", "hypothesis")
        header, blob = encode(
            attention,
            0,
            tok.src_pieces(src_ids[0]),
            tok.tgt_pieces(out_ids[0]),
            texts,
            trainer.setup.model.cfg.name,
        )
        cross = [m for m in header["maps"] if m["kind"] == "cross"]
        heads = expected_heads.get(
            name, trainer.setup.model.cfg.n_heads if name.startswith("transformer") else None
        )
        assert [m["heads"] for m in cross][-1] == heads, name
        assert len(blob) == sum(m["heads"] * m["rows"] * m["cols"] for m in header["maps"])
