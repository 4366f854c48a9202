"""Ensembles: ``models/ensemble.py``, ``Translator.from_checkpoints`` and ``translate.py --checkpoint A
--checkpoint B``, with the models trained in the session (conftest.py: both families on the
synthetic reversal task, one shared vocabulary; the slice Transformer, another vocabulary).

- A checkpoint twice is that model: the mean of two equal log-probabilities is the same
  distribution, so beam search, n-best lists and alignments equal the single model's.
- Each member keeps its own decoder state: every hypothesis an RNN + Transformer ensemble finds
  has the score its members give it when they read it teacher-forced, each on its own (small
  untrained models: the mechanism, not what was learnt).
- Checkpoints of two vocabularies are one ``error:`` line naming both.
- ``scripts/compare.py --ensemble RUN RUN`` scores an ensemble of finished runs next to its members.
"""

import io
import shutil
from contextlib import redirect_stderr, redirect_stdout

import pytest
import torch

from data.batching import pad, source_mask
from data.corpus import read_lines
from data.specials import BOS_ID, EOS_ID, PAD_ID
from inference.translator import Translator, mean_alpha, shared_precision
from models.build import build_model
from models.config import RNNConfig, TransformerConfig
from models.ensemble import Ensemble
from models.search import length_penalty, search
from models.search_options import SearchOptions

from helpers import SPLIT, assert_one_error_line, load_script, translate, write_run


@pytest.fixture(scope="module")
def sources(synthetic_corpus):
    """Held-out sources of the synthetic task, of mixed lengths."""
    return read_lines(synthetic_corpus / f"{SPLIT}.de.gz")[:16]


def checkpoint_of(models, family):
    return models[family].checkpoint


def clear(hyps, gap=1e-4):
    """Whether an n-best list has no near tie (consecutive scores further apart than ``gap``): a
    model twice scores within an ulp of the model once, which may swap two hypotheses only there."""
    return all(a.score - b.score > gap for a, b in zip(hyps, hyps[1:]))


@pytest.mark.parametrize("family", ["rnn", "transformer"])
@pytest.mark.parametrize("beam, nbest", [(1, 1), (4, 3)])
def test_a_checkpoint_twice_is_the_single_model(family, beam, nbest, trained_synthetic_models, sources):
    checkpoint = checkpoint_of(trained_synthetic_models, family)
    single = Translator.from_checkpoint(checkpoint, "cpu")
    double = Translator.from_checkpoints([checkpoint, checkpoint], "cpu")
    assert isinstance(double.engine.model, Ensemble) and not isinstance(single.engine.model, Ensemble)
    options = dict(beam=beam, nbest=nbest, alignments=True, batch_size=5)
    compared = 0
    for one, two in zip(single.translate(sources, **options), double.translate(sources, **options)):
        assert len(two.nbest) == nbest
        if not clear(one.nbest):
            continue
        assert [h.text for h in two.nbest] == [h.text for h in one.nbest]
        assert [h.score for h in two.nbest] == pytest.approx([h.score for h in one.nbest], abs=1e-4)
        assert [h.alignment for h in two.nbest] == [h.alignment for h in one.nbest]
        compared += 1
    assert compared >= len(sources) // 2


def tiny_models(vocab=40, seed=0):
    """An untrained small RNN and Transformer of one vocabulary, in eval mode (their searches run
    to the length limit as often as not, which the scores must survive too)."""
    torch.manual_seed(seed)
    rnn = build_model(
        RNNConfig(embed_dim=16, hidden_size=16, attention_size=16, dropout=0.0), vocab, vocab, PAD_ID
    )
    transformer = build_model(
        TransformerConfig(d_model=16, n_heads=2, ff_size=32, encoder_layers=1, decoder_layers=2, dropout=0.0),
        vocab,
        vocab,
        PAD_ID,
    )
    return [rnn.eval(), transformer.eval()]


def padded_sources(vocab=40, seed=1):
    """Six source id lists of different lengths (EOS last), and them padded ``(6, S)``."""
    generator = torch.Generator().manual_seed(seed)
    ids = [
        torch.randint(4, vocab, (n,), generator=generator).tolist() + [EOS_ID] for n in (3, 9, 5, 12, 1, 7)
    ]
    return ids, pad(ids)


def teacher_forced_score(members, src, out_ids):
    """The ensemble's log-probability of ``out_ids`` (EOS last when finished) for one source ``(1, S)``,
    from each member's teacher-forced pass over the whole output: no decoder state is carried."""
    tgt = torch.tensor([out_ids])  # (1, T)
    tgt_in = torch.cat([torch.tensor([[BOS_ID]]), tgt[:, :-1]], dim=1)  # (1, T)
    logits = [m(src, source_mask(src), tgt_in)[0][0] for m in members]  # M x (T, V)
    mean = torch.stack([torch.log_softmax(x, dim=-1) for x in logits]).mean(dim=0)  # (T, V)
    log_probs = torch.log_softmax(mean, dim=-1)  # (T, V): the search normalises the mean again
    return float(log_probs.gather(1, tgt[0].unsqueeze(1)).sum())


@pytest.mark.parametrize("beam", [1, 4])
def test_each_member_keeps_its_own_state(beam):
    """Batched search over an RNN + Transformer ensemble, hypotheses dropped and beams reordered on
    the way: every hypothesis has the score its members give it one sentence at a time, each from
    scratch. Members that shared, lost or misordered their states would score it otherwise."""
    members = tiny_models()
    ids, src = padded_sources()
    nbest = min(beam, 3)
    found = search(
        Ensemble(members),
        src,
        source_mask(src),
        BOS_ID,
        EOS_ID,
        SearchOptions(beam_size=beam, alpha=1.0, nbest=nbest, max_len=10),
        pad_id=PAD_ID,
    )
    checked = 0
    with torch.no_grad():
        for row, hyps in zip(ids, found):
            assert len(hyps) == nbest
            for hyp in hyps:
                out = hyp.tokens + ([EOS_ID] if hyp.finished else [])
                expected = teacher_forced_score(members, torch.tensor([row]), out)
                penalty = 1.0 if beam == 1 else length_penalty(len(out), 1.0)
                assert hyp.score * penalty == pytest.approx(expected, abs=1e-4)
                checked += 1
    assert checked == len(ids) * nbest


def test_a_model_twice_searches_as_that_model():
    model = tiny_models()[1]
    ids, src = padded_sources()
    options = SearchOptions(beam_size=4, alpha=1.0, nbest=3, max_len=10)
    alone = search(model, src, source_mask(src), BOS_ID, EOS_ID, options, pad_id=PAD_ID)
    twice = search(Ensemble([model, model]), src, source_mask(src), BOS_ID, EOS_ID, options, pad_id=PAD_ID)
    for one, two in zip(alone, twice):
        assert [h.tokens for h in two] == [h.tokens for h in one]
        assert [h.score for h in two] == pytest.approx([h.score for h in one], abs=1e-5)


def test_an_ensemble_takes_the_shortest_input_of_its_members():
    rnn, transformer = tiny_models()
    assert Ensemble([rnn, transformer]).max_positions == transformer.max_positions
    assert Ensemble([rnn, rnn]).max_positions is None
    with pytest.raises(ValueError, match="at least 2 models"):
        Ensemble([rnn])


def nbest_scores(stdout):
    """The scores of ``--nbest`` lines ``index ||| hypothesis ||| score``."""
    return [float(line.split(" ||| ")[2]) for line in stdout.splitlines()]


def test_translate_py_decodes_with_an_ensemble(trained_synthetic_models, sources):
    rnn, transformer = (checkpoint_of(trained_synthetic_models, f) for f in ("rnn", "transformer"))
    text = "\n".join(sources) + "\n"
    options = ("--beam", 4, "--nbest", 2, "--device", "cpu")
    done = translate("--checkpoint", rnn, "--checkpoint", transformer, *options, stdin=text)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 * len(sources)
    assert [line.split(" ||| ")[0] for line in lines[:4]] == ["0", "0", "1", "1"]
    # the scores are the ensemble's (the Python API's), not one member's
    expected = Translator.from_checkpoints([rnn, transformer], "cpu").translate(sources, beam=4, nbest=2)
    scores = nbest_scores(done.stdout)
    assert scores == pytest.approx([h.score for r in expected for h in r.nbest], abs=1e-3)
    for member in (rnn, transformer):
        alone = nbest_scores(translate("--checkpoint", member, *options, stdin=text).stdout)
        assert max(abs(a - b) for a, b in zip(scores, alone)) > 1e-2
    # both members have learnt the reversal: so has their ensemble
    firsts = [line.split(" ||| ")[1] for line in lines[::2]]
    reversed_ = [" ".join(reversed(s.split())) for s in sources]
    assert sum(h == r for h, r in zip(firsts, reversed_)) >= len(sources) // 2, firsts[:4]


def test_checkpoints_of_two_vocabularies_are_one_error(trained_synthetic_models, trained_slice_transformer):
    rnn = checkpoint_of(trained_synthetic_models, "rnn")
    other = trained_slice_transformer.checkpoint
    done = translate("--checkpoint", rnn, "--checkpoint", other, "ein Hund")
    assert_one_error_line(done, "different target vocabularies")
    assert str(rnn) in done.stderr and str(other) in done.stderr


def test_ctranslate2_takes_one_export(tmp_path):
    done = translate("--engine", "ctranslate2", "--checkpoint", tmp_path, "--checkpoint", tmp_path, "x")
    assert_one_error_line(done, "ensembles decode with the torch engine")


# ----- scripts/compare.py --ensemble -----
@pytest.fixture(scope="module")
def synthetic_runs(trained_synthetic_models, synthetic_corpus, tmp_path_factory):
    """The session's synthetic models as finished runs (``helpers.write_run``: results.json, and a
    .hydra/ config that reads the synthetic corpus), each checkpoint its run's ``best.pt``."""
    from synthetic import VOCAB_SIZE

    root = tmp_path_factory.mktemp("ensemble_runs")
    refs = read_lines(synthetic_corpus / f"{SPLIT}.en.gz")
    runs = {}
    for number, family in enumerate(("rnn", "transformer")):
        overrides = [
            f"model={family}",
            f"data.root={synthetic_corpus}",
            f"data.vocab_size={VOCAB_SIZE}",
            "seed=1",
        ]
        folder = write_run(root / f"{number}_model={family}", refs, refs, overrides=overrides)
        (folder / "checkpoints").mkdir()
        shutil.copy(trained_synthetic_models[family].checkpoint, folder / "checkpoints" / "best.pt")
        runs[family] = folder
    return runs


def compare(*args):
    """``compare.py ARGS`` in this process: ``(exit code, stdout, stderr)``."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = load_script("compare").main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def ensemble_rows(report):
    """The rows of the Ensembles section: ``[system, BLEU, chrF, decoding, gain, time ratio]``."""
    section = report.split("## Ensembles\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split(" | ") for line in section.splitlines() if line.startswith("| ")]
    return [[cell.strip().strip("*") for cell in row] for row in rows[2:]]  # no header, no rule


def test_compare_scores_ensembles_next_to_their_members(synthetic_runs, tmp_path):
    rnn, transformer = synthetic_runs["rnn"], synthetic_runs["transformer"]
    code, out, err = compare(
        rnn,
        transformer,
        "--ensemble",
        rnn,
        transformer,
        "--ensemble",
        rnn,
        rnn,
        "--out",
        tmp_path,
        "--no-plot",
    )
    assert code == 0, err
    rows = ensemble_rows(out)
    labels = [row[0] for row in rows]
    assert labels == [
        "rnn seed 1",
        "transformer seed 1",
        "rnn seed 1 + transformer seed 1",
        "rnn seed 1",
        "rnn seed 1",
        "rnn seed 1 + rnn seed 1",
    ]
    bleu = [float(row[1]) for row in rows]
    assert min(bleu) > 60  # every system has learnt the reversal
    assert rows[0] == rows[3]  # a run in two ensembles is decoded once
    # a run twice is that run (up to a near tie the ulps of the mean may swap)
    assert abs(bleu[5] - bleu[0]) <= 0.5 and abs(float(rows[5][4])) <= 0.5
    assert abs(float(rows[2][4]) - (bleu[2] - max(bleu[:2]))) <= 0.011  # the gain over the best member
    assert 0 <= float(rows[2][5].lstrip("< ")) <= 1 and rows[2][6].endswith("x")
    assert "## Ensembles" in (tmp_path / "comparison.md").read_text(encoding="utf-8")


def test_compare_refuses_an_ensemble_of_one_run(synthetic_runs, tmp_path):
    code, _, err = compare(synthetic_runs["rnn"], "--ensemble", synthetic_runs["rnn"], "--out", tmp_path)
    assert code == 1 and err.startswith("error: ") and "at least 2 runs" in err


def test_an_ensembles_defaults_come_from_every_run():
    rnn = {"config": {"trainer": {"length_penalty": 1.0}}, "precision": "float32"}
    transformer = {"config": {"trainer": {"length_penalty": 1.2}}, "precision": "bfloat16"}
    assert mean_alpha([rnn, transformer]) == pytest.approx(1.1)
    cuda = torch.device("cuda", 0)
    assert shared_precision("auto", [transformer, transformer], cuda)["amp"]
    assert not shared_precision("auto", [rnn, transformer], cuda)["amp"]  # bf16 only when every run was
    assert shared_precision("bfloat16", [rnn, transformer], cuda)["amp"]  # asked for: every member
