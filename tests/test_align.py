"""Word alignments from attention: the methods (layer, heads, reading), the shifted reading's rows,
heads masked one at a time, ``scripts/align.py`` on models trained for real on the reversal task
(whose true alignment is known: output word ``j`` of ``n`` is source word ``n - 1 - j``), and the
alignment choice of ``translate.py``."""

import math
import random
import re
from pathlib import Path

import pytest
import torch
from synthetic import reversal_pairs

from alignment.forced import batched_cross_maps, cross_maps, method_map
from alignment.heads import head_stats
from alignment.method import DEFAULT_METHOD, Method, every_method, parse_method
from alignment.scores import alignment_scores, read_gold, read_pharaoh, split_dev
from data.specials import EOS_ID
from inference.translator import Translator, load_model
from models.attention import (
    AdditiveAttention,
    GeneralAttention,
    MultiHeadAttention,
    ScaledDotAttention,
    masked_heads,
)

from helpers import assert_one_error_line, translate, write_lines

FAMILIES = ["rnn", "transformer"]


# ----- the methods -----
def test_the_reading_step_is_the_row_after_the_predicting_one():
    maps = torch.arange(2 * 3 * 4 * 2, dtype=torch.float32).view(2, 3, 4, 2)  # (L, H, T + 1, S), T = 3
    rows = maps.mean(dim=(0, 1))  # (T + 1, S)
    assert torch.equal(method_map(maps, Method(reading="predict")), rows[:3])
    assert torch.equal(method_map(maps, Method(reading="read")), rows[1:])
    # layer 2, head 3: one map, rows shifted the same way
    assert torch.equal(method_map(maps, Method(layer=2, heads=(3,), reading="read")), maps[1, 2, 1:])
    assert torch.equal(method_map(maps, Method(layer=1, heads=(1, 3))), maps[0, [0, 2], :3].mean(dim=0))


def test_every_method_covers_layers_heads_and_readings():
    methods = every_method(3, 4)
    # each layer's 4 heads and their mean, and the mean of every map, under both readings
    assert len(methods) == 2 * (3 * (4 + 1) + 1) and len(set(methods)) == len(methods)
    assert every_method(1, 1) == [Method(1, None, "predict"), Method(1, None, "read")]  # the RNN's one map
    assert Method(2, (3,), "read").label == "layer 2, head 3, read"
    assert parse_method("2", "1,3", "read") == Method(2, (1, 3), "read")


@pytest.mark.parametrize(
    "layer, heads, reading, message",
    [
        ("two", "all", "predict", "give 'all' or numbers from 1"),
        ("0", "all", "predict", "layers count from 1"),
        ("1", "0", "predict", "heads count from 1"),
        ("all", "all", "later", "choose predict or read"),
        ("all", "2", "predict", "give the layer too"),
    ],
)
def test_a_bad_method_is_one_line(layer, heads, reading, message):
    with pytest.raises(ValueError, match=message):
        parse_method(layer, heads, reading)


@pytest.mark.parametrize("need_weights", [False, True])  # the fused kernel and the explicit path
@pytest.mark.parametrize("score", ["scaled_dot", "additive"])
def test_a_masked_head_adds_nothing_to_the_output(score, need_weights, seed):
    attention = MultiHeadAttention(d_model=8, n_heads=2, score=score).eval()
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        with masked_heads({attention: torch.tensor([1.0, 0.0])}):
            masked, _ = attention(x, x, x, need_weights=need_weights)
        unmasked, _ = attention(x, x, x, need_weights=need_weights)
        assert not torch.allclose(masked, unmasked)  # the mask ends with the block
        attention.out_proj.weight[:, 4:] = 0.0  # W_O's columns that read head 2
        by_hand, _ = attention(x, x, x, need_weights=need_weights)
    torch.testing.assert_close(masked, by_hand)


@pytest.mark.parametrize(
    "make",
    [lambda: AdditiveAttention(6, 8, 5), lambda: GeneralAttention(6, 8), lambda: ScaledDotAttention(6, 8, 5)],
    ids=["additive", "general", "scaled_dot"],
)
def test_masking_the_one_head_of_a_single_head_attention_leaves_no_context(make, seed):
    attention = make().eval()
    query, memory = torch.randn(2, 3, 6), torch.randn(2, 4, 8)
    with masked_heads({attention: torch.tensor([0.0])}):
        context, weights = attention(query, memory, memory, need_weights=True)
    assert torch.equal(context, torch.zeros(2, 3, 8))
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 1, 3))  # the weights are as they were


def test_the_masks_are_taken_off_when_a_measurement_fails(trained_synthetic_models, monkeypatch):
    import alignment.heads as heads

    model, tokenizer, _ = load_model(trained_synthetic_models["transformer"].checkpoint)
    from data.batching import ParallelDataset

    dataset = ParallelDataset(tokenizer.encode_src(["a b c"]), tokenizer.encode_tgt(["c b a"]))
    data = [dataset.batch(list(range(len(dataset))))]
    measure = heads.loss_and_entropy
    unmasked = measure(model, data, need_weights=False)[0]
    calls = []

    def failing(model, data, need_weights=True):
        calls.append(need_weights)
        if len(calls) == 3:  # the entropy pass, the baseline, then the first pass with a head masked
            raise RuntimeError("out of memory")
        return measure(model, data, need_weights)

    monkeypatch.setattr(heads, "loss_and_entropy", failing)
    with pytest.raises(RuntimeError, match="out of memory"):
        head_stats(model, dataset)
    assert measure(model, data, need_weights=False)[0] == unmasked  # no head is masked any more


@pytest.mark.parametrize("family", FAMILIES)
def test_maps_of_a_batch_are_each_sentence_alone(family, trained_synthetic_models):
    """Sorted into batches of mixed lengths and back: each pair's maps are the ones it gets alone,
    and every row is a distribution over the real source (EOS included)."""
    model, tokenizer, _ = load_model(trained_synthetic_models[family].checkpoint)
    src = [ids + [EOS_ID] for ids in tokenizer.encode_src(["a b c d e f g", "b", "c d e", "f g h i j"])]
    tgt = tokenizer.encode_tgt(["g f e d c b a", "b", "e d c", "j i h g f"])
    together = batched_cross_maps(model, src, tgt, batch_size=2)
    for k, maps in enumerate(together):
        alone = cross_maps(model, [src[k]], [tgt[k]])[0]
        assert maps.shape == alone.shape == maps.shape[:2] + (len(tgt[k]) + 1, len(src[k]))
        torch.testing.assert_close(maps, alone, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(maps.sum(-1), torch.ones(maps.shape[:-1]), atol=1e-5, rtol=0)


def test_no_flags_is_each_familys_default_method(trained_synthetic_models):
    checkpoint = trained_synthetic_models["transformer"].checkpoint
    default = translate("--checkpoint", checkpoint, "--alignments", "a b c d", "e f g")
    explicit = translate("--checkpoint", checkpoint, "--alignments", "--align-layer", "all",
                         "--align-heads", "all", "--align-reading", "predict", "a b c d", "e f g")  # fmt: skip
    assert default.returncode == 0 and default.stdout == explicit.stdout
    assert DEFAULT_METHOD == Method(None, None, "predict")


def test_a_target_as_long_as_learned_positions_reach_is_aligned(seed):
    """At ``max_positions`` target pieces no input reads the last one: its read row is its predict row."""
    from models.build import build_model
    from models.config import TransformerConfig

    cfg = TransformerConfig(
        d_model=16,
        n_heads=2,
        ff_size=32,
        encoder_layers=1,
        decoder_layers=2,
        positions="learned",
        max_positions=6,
    )
    model = build_model(cfg, 30, 30, 0)
    maps = cross_maps(model, [[5, 6, 7, 3]], [[8, 9, 10, 11, 12, 13]])[0]  # 6 pieces: 7 inputs, 6 fit
    assert maps.shape == (2, 2, 7, 4)
    assert torch.equal(maps[:, :, 6], maps[:, :, 5])
    assert method_map(maps, Method(reading="read")).shape == (6, 4)


# ----- scripts/align.py on the reversal task -----
def reversal_set(folder: Path, count: int = 60, seed: int = 7):
    """``count`` reversal pairs and their true links (all sure), as files."""
    pairs = reversal_pairs(count, random.Random(seed), set())
    gold = [" ".join(f"{len(s.split()) - j}-{j + 1}" for j in range(len(s.split()))) for s, _ in pairs]
    return (
        write_lines(folder / "pairs.de", [s for s, _ in pairs]),
        write_lines(folder / "pairs.en", [t for _, t in pairs]),
        write_lines(folder / "gold.talp", gold),
    )


def align_script(*args):
    from helpers import load_script

    return load_script("align").main([str(a) for a in args])


def align_with_gold(checkpoint, src, tgt, gold, dev, out, *extra) -> int:
    """``scripts/align.py`` scored against the ``gold`` file, the first ``dev`` pairs choosing."""
    return align_script("--checkpoint", checkpoint, "--src", src, "--tgt", tgt, "--gold", gold,
                        "--dev", dev, "--out", out, *extra)  # fmt: skip


@pytest.fixture(scope="module")
def aligned(trained_synthetic_models, tmp_path_factory):
    """``scripts/align.py`` run on each family's reversal model with the true links as gold."""
    folder = tmp_path_factory.mktemp("align")
    src, tgt, gold = reversal_set(folder)
    runs = {}
    for family in FAMILIES:
        checkpoint = trained_synthetic_models[family].checkpoint
        out = folder / family
        extra = ["--heads-src", src, "--heads-tgt", tgt, "--tensorboard", out / "tb", "--samples", 3]
        assert align_with_gold(checkpoint, src, tgt, gold, 20, out, *extra) == 0
        runs[family] = out
    return src, tgt, gold, runs


def reported_aer(report: str, name: str) -> float:
    row = next(line for line in report.splitlines() if line.startswith(f"| {name} |"))
    return float(row.split("|")[3])  # AER on the rest


@pytest.mark.parametrize("family", FAMILIES)
def test_the_chosen_method_aligns_the_reversal_and_its_file_gives_its_score(family, aligned):
    src, tgt, gold_path, runs = aligned
    out = runs[family]
    report = (out / "report.md").read_text(encoding="utf-8")
    chosen = re.search(r"lowest AER\): \*\*(.+?)\*\*, AER ([\d.]+) on the rest", report)
    assert chosen, report
    # the report's AER of the chosen method is the one recomputed from alignments.txt (the rest)
    links = read_pharaoh(out / "alignments.txt")
    gold = read_gold(gold_path, src.read_text().splitlines(), tgt.read_text().splitlines())
    assert len(links) == len(gold) == 60
    rest = alignment_scores(split_dev(links, 20)[1], split_dev(gold, 20)[1])
    assert f"{100 * rest.aer:.1f}" == chosen.group(2)
    # a model that reverses attends to the word it translates: far better than the diagonal
    assert rest.aer < 0.25 < reported_aer(report, "diagonal")
    assert (out / "grid.png").stat().st_size > 0
    n_layers = 1 if family == "rnn" else 2
    n_heads = 1 if family == "rnn" else 4
    grid = report.split("## Every layer, head and reading")[1].split("## Heads")[0]
    assert grid.count("\n| ") - 2 == len(every_method(n_layers, n_heads))  # rows but the header and rule


@pytest.mark.parametrize("family", FAMILIES)
def test_every_head_has_its_entropy_and_importance(family, trained_synthetic_models, aligned):
    src, tgt, _, runs = aligned
    model, tokenizer, _ = load_model(trained_synthetic_models[family].checkpoint)
    from data.batching import ParallelDataset

    dataset = ParallelDataset(
        tokenizer.encode_src(src.read_text().splitlines()), tokenizer.encode_tgt(tgt.read_text().splitlines())
    )
    stats = head_stats(model, dataset)
    modules = model.attention_modules()
    assert len(stats) == sum(m.n_heads for kind in modules.values() for m in kind)
    longest = int(max(dataset.src_lengths().max(), dataset.tgt_lengths().max()))
    assert all(0.0 <= s.entropy <= math.log(longest) for s in stats)
    assert max(s.importance for s in stats) > 0.01  # some head matters to a model that reverses
    assert "## Heads" in (runs[family] / "report.md").read_text(encoding="utf-8")


def test_the_attention_tab_samples_carry_the_gold_and_the_model_links(aligned):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from viewer.format import decode

    *_, runs = aligned
    events = EventAccumulator(str(runs["transformer"] / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    tags = sorted(t for t in events.Tags()["tensors"] if t.startswith("nmt_attention/"))
    assert tags == [f"nmt_attention/gold{i}" for i in range(3)]  # apart from the validation sentences
    blobs = events.Tensors(tags[0])[0].tensor_proto.string_val
    header = decode(blobs[0], blobs[1])
    n_out = max(header["out_words"])  # the EOS "word" is the last
    assert sorted(j for _, j in header["gold"]["sure"]) == list(range(n_out))
    assert len(header["links"]) == n_out and header["links_method"]
    assert len(header["head_stats"]) == len(header["maps"])


def test_without_gold_fast_align_is_the_reference(trained_synthetic_models, synthetic_corpus, tmp_path):
    """Raw text, Moses-tokenized; the reference is fast_align trained on the training text and
    these pairs: the report says it measures agreement, and the model agrees with it."""
    src, tgt, _ = reversal_set(tmp_path)
    out = tmp_path / "out"
    code = align_script(
        "--checkpoint", trained_synthetic_models["rnn"].checkpoint, "--tokenize", "--src", src, "--tgt", tgt,
        "--train-src", synthetic_corpus / "train.de.gz", "--train-tgt", synthetic_corpus / "train.en.gz",
        "--dev", 20, "--out", out,
    )  # fmt: skip
    assert code == 0
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "agreement with an aligner, not accuracy" in report
    chosen = float(re.search(r"lowest AER\): \*\*.+?\*\*, AER ([\d.]+) on the rest", report).group(1))
    assert (
        chosen < 50.0 < reported_aer(report, "diagonal")
    )  # fast_align is not perfect on the reversal either


def test_a_gold_file_that_does_not_fit_is_one_line(trained_synthetic_models, tmp_path, capsys):
    src, tgt, gold = reversal_set(tmp_path, count=30)
    lines = gold.read_text().splitlines()
    lines[4] = lines[4] + " 40-1"
    gold.write_text("\n".join(lines) + "\n")
    code = align_with_gold(trained_synthetic_models["rnn"].checkpoint, src, tgt, gold, 10, tmp_path / "out")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "gold.talp line 5: link 40-1" in err[0], err
    assert not (tmp_path / "out").exists()


# ----- translate.py: the method of --alignments -----
def nbest_links(stdout: str):
    """``translate.py --nbest --alignments`` lines -> [(hypothesis, [(i, j), ...])]."""
    found = []
    for line in stdout.splitlines():  # "index ||| text ||| score<tab>links"
        head, links = line.split("\t")
        found.append((head.split(" ||| ")[1], [tuple(map(int, x.split("-"))) for x in links.split()]))
    return found


@pytest.mark.parametrize("family", FAMILIES)
def test_translate_aligns_by_the_chosen_method_in_beam_search_and_nbest(family, trained_synthetic_models):
    checkpoint = trained_synthetic_models[family].checkpoint
    sources = ["a b c d e", "f g h i"]
    plain = translate("--checkpoint", checkpoint, "--beam", 3, *sources)
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    layers = "1" if family == "rnn" else "2"
    by_reading = {}
    for reading in ("predict", "read"):
        done = translate(
            "--checkpoint",
            checkpoint,
            "--beam",
            3,
            "--nbest",
            2,
            "--alignments",
            "--align-reading",
            reading,
            "--align-layer",
            layers,
            *sources,
        )
        assert done.returncode == 0, done.stderr
        found = nbest_links(done.stdout)
        assert [hyp for hyp, _ in found[::2]] == plain.stdout.splitlines()  # alignments change no translation
        for hyp, links in found:
            assert sorted(j for _, j in links) == list(range(len(hyp.split())))  # each output word once
        # the command line's links are the Python API's with the same method
        method = Method(int(layers), None, reading)
        api = translator.translate(sources, beam=3, nbest=2, alignments=True, align_method=method)
        assert [links for _, links in found] == [h.alignment for r in api for h in r.nbest]
        by_reading[reading] = found
    assert by_reading["predict"] != by_reading["read"]


def test_the_predicting_step_of_an_rnn_aligns_the_reversal(trained_synthetic_models):
    translator = Translator.from_checkpoint(trained_synthetic_models["rnn"].checkpoint, device="cpu")
    result = translator.translate(
        ["a b c d e f"], beam=1, alignments=True, align_method=Method(reading="predict")
    )[0]
    assert result.text == "f e d c b a"
    assert result.alignment == [(5 - j, j) for j in range(6)]


@pytest.mark.parametrize("family", FAMILIES)
def test_outputs_cut_at_the_length_limit_are_aligned_word_by_word(family, trained_synthetic_models):
    checkpoint = trained_synthetic_models[family].checkpoint
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    for reading in ("predict", "read"):
        results = translator.translate(
            ["a b c d e f g h"],
            beam=2,
            nbest=2,
            alignments=True,
            align_method=Method(reading=reading),
            max_len_ratio=0.2,
            max_len_extra=1,
        )
        for hyp in results[0].nbest:
            assert not hyp.finished
            assert sorted(j for _, j in hyp.alignment) == list(range(len(hyp.text.split())))


def test_a_method_the_model_lacks_is_one_line(trained_synthetic_models):
    rnn = trained_synthetic_models["rnn"].checkpoint
    done = translate("--checkpoint", rnn, "--alignments", "--align-layer", 3, "a b")
    assert_one_error_line(done, "alignment layer 3: the model has 1 decoder layer(s)")
    done = translate("--checkpoint", rnn, "--alignments", "--align-heads", "x", "a b")
    assert_one_error_line(done, "--align-heads x: give 'all' or numbers from 1")
    done = translate("--checkpoint", rnn, "--align-reading", "read", "a b")
    assert_one_error_line(done, "choose the maps of --alignments, --plot or --tags")
    ensemble = ["--checkpoint", rnn, "--checkpoint", trained_synthetic_models["transformer"].checkpoint]
    done = translate(*ensemble, "--alignments", "--align-layer", 2, "a b")
    assert_one_error_line(
        done, "ensemble member 1 (rnn): alignment layer 2: the model has 1 decoder layer(s)"
    )


@pytest.mark.parametrize("dev", [0, 6])
def test_a_dev_part_that_leaves_no_pair_on_either_side_is_one_line(
    dev, trained_synthetic_models, tmp_path, capsys
):
    src, tgt, gold = reversal_set(tmp_path, count=6)
    out = tmp_path / "out"
    assert align_with_gold(trained_synthetic_models["rnn"].checkpoint, src, tgt, gold, dev, out) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: --dev {dev}: the first pairs choose the method and the rest report it, so with 6 pairs give a "
        "number from 1 to 5"
    )
    assert not out.exists()  # nothing written


def transfer_row(report: str, start: str):
    """The spans, exact match and word F1 of the tag transfer row whose name starts with ``start``."""
    section = report.split("## Tag transfer")[1].split("## Every layer")[0]
    row = next(line for line in section.splitlines() if line.startswith(f"| {start}"))
    return [float(cell) for cell in row.split("|")[2:5]]


def test_a_guided_checkpoint_reports_its_supervised_heads_and_tag_transfer(trained_guided_models, tmp_path):
    src, tgt, gold = reversal_set(tmp_path)
    out = tmp_path / "out"
    assert align_with_gold(trained_guided_models["transformer"].checkpoint, src, tgt, gold, 20, out) == 0
    report = (out / "report.md").read_text(encoding="utf-8")
    own = re.search(
        r"own method \(layer 1, head 1, predict, supervised by guided alignment\): AER ([\d.]+)", report
    )
    assert own and float(own.group(1)) < 10, report
    spans, exact, f1 = transfer_row(report, "checkpoint's own (supervised by guided alignment)")
    assert spans == 40 and exact >= 90 and f1 >= 95
    assert (
        transfer_row(report, "diagonal")[1] < 50
    )  # the reversal mirrors spans: a diagonal rarely carries one
