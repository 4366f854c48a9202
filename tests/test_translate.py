"""translate.py with checkpoints of models trained in the session: its ``main(argv)`` in this process
(standard input, output and error redirected: the whole command line but the start of Python and
torch), and as users run it, in a subprocess, where the process itself matters (standard input
from a pipe, a terminal, imports before the options are checked).

The models of ``trained_synthetic_models`` (conftest.py) have learnt the synthetic reversal task
(tests/synthetic.py), so translating held-out sources must give back their references, the
sources reversed: a check of the whole path (checkpoint -> tokenizer -> batched search ->
detokenized text in the input order).
"""

import logging
import os
import random
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
import torch

from common.checkpoint import load_checkpoint, save_checkpoint
from data.corpus import read_lines
from data.specials import EOS_ID
from data.tokenizer import normalize
from inference.translator import TorchEngine, Translator, default_batch_size, load_model
from models.search_options import MAX_LEN_EXTRA, MAX_LEN_RATIO

from helpers import ROOT, SPLIT, assert_one_error_line, translate, translate_process

FAMILIES = ["rnn", "transformer"]


@pytest.fixture(scope="module")
def pairs(synthetic_corpus):
    """The held-out pairs of the synthetic task (source, reference)."""
    src = read_lines(synthetic_corpus / f"{SPLIT}.de.gz")
    tgt = read_lines(synthetic_corpus / f"{SPLIT}.en.gz")
    return list(zip(src, tgt))


def too_long(source: str) -> str:
    """``source`` repeated into a line of thousands of subword tokens."""
    return " ".join([source] * 500)


def shuffled_by_length(pairs, n=24, seed=3):
    """``n`` pairs in an order where long and short sources alternate (so sorting inside the tool matters)."""
    chosen = random.Random(seed).sample(pairs, n)
    chosen.sort(key=lambda p: len(p[0].split()))
    return [chosen[i // 2] if i % 2 == 0 else chosen[-1 - i // 2] for i in range(n)]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("beam", [1, 5])
def test_translates_learnt_pairs_in_input_order(family, beam, trained_synthetic_models, pairs, tmp_path):
    checkpoint = trained_synthetic_models[family].checkpoint
    chosen = shuffled_by_length(pairs)
    source = tmp_path / "in.de"
    source.write_text("".join(src + "\n" for src, _ in chosen), encoding="utf-8")
    done = translate(
        "--checkpoint", checkpoint, "--input", source, "--beam", beam, "--batch-size", 5, "--device", "cpu"
    )
    assert done.returncode == 0, done.stderr
    hyps = done.stdout.splitlines()
    assert len(hyps) == len(chosen)
    references = [normalize(tgt) for _, tgt in chosen]
    bleu = sacrebleu.corpus_bleu(hyps, [references]).score
    assert bleu > 70, f"{family} beam {beam}: BLEU {bleu:.1f} on held-out reversals; first lines {hyps[:3]}"
    exact = sum(h == r for h, r in zip(hyps, references))
    assert exact >= len(chosen) // 2  # in the input order: most lines are their own reference


def test_arguments_and_standard_input_give_the_same_lines(trained_synthetic_models, pairs):
    checkpoint = trained_synthetic_models["transformer"].checkpoint
    first, second = pairs[0][0], pairs[7][0]
    # one thread in both processes: the same sums, so the same near ties on any machine
    by_args = translate("--checkpoint", checkpoint, "--beam", 3, "--threads", 1, first, second)
    by_stdin = translate_process(
        "--checkpoint", checkpoint, "--beam", 3, "--threads", 1, stdin=f"{first}\n\n   \n{second}\n"
    )
    assert by_args.returncode == by_stdin.returncode == 0, by_args.stderr + by_stdin.stderr
    one, two = by_args.stdout.splitlines()
    assert by_stdin.stdout.splitlines() == [one, "", "", two]  # an empty (or blank) line gives an empty line
    assert by_args.stderr == by_stdin.stderr == ""


def test_nbest_lists_are_sorted_and_indexed(trained_synthetic_models, pairs):
    checkpoint = trained_synthetic_models["rnn"].checkpoint
    sources = [pairs[i][0] for i in (2, 3, 4)]
    # one sentence a batch: an n-best list keeps its sentence longer in a batch, which would
    # change the other sentences' batch shapes (and kernels) against the plain run below
    done = translate(
        "--checkpoint",
        checkpoint,
        "--beam",
        4,
        "--nbest",
        3,
        "--batch-size",
        1,
        stdin="\n".join(sources) + "\n",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 9
    rows = [line.split(" ||| ") for line in lines]
    assert all(len(row) == 3 for row in rows)
    assert [int(row[0]) for row in rows] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for index in range(3):
        scores = [float(row[2]) for row in rows if int(row[0]) == index]
        texts = [row[1] for row in rows if int(row[0]) == index]
        assert scores == sorted(scores, reverse=True) and all(s <= 0 for s in scores)
        assert len(set(texts)) == 3  # three different hypotheses
    best = translate(
        "--checkpoint", checkpoint, "--beam", 4, "--batch-size", 1, stdin="\n".join(sources) + "\n"
    )
    assert best.stdout.splitlines() == [
        rows[i][1] for i in (0, 3, 6)
    ]  # the first of each list is the translation


@pytest.mark.parametrize("family", FAMILIES)
def test_alignments_are_well_formed_pharaoh(family, trained_synthetic_models, pairs):
    checkpoint = trained_synthetic_models[family].checkpoint
    sources = [pairs[i][0] for i in range(10)]
    done = translate("--checkpoint", checkpoint, "--alignments", stdin="\n".join(sources) + "\n")
    assert done.returncode == 0, done.stderr
    plain = translate("--checkpoint", checkpoint, stdin="\n".join(sources) + "\n")
    lines = done.stdout.splitlines()
    assert len(lines) == len(sources)
    # the alignment is appended, the translation unchanged (the search is the same; the attention
    # comes from a pass over the finished output)
    texts = [line.split("\t")[0] for line in lines]
    assert texts == plain.stdout.splitlines()
    for source, line in zip(sources, lines):
        hyp, alignment = line.split("\t")
        pairs_ij = [tuple(map(int, item.split("-"))) for item in alignment.split()]
        assert all(re.fullmatch(r"\d+-\d+", item) for item in alignment.split())
        n_src, n_out = len(normalize(source).split()), len(hyp.split())
        assert all(0 <= i < n_src and 0 <= j < n_out for i, j in pairs_ij)
        assert sorted(j for _, j in pairs_ij) == list(range(n_out))  # every output word once


def ends_at_once(checkpoint: Path, path: Path) -> Path:
    """A copy of an RNN checkpoint whose model outputs EOS at once, whatever the input: empty translations."""
    model, _, payload = load_model(checkpoint)
    with torch.no_grad():
        model.decoder.readout.weight.zero_()
        model.decoder.readout.bias.fill_(1.0)  # the readout is tanh(1) everywhere
        model.decoder.output.proj.weight.zero_()
        model.decoder.output.proj.weight[EOS_ID] = 1.0  # logits: EOS > 0, every other token 0
    save_checkpoint(dict(payload, model=model.state_dict()), path)
    return path


def test_an_empty_translation_keeps_the_tab_of_its_alignment(trained_synthetic_models, pairs, tmp_path):
    """With --alignments every line is 'translation, tab, pairs', also for a sentence translated to
    nothing; only a blank input line stays an empty line."""
    checkpoint = trained_synthetic_models["rnn"].checkpoint
    silent = ends_at_once(checkpoint, tmp_path / "silent.pt")
    done = translate("--checkpoint", silent, "--alignments", stdin=f"{pairs[0][0]}\n\n{pairs[1][0]}\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "\t\n\n\t\n"
    nbest = translate("--checkpoint", silent, "--alignments", "--nbest", 2, pairs[0][0])
    assert [line.split(" ||| ")[1] for line in nbest.stdout.splitlines()][:1] == [""]
    assert nbest.stdout.splitlines()[0].endswith("\t")


def test_python_api_translates_like_the_command_line(trained_synthetic_models, pairs, caplog):
    checkpoint = trained_synthetic_models["transformer"].checkpoint
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    sources = [pairs[i][0] for i in range(6)] + ["  "]
    # the command line's path exactly (fused attention, this process, its threads): the same n-best
    # lists and scores on any machine
    results = translator.translate(sources, beam=4, nbest=3, batch_size=4)
    options = ["--device", "cpu", "--beam", 4, "--nbest", 3, "--batch-size", 4]
    cli = translate("--checkpoint", checkpoint, *options, stdin="\n".join(sources) + "\n")
    assert cli.returncode == 0, cli.stderr
    expected = [(str(i), h.text, f"{h.score:.4f}") for i, r in enumerate(results) for h in r.nbest]
    printed = [tuple(line.split(" ||| ")) for line in cli.stdout.splitlines()]
    assert printed == expected
    # alignments come from a pass over the finished outputs: the search, and so the output, is the same
    aligned = translator.translate(sources, beam=4, nbest=3, alignments=True, batch_size=4)
    assert [a.text for a in aligned] == [r.text for r in results]
    for result in aligned[:-1]:
        scores = [h.score for h in result.nbest]
        assert len(scores) == 3 and scores == sorted(scores, reverse=True)
        assert (result.text, result.score) == (result.nbest[0].text, scores[0])
        assert sorted(j for _, j in result.alignment) == list(range(len(result.out_words)))
        assert result.words.shape == (len(result.out_words), len(result.src_words))
    assert (aligned[-1].text, aligned[-1].score, aligned[-1].alignment) == ("", 0.0, [])  # blank: not decoded
    greedy = translator.translate(sources[:6], beam=1)
    assert all(r.alignment is None and len(r.nbest) == 1 for r in greedy)
    references = [normalize(pairs[i][1]) for i in range(6)]
    bleu = sacrebleu.corpus_bleu([r.text for r in greedy], [references]).score
    assert bleu > 70, [
        r.text for r in greedy
    ]  # learnt reversals: a threshold, not a text that float kernels decide
    with caplog.at_level(logging.WARNING, logger="inference.translator"):
        translator.translate(["", too_long(pairs[0][0])], beam=1, max_len_ratio=0, max_len_extra=2)
    assert "line 2: " in caplog.text and "translating the first 1023" in caplog.text
    with pytest.raises(TypeError, match="list of sentences"):
        translator.translate("Ein Mann.")
    with pytest.raises(ValueError, match="nbest=5"):
        translator.translate(sources, beam=4, nbest=5)


def test_input_that_is_not_utf8_gives_one_error_line(trained_synthetic_models, tmp_path):
    checkpoint = trained_synthetic_models["rnn"].checkpoint
    latin1 = tmp_path / "latin1.de"
    latin1.write_bytes("Ein Mann.\nZwei Männer.\n".encode("latin-1"))
    done = translate("--checkpoint", checkpoint, "--input", latin1)
    assert_one_error_line(done, f"input file {latin1} line 2: invalid UTF-8")


def test_help_shows_the_search_length_defaults():
    done = translate("--help", "--checkpoint", "x")
    text = " ".join(done.stdout.split())
    assert done.returncode == 0
    assert f"source length ... (default: {MAX_LEN_RATIO})" in text
    assert f"many tokens (default: {MAX_LEN_EXTRA})" in text


def test_plots_one_png_per_sentence(trained_synthetic_models, pairs, tmp_path):
    checkpoint = trained_synthetic_models["transformer"].checkpoint
    sources = [pairs[0][0], "", pairs[1][0]]
    done = translate(
        "--checkpoint", checkpoint, "--plot", tmp_path / "plots", stdin="\n".join(sources) + "\n"
    )
    assert done.returncode == 0, done.stderr
    pngs = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert pngs == ["0000.png", "0002.png"]  # none for the empty line
    import matplotlib.image

    image = matplotlib.image.imread(tmp_path / "plots" / "0000.png")
    assert image.shape[0] > 200 and image.shape[1] > 300


def test_output_file_is_replaced_only_when_the_run_succeeds(trained_synthetic_models, pairs, tmp_path):
    checkpoint = trained_synthetic_models["rnn"].checkpoint
    out = tmp_path / "out.en"
    out.write_text("earlier output\n")
    failed = translate("--checkpoint", tmp_path / "missing.pt", "--output", out, pairs[0][0])
    assert failed.returncode != 0 and out.read_text() == "earlier output\n"
    done = translate("--checkpoint", checkpoint, "--output", out, pairs[0][0])
    assert done.returncode == 0 and done.stdout == ""
    assert out.read_text() == translate("--checkpoint", checkpoint, pairs[0][0]).stdout  # as printed
    assert [p.name for p in tmp_path.iterdir()] == ["out.en"]  # no temporary file left


def test_too_long_input_is_truncated_with_a_warning(trained_synthetic_models, pairs):
    checkpoint = trained_synthetic_models["transformer"].checkpoint  # max_positions 1024
    long_line = too_long(pairs[0][0])
    done = translate(
        "--checkpoint",
        checkpoint,
        "--beam",
        2,
        "--max-len-ratio",
        0,
        "--max-len-extra",
        8,
        stdin=f"\n{pairs[1][0]}\n{long_line}\n",
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 3
    expected = r"warning: line 3: \d+ subword tokens, more than the model takes \(1023\); translating the first 1023\n"
    assert re.fullmatch(expected, done.stderr)


def bad_checkpoints(folder: Path, good: Path):
    """(name, path, expected message) of files that are not usable checkpoints."""
    text = folder / "notes.txt"
    text.write_text("not a checkpoint\n")
    truncated = folder / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[:50_000])
    payload = load_checkpoint(good)
    old = folder / "old_format.pt"
    torch.save(dict(payload, format=0), old)
    foreign = folder / "foreign.pt"
    torch.save({"state_dict": payload["model"]}, foreign)
    mismatched = folder / "mismatched.pt"
    save_checkpoint(dict(payload, model_config=dict(payload["model_config"], d_model=64)), mismatched)
    return [
        ("missing", folder / "nothing.pt", "does not exist"),
        ("text", text, "not a file written by torch.save"),
        ("truncated", truncated, "truncated or corrupt"),
        ("old format", old, "has format 0, this version reads 1"),
        ("foreign", foreign, "is not a checkpoint of this project"),
        ("mismatched config", mismatched, "does not match its model config"),
    ]


def test_bad_checkpoints_give_one_error_line(trained_synthetic_models, tmp_path):
    good = trained_synthetic_models["rnn"].checkpoint
    for _name, path, expected in bad_checkpoints(tmp_path, good):
        assert_one_error_line(translate("--checkpoint", path, "Ein Mann."), expected)


def test_a_checkpoint_with_the_other_familys_config_is_refused(trained_synthetic_models, tmp_path):
    """RNN weights under the Transformer's model config (say, configs mixed up by hand): one line
    that counts and names the weights that do not fit, no traceback, and no output file."""
    rnn = load_checkpoint(trained_synthetic_models["rnn"].checkpoint)
    transformer = load_checkpoint(trained_synthetic_models["transformer"].checkpoint)
    mixed = tmp_path / "mixed.pt"
    save_checkpoint(dict(rnn, model_config=transformer["model_config"]), mixed)
    out = tmp_path / "out.en"
    done = translate("--checkpoint", mixed, "--output", out, "Ein Mann.")
    assert_one_error_line(done, "does not match its model config (model transformer: ")
    assert "weights missing, e.g. " in done.stderr and "unexpected, e.g. " in done.stderr
    assert not out.exists()


def test_a_checkpoint_carrying_code_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    evil = tmp_path / "evil.pt"
    torch.save({"model": Payload(), "model_config": {}, "format": 1}, evil)
    done = translate("--checkpoint", evil, "Ein Mann.")
    assert_one_error_line(done, "pickled code or objects")
    assert not marker.exists()


@pytest.mark.parametrize(
    "options, expected",
    [
        (["--beam", "0", "Ein Mann."], "--beam 0"),
        (["--beam", "4", "--nbest", "5", "Ein Mann."], "--nbest 5: must be between 1 and the beam size (4)"),
        (["--batch-size", "0", "Ein Mann."], "--batch-size 0"),
        (["--alpha", "-1", "Ein Mann."], "--alpha -1.0"),
        (["--max-len-ratio", "-1", "Ein Mann."], "--max-len-ratio -1.0"),
        (["--beam", "five", "Ein Mann."], "invalid int value: 'five'"),
        (["--frobnicate", "Ein Mann."], "unrecognized arguments: --frobnicate"),
        (["--input", "no_such_file.de"], "input file no_such_file.de does not exist"),
        (["--input", "README.md", "Ein Mann."], "not both"),
    ],
)
def test_bad_options_give_one_error_line(options, expected, trained_synthetic_models):
    checkpoint = trained_synthetic_models["rnn"].checkpoint
    assert_one_error_line(translate("--checkpoint", checkpoint, *options), expected)


def test_bad_device_and_unwritable_output(trained_synthetic_models, tmp_path):
    checkpoint = trained_synthetic_models["rnn"].checkpoint
    assert_one_error_line(
        translate("--checkpoint", checkpoint, "--device", "tpu", "Ein Mann."), "not a torch device"
    )
    if not torch.cuda.is_available():
        assert_one_error_line(
            translate("--checkpoint", checkpoint, "--device", "cuda", "Ein Mann."), "no CUDA device"
        )
    missing_folder = tmp_path / "no" / "such" / "out.en"
    assert_one_error_line(
        translate("--checkpoint", checkpoint, "--output", missing_folder, "Ein Mann."),
        "cannot write --output",
    )


def test_output_into_a_read_only_folder(trained_synthetic_models, read_only_folder):
    checkpoint = trained_synthetic_models["rnn"].checkpoint
    assert_one_error_line(
        translate("--checkpoint", checkpoint, "--output", read_only_folder / "out.en", "Ein Mann."),
        "cannot write --output",
    )


def test_command_line_errors_come_before_heavy_imports():
    code = (
        "import sys, translate; rc = translate.main(['--checkpoint', 'missing.pt', 'x']); "
        "print(rc, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["1", "False"]


def test_interactive_prompt_on_a_terminal(trained_synthetic_models, pairs):
    """With a terminal on standard input and no sentences, each line entered is translated at once."""
    checkpoint = trained_synthetic_models["transformer"].checkpoint
    master, slave = os.openpty()
    process = subprocess.Popen(
        [sys.executable, "translate.py", "--checkpoint", str(checkpoint), "--beam", "2"],
        cwd=ROOT,
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(slave)
    try:
        os.write(master, (pairs[0][0] + "\n").encode())
        ready, _, _ = select.select([process.stdout], [], [], 60)
        assert ready, "no translation within 60 s"
        first = process.stdout.readline()  # printed before the next line is typed
        os.write(master, b"\x04")  # Ctrl-D: end of input
        out, err = process.communicate(timeout=30)
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
    piped = translate_process("--checkpoint", checkpoint, "--beam", "2", stdin=pairs[0][0] + "\n")
    assert first == piped.stdout  # as piped input is translated, by a process like it
    assert process.returncode == 0 and "Ctrl-D" in err


def test_a_gpu_decodes_in_larger_batches_by_default(trained_synthetic_models):
    """64 sentences at a time on the CPU; a thousand on a GPU, where a search step costs about the
    same for either (the engine's device decides, not whether this machine has a GPU)."""
    trainer = trained_synthetic_models["rnn"].trainer
    assert default_batch_size(TorchEngine(trainer.setup.model, torch.device("cpu"))) == 64
    on_gpu = TorchEngine.__new__(TorchEngine)  # an engine whose model would run on a GPU
    on_gpu.device = torch.device("cuda", 0)
    assert default_batch_size(on_gpu) == 1024
    ct2 = type("Engine", (), {"device": "cuda"})()  # CTranslate2's engine batches as it does
    assert default_batch_size(ct2) == 64
