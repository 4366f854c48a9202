"""Does the attention align words? ``python scripts/align.py --checkpoint CK --src F --tgt F [--gold F] --out DIR``.

The checkpoint's model reads each source sentence and is fed its target teacher-forced; every
cross-attention map (each layer and head, the means of the heads and of the layers, under both
readings: the step that predicts a word, the step that reads it) gives word links, pooled from
subwords to the texts' space-separated words (``alignment/forced.py``). Each method is
scored against a reference, chosen on the dev part (the first ``--dev`` pairs, 100 by default) and
reported on the rest (``alignment/evaluation.py``):

- ``--gold F``: human links (sure ``i-j`` and possible ``ipj``, 1-based: the talp format of the
  standard German-English set); the score is the alignment error rate (AER);
- without ``--gold``: fast_align's links on the same pairs are the reference (trained on
  ``--train-src/--train-tgt`` plus these pairs), and the score is *agreement with an aligner*,
  not accuracy.

References scored by the same code: the diagonal, and with ``--train-src/--train-tgt`` (the model's
training text, raw: Moses-tokenized and lowercased here) fast_align trained on it, with and
without these pairs added (``alignment/fast_align.py``). ``--tokenize`` Moses-tokenizes raw
``--src/--tgt`` text first (a gold set is tokenized already). ``--heads-src/--heads-tgt`` (raw
parallel text, e.g. the validation split) add every head's entropy and importance
(``alignment/heads.py``).

Writes ``DIR/report.md`` (the whole grid, the references, the chosen method and its AER on the
rest, the checkpoint's own method: its supervised heads when it was trained with guided alignment,
and with ``--gold`` tag transfer: random source spans carried through each system's links, scored
against the gold links' spans, ``alignment/transfer.py``), ``DIR/alignments.txt`` (the chosen
method's links, Pharaoh ``i-j``, 0-based, one line per pair), ``DIR/grid.png`` (AER on the dev part,
layers by heads, per reading), and with ``--tensorboard DIR`` the first ``--samples`` pairs as
Attention-tab samples with the reference's links and the chosen method's (``viewer/``).
"""

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, List, NamedTuple, Optional, Sequence, Tuple

from alignment.scores import AlignmentError, Gold, Links, pharaoh
from common.checkpoint import CheckpointError
from common.files import AtomicFile, write_lines
from data.errors import DataError

if TYPE_CHECKING:  # torch loads only once the command line is checked
    from torch import nn

    from alignment.heads import HeadStats
    from data.tokenizer import Tokenizer


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Word alignments from a model's attention, scored against gold or fast_align links.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--checkpoint", required=True, help="a checkpoint of train.py")
    add("--src", required=True, help="source sentences, one a line (words: space-separated tokens)")
    add("--tgt", required=True, help="their target sentences")
    add("--gold", help="human links of these pairs (talp: i-j sure, ipj possible, 1-based)")
    add("--out", required=True, help="folder for report.md, alignments.txt and grid.png")
    add("--dev", type=int, default=100, help="the first N pairs choose the method; the rest report it")
    add("--tokenize", action="store_true", help="Moses-tokenize raw --src/--tgt text first")
    add("--src-lang", default="de", help="the source language (Moses tokenizer)")
    add("--tgt-lang", default="en", help="the target language (Moses tokenizer)")
    add("--train-src", help="raw training text of fast_align, source side (e.g. the model's training text)")
    add("--train-tgt", help="... target side")
    add("--heads-src", help="raw parallel text for each head's entropy and importance, source side")
    add("--heads-tgt", help="... target side")
    add(
        "--tensorboard", metavar="DIR", help="write Attention-tab samples with the links into this log folder"
    )
    add("--samples", type=int, default=8, help="how many pairs --tensorboard writes")
    add("--device", default="cpu", help="cpu, cuda or auto")
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    """Files that must exist and options that must go together; ``SystemExit`` with one line."""
    for flag in ("checkpoint", "src", "tgt", "gold", "train_src", "train_tgt", "heads_src", "heads_tgt"):
        path = getattr(args, flag)
        if path is not None and not Path(path).exists():
            sys.exit(f"error: --{flag.replace('_', '-')} {path} does not exist")
    for a, b in (("train_src", "train_tgt"), ("heads_src", "heads_tgt")):
        if (getattr(args, a) is None) != (getattr(args, b) is None):
            sys.exit(f"error: give --{a.replace('_', '-')} and --{b.replace('_', '-')} together")
    if args.gold is None and args.train_src is None:
        sys.exit("error: without --gold the reference is fast_align: give --train-src and --train-tgt")
    if args.samples < 1:
        sys.exit(f"error: --samples {args.samples}: write at least one pair (or leave --tensorboard out)")
    if args.tokenize and args.gold:
        sys.exit(
            "error: --tokenize with --gold: gold links count the words of the text as given; give tokenized text"
        )


class Sample(NamedTuple):
    """The pairs written to the Attention tab: their ids (no EOS) and texts."""

    src_ids: List[List[int]]
    tgt_ids: List[List[int]]
    src_text: List[str]
    tgt_text: List[str]


def write_samples(
    log_dir: Path,
    model: "nn.Module",
    sample: Sample,
    tokenizer: "Tokenizer",
    gold: Sequence[Gold],
    links: Tuple[Sequence[Links], str],
    stats: Optional[Sequence["HeadStats"]],
    gold_label: Optional[str] = None,
) -> None:
    """The pairs of ``sample`` as Attention-tab sentences (tags ``nmt_attention/gold<i>``, step 0)
    with the reference's links (``gold``), the chosen method's (``links``: the links per pair and
    the method's name) and, when measured, every head's numbers."""
    from alignment.forced import forced_attention, src_with_eos
    from training.board import Board
    from viewer.summaries import Texts, head_stats_by_map

    attention = forced_attention(model, src_with_eos(sample.src_ids), sample.tgt_ids)
    per_map = head_stats_by_map(stats) if stats else None
    extras = [
        {
            "gold": {"sure": sorted(gold[b].sure), "possible": sorted(gold[b].possible)},
            "links": sorted(links[0][b]),
            "links_method": links[1],
            "head_stats": per_map,
            "gold_label": gold_label,
        }
        for b in range(len(sample.src_ids))
    ]
    board = Board(log_dir)
    board.attention_summaries(
        model.cfg.name,
        attention,
        [tokenizer.src_pieces(ids) for ids in src_with_eos(sample.src_ids)],
        [tokenizer.tgt_pieces(ids) for ids in src_with_eos(sample.tgt_ids)],
        [Texts(src, tgt, tgt) for src, tgt in zip(sample.src_text, sample.tgt_text)],
        0,
        tag="gold",
        extras=extras,
    )
    board.close()


def run(args: argparse.Namespace) -> str:
    """Everything the command does; returns the report."""
    from alignment.evaluation import (
        choose,
        every_method_scored,
        read_pairs,
        reference_about,
        references_and_gold,
        report,
        score,
        transfer_table,
    )
    from alignment.forced import batched_cross_maps, src_with_eos
    from alignment.heads import text_head_stats
    from alignment.words import piece_ids
    from common.device import pick_device
    from inference.figures import alignment_grid_figure
    from inference.translator import checkpoint_method, load_model, trained_with_guidance

    langs = (args.src_lang, args.tgt_lang)
    src_lines, tgt_lines, src_words, tgt_words = read_pairs(
        Path(args.src), Path(args.tgt), args.dev, args.tokenize, langs
    )
    model, tokenizer, payload = load_model(Path(args.checkpoint), pick_device(args.device))
    family, attention = payload["model_config"]["name"], payload["model_config"].get("attention", "")
    src_ids, tgt_ids = piece_ids(tokenizer, src_words, tgt_words)
    train = (Path(args.train_src), Path(args.train_tgt)) if args.train_src else None
    gold_file = Path(args.gold) if args.gold else None
    references, gold = references_and_gold(src_words, tgt_words, gold_file, train, langs)

    start = time.perf_counter()
    maps = batched_cross_maps(model, src_with_eos(src_ids), tgt_ids)  # (L, H, T + 1, S) each
    predicted, scored = every_method_scored(maps, tokenizer, src_ids, tgt_ids, gold, args.dev)
    seconds, methods, (n_layers, n_heads) = time.perf_counter() - start, list(scored), maps[0].shape[:2]
    chosen = choose(scored)
    own_method = checkpoint_method(payload)  # the supervised heads of a model trained with guided alignment
    own_links, own = (
        found[own_method]
        for found in every_method_scored(maps, tokenizer, src_ids, tgt_ids, gold, args.dev, [own_method])
    )
    guided = "supervised by guided alignment" if trained_with_guidance(payload) else "the default"
    systems = {
        f"chosen: {chosen.label}": predicted[chosen],
        f"checkpoint's own ({guided}): {own_method.label}": own_links,
        **references,
    }
    transfer = (
        transfer_table(systems, gold, [len(words) for words in src_words], args.dev) if args.gold else []
    )
    stats, stats_about = (None, "")
    if args.heads_src:
        stats, stats_about = text_head_stats(model, tokenizer, Path(args.heads_src), Path(args.heads_tgt))
    about = [
        f"Checkpoint `{args.checkpoint}`: {family}, {attention} attention, {n_layers} decoder layer(s) of "
        f"{n_heads} head(s).",
        f"Pairs: `{args.src}` / `{args.tgt}`, {len(src_lines)} pairs; the first {args.dev} are the dev part "
        f"(the method is chosen there), the other {len(src_lines) - args.dev} the rest (reported).",
        f"Reference: {reference_about(args.gold)}.",
        f"Methods: {len(methods)} (each layer's heads and their mean, the mean of all layers, at the predicting "
        f"step and at the reading step); forced decoding and pooling took {seconds:.1f} s.",
        "AER, precision and recall in percent; AER = 1 - (|A & S| + |A & P|) / (|A| + |S|).",
    ]
    refs = [score(name, links, gold, args.dev) for name, links in references.items()]
    text = report(
        f"Word alignment from attention: {args.checkpoint}",
        about,
        scored[chosen],
        refs,
        [scored[m] for m in methods],
        stats,
        stats_about,
        replace(own, name=f"{own.name}, {guided}"),
        transfer,
    )

    what = "AER against human links" if args.gold else "disagreement with fast_align (1 - agreement)"
    figure = alignment_grid_figure(scored, f"{family}, {attention} attention: {what}, dev part")
    # everything is computed: the files now, each written whole or not at all
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_lines(out / "alignments.txt", [pharaoh(sorted(links)) for links in predicted[chosen]])
    with AtomicFile(out / "grid.png", mode="wb") as file:
        figure.savefig(file, format="png", dpi=100)
    write_lines(out / "report.md", text.splitlines())
    if args.tensorboard:
        n = min(args.samples, len(src_ids))
        sample = Sample(src_ids[:n], tgt_ids[:n], src_lines[:n], tgt_lines[:n])
        links = (predicted[chosen][:n], chosen.label)
        label = None if args.gold else "fast_align's links (not a person's)"
        write_samples(Path(args.tensorboard), model, sample, tokenizer, gold[:n], links, stats, label)
    return text


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    check_args(args)
    try:
        print(run(args))
    except (AlignmentError, DataError, CheckpointError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
