"""Translate with a trained checkpoint: ``python translate.py --checkpoint PATH [SENTENCE ...]``.

Sentences come from the arguments, ``--input FILE`` or standard input (one a line); translations
go to standard output or ``--output FILE``, one a line in the input order. On a terminal with no
sentences given, it prompts and translates line by line. ``--beam``/``--alpha`` choose the search,
``--nbest N`` prints ``index ||| hypothesis ||| score`` lines, ``--alignments`` appends Pharaoh word
alignments from the cross-attention (``--align-layer/--align-heads/--align-reading`` choose the maps;
``--plot DIR`` draws them; ``--tags`` carries inline markup into the translation by them), several
``--checkpoint`` decode as an ensemble, and ``--engine
ctranslate2`` decodes an export folder; ``python translate.py --help`` and docs/translation.md say
more. Bad input prints one ``error:`` line and exits with 1 (2 for a bad command line); torch and
the models load only once the command line has been checked.

A thin command line over ``inference.translator.Translator`` (the Python API, chosen by
``inference.engines``) and ``inference/command_line.py`` (model paths, input, output file, plots,
warnings): this file parses and checks the arguments, runs the loop and turns errors into exit
codes.
"""

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from alignment.method import READINGS, parse_method

# None of these imports torch: the command line is checked before torch and the models load.
from common.progress_bar import progress_bar
from data.errors import DataError
from inference.command_line import Output, UsageError, check_model_path, read_input, show_warnings
from inference.ctranslate2_export import ExportError
from models.search_options import MAX_LEN_EXTRA, MAX_LEN_RATIO, SearchOptionError, SearchOptions

if TYPE_CHECKING:  # imported for real once the command line is checked (they need torch)
    from inference.translator import Translator

# The names of models/search_options.py's options on this command line.
OPTION_FLAGS = {
    "beam_size": "--beam",
    "nbest": "--nbest",
    "alpha": "--alpha",
    "max_len_ratio": "--max-len-ratio",
}


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line, no usage dump
        print(f"error: {message} (see python translate.py --help)", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="translate.py",
        description="Translate sentences with a checkpoint of train.py.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add(
        "sentences",
        nargs="*",
        metavar="SENTENCE",
        help="sentences to translate (default: read standard input)",
    )
    add(
        "--checkpoint",
        required=True,
        action="append",
        metavar="PATH",
        help="a checkpoint of train.py, e.g. outputs/.../checkpoints/best.pt (--engine ctranslate2: an export "
        "folder); given more than once, the checkpoints decode as an ensemble",
    )
    add(
        "--engine",
        choices=("torch", "ctranslate2"),  # inference/engines.py
        default="torch",
        help="torch: our own search over a checkpoint; ctranslate2: a folder of scripts/export_ctranslate2.py",
    )
    add("--input", metavar="FILE", help="read sentences from FILE, one a line")
    add("--output", metavar="FILE", help="write translations to FILE (replaced only when all are done)")
    add("--beam", type=int, default=5, help="beam size; 1 is greedy search")
    add(
        "--alpha",
        type=float,
        help="GNMT length penalty (default: the run's trainer.length_penalty, else 1.0)",
    )
    add("--nbest", type=int, help="print the N best hypotheses as 'index ||| hypothesis ||| score'")
    add("--batch-size", type=int, help="sentences decoded together (default: 64 on the CPU, 1024 on a GPU)")
    add("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    add(
        "--dtype",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help="precision of the torch engine: auto decodes as the run was validated and tested (its "
        "results.json's decode_dtype), in float32 where a CPU has no native bf16",
    )
    add(
        "--threads",
        type=int,
        default=0,
        help="CPU threads (0: torch's default; CTranslate2's 4, at most the cores this process may use)",
    )
    add(
        "--max-len-ratio",
        type=float,
        default=MAX_LEN_RATIO,
        help="longest output: this times the source length ...",
    )
    add("--max-len-extra", type=int, default=MAX_LEN_EXTRA, help="... plus this many tokens")
    add("--alignments", action="store_true", help="append a tab and Pharaoh word alignments i-j")
    add(
        "--tags",
        action="store_true",
        help="the input holds inline tags (<b>...</b>, <a href=...>...</a>, <br/>): translate the text and put "
        "each tag around the output words aligned to the words it enclosed",
    )
    add("--plot", metavar="DIR", help="write one attention heatmap PNG per sentence into DIR")
    add("--align-layer", metavar="N|all", help="alignments from this decoder layer (all: their mean)")
    add("--align-heads", metavar="N[,N]|all", help="... from these heads (all: their mean)")
    add(
        "--align-reading",
        choices=READINGS,
        help="... at the step that predicts a word or the one that reads it",
    )
    return parser


def check_args(args: argparse.Namespace) -> Dict[str, Any]:
    """Range and consistency checks that need no heavy import (``UsageError``); the keyword arguments
    of ``Translator.translate`` that the command line sets, decided here once."""
    try:  # the search options' own checks (alpha None: the run's, checked once it is loaded)
        SearchOptions(
            args.beam, args.alpha or 0.0, args.nbest or 1, None, args.max_len_ratio, args.max_len_extra
        )
    except SearchOptionError as error:
        raise UsageError(f"{OPTION_FLAGS[error.name]} {error.value}: {error.problem}") from None
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError(f"--batch-size {args.batch_size}: must be at least 1")
    if args.sentences and args.input:
        raise UsageError("give sentences as arguments or --input FILE, not both")
    if args.threads < 0:
        raise UsageError(f"--threads {args.threads}: must be 0 (the default) or more")
    if args.engine == "ctranslate2" and args.dtype != "auto":
        raise UsageError(
            "--dtype is for the torch engine: a CTranslate2 export runs the type it was exported in"
        )
    if args.engine == "ctranslate2" and len(args.checkpoint) > 1:
        raise UsageError(
            "--engine ctranslate2 takes one export folder: ensembles decode with the torch engine"
        )
    for path in args.checkpoint:
        check_model_path(Path(path), args.engine)
    method = None  # the --align-* choice (a flag left out: all layers, all heads, predict), else the default
    if args.align_layer is not None or args.align_heads is not None or args.align_reading is not None:
        try:
            method = parse_method(
                args.align_layer or "all", args.align_heads or "all", args.align_reading or "predict"
            )
        except ValueError as error:
            raise UsageError(str(error)) from None
    if method is not None and not (args.alignments or args.plot or args.tags):
        raise UsageError(
            "--align-layer/--align-heads/--align-reading choose the maps of --alignments, --plot or --tags: "
            "give one"
        )
    if args.input and not Path(args.input).is_file():
        raise UsageError(f"input file {args.input} does not exist")
    return dict(
        beam=args.beam,
        alpha=args.alpha,
        nbest=args.nbest or 1,
        batch_size=args.batch_size,
        alignments=bool(args.alignments or args.plot or args.tags),  # plots and tags need the alignment too
        tags=args.tags,
        align_method=method,
        max_len_ratio=args.max_len_ratio,
        max_len_extra=args.max_len_extra,
    )


def interactive(translator: "Translator", out: Output, options: Dict[str, Any]) -> None:
    """A prompt on the terminal: each line entered is translated at once; Ctrl-D ends."""
    print("Type a sentence and press Enter to translate it; Ctrl-D ends.", file=sys.stderr)
    index = 0
    while True:
        print("> ", end="", file=sys.stderr, flush=True)  # the prompt is not part of the output
        line = sys.stdin.readline()
        if not line:  # Ctrl-D
            print(file=sys.stderr)
            return
        line = line.rstrip("\r\n")
        results = translator.translate([line], first_line=index + 1, **options)
        out.write(index, [line], results)
        index += 1


def translate_all(translator: "Translator", out: Output, lines: List[str], options: Dict[str, Any]) -> None:
    """Every input line (the arguments, the input file or piped standard input) into ``out``; the
    progress on standard error (a bar on a terminal)."""
    with progress_bar(len(lines), "translating", "sentences") as bar:
        results = translator.translate(lines, progress=bar.update, **options)
    out.write(0, lines, results)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        options = check_args(args)
        # The one deferred import: torch and the models load only once the command line is known to be good.
        from common.checkpoint import CheckpointError
        from inference.engines import translator_for

        try:
            with (
                Output(args.output, args.nbest is not None, args.alignments, args.plot) as out,
                show_warnings(),
            ):
                translator = translator_for(
                    args.engine, args.checkpoint, args.device, args.dtype, args.threads
                )
                if options["alignments"]:  # the method checked before the first line, also at a prompt
                    translator.check_alignment(options["align_method"])
                if not args.sentences and not args.input and sys.stdin.isatty():
                    interactive(translator, out, options)
                else:
                    translate_all(translator, out, read_input(args.sentences, args.input), options)
        except CheckpointError as error:
            raise UsageError(str(error)) from None
    except (UsageError, DataError, ValueError, ExportError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. piped into `head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
