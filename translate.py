"""Translate with a trained checkpoint: ``python translate.py --checkpoint PATH [SENTENCE ...]``.

Sentences come from the arguments, ``--input FILE`` or standard input (one a line); translations
go to standard output or ``--output FILE``, one a line in the input order (an empty line gives an
empty line). On a terminal with no sentences given, it prompts and translates line by line.
Within the tool, sentences are sorted by length and decoded ``--batch-size`` at a time.

- ``--beam N`` (default 5; 1 is greedy) with the length penalty ``--alpha`` (GNMT; default: the
  one the run was tested with, ``trainer.length_penalty``, else 1.0).
- ``--nbest N``: ``N`` lines ``index ||| hypothesis ||| score`` per sentence (index from 0, score the
  length-normalised log-probability), best first.
- ``--alignments``: a tab, then Pharaoh word alignments ``i-j`` (source word ``i``, output word
  ``j``, from 0) after each translation. They come from the attention while the model produces its
  output: the RNN's additive attention, or the Transformer's last decoder layer's cross-attention
  averaged over its heads. Subword weights are summed into words and every output word is aligned
  to its most-attended source word (``models/alignment.py``).
- ``--plot DIR``: one PNG heatmap of that word attention per sentence, words on the axes.

Bad input (missing or foreign checkpoint, bad option, unreadable file) prints one ``error:`` line
on standard error and exits with 1 (2 for a bad command line). Heavy libraries are imported only
after the command line has been checked, so mistakes are reported at once.
"""
import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterable, List, Optional, Sequence, Tuple

MAX_LEN_RATIO, MAX_LEN_EXTRA = 1.5, 10  # the defaults of models/search.py (not imported: it needs torch)


class UsageError(Exception):
    """A bad command line or input: reported as one ``error:`` line."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line, no usage dump
        print(f"error: {message} (see python translate.py --help)", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="translate.py", description="Translate sentences with a checkpoint of train.py.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("sentences", nargs="*", metavar="SENTENCE", help="sentences to translate (default: read standard input)")
    parser.add_argument("--checkpoint", required=True, metavar="PATH", help="a checkpoint of train.py, e.g. outputs/.../checkpoints/best.pt")
    parser.add_argument("--input", metavar="FILE", help="read sentences from FILE, one a line")
    parser.add_argument("--output", metavar="FILE", help="write translations to FILE (replaced only when all are done)")
    parser.add_argument("--beam", type=int, default=5, help="beam size; 1 is greedy search")
    parser.add_argument("--alpha", type=float, default=None, help="GNMT length penalty (default: the run's trainer.length_penalty, else 1.0)")
    parser.add_argument("--nbest", type=int, default=None, help="print the N best hypotheses as 'index ||| hypothesis ||| score'")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences decoded together")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--max-len-ratio", type=float, default=MAX_LEN_RATIO, help="longest output: this times the source length ...")
    parser.add_argument("--max-len-extra", type=int, default=MAX_LEN_EXTRA, help="... plus this many tokens")
    parser.add_argument("--alignments", action="store_true", help="append a tab and Pharaoh word alignments i-j")
    parser.add_argument("--plot", metavar="DIR", help="write one attention heatmap PNG per sentence into DIR")
    return parser


def check_args(args: argparse.Namespace) -> None:
    """Range and consistency checks that need no heavy import; raises ``UsageError``."""
    if args.beam < 1:
        raise UsageError(f"--beam {args.beam}: the beam size must be at least 1")
    if args.nbest is not None and not 1 <= args.nbest <= args.beam:
        raise UsageError(f"--nbest {args.nbest}: must be between 1 and the beam size ({args.beam})")
    if args.batch_size < 1:
        raise UsageError(f"--batch-size {args.batch_size}: must be at least 1")
    if args.alpha is not None and args.alpha < 0:
        raise UsageError(f"--alpha {args.alpha}: the length penalty must be >= 0")
    if args.max_len_ratio < 0 or args.max_len_extra < 0 or args.max_len_ratio == args.max_len_extra == 0:
        raise UsageError(f"--max-len-ratio {args.max_len_ratio} --max-len-extra {args.max_len_extra}: the length limit must be positive")
    if args.sentences and args.input:
        raise UsageError("give sentences as arguments or --input FILE, not both")
    if not Path(args.checkpoint).is_file():
        raise UsageError(f"checkpoint {args.checkpoint} does not exist")
    if args.input and not Path(args.input).is_file():
        raise UsageError(f"input file {args.input} does not exist")


@dataclass
class Translation:
    text: str
    score: float
    alignment: Optional[List[Tuple[int, int]]] = None  # Pharaoh pairs (source word, output word)
    words: Optional[object] = None  # (output words, source words) attention, a tensor, for plots
    src_words: Sequence[str] = ()
    out_words: Sequence[str] = ()


def read_lines(stream: IO[bytes], name: str) -> List[str]:
    """UTF-8 lines without their line ends; a line that is not UTF-8 is an error naming it."""
    lines = []
    for number, raw in enumerate(stream, start=1):
        try:
            lines.append(raw.decode("utf-8").rstrip("\r\n"))
        except UnicodeDecodeError as error:
            raise UsageError(f"{name} line {number} is not UTF-8 text ({error.reason} at byte {error.start})") from None
    return lines


class Translator:
    """A loaded checkpoint that turns lists of sentences into lists of n-best translations."""

    def __init__(self, args: argparse.Namespace):
        from training.checkpoint import load_model
        from training.device import pick_device

        self.device = pick_device(args.device)
        self.model, self.tokenizer, payload = load_model(Path(args.checkpoint), self.device)
        trainer = (payload.get("config") or {}).get("trainer") or {}
        self.alpha = args.alpha if args.alpha is not None else float(trainer.get("length_penalty", 1.0))
        self.beam, self.nbest = args.beam, args.nbest or 1
        self.batch_size, self.ratio, self.extra = args.batch_size, args.max_len_ratio, args.max_len_extra
        self.need_weights = bool(args.alignments or args.plot)
        self.max_src = self.model.max_positions  # source ids, EOS included (None: no limit)

    def encode(self, lines: Sequence[str], numbers: Sequence[int]) -> List[List[int]]:
        """Source ids with EOS; too long for the model: truncated, with a warning naming the line number."""
        from data.specials import EOS_ID

        encoded = []
        for number, ids in zip(numbers, self.tokenizer.encode_src(lines)):
            if self.max_src is not None and len(ids) + 1 > self.max_src:
                print(f"warning: line {number}: {len(ids)} subword tokens, more than the model takes "
                      f"({self.max_src - 1}); translating the first {self.max_src - 1}", file=sys.stderr)
                ids = ids[: self.max_src - 1]
            encoded.append(ids + [EOS_ID])
        return encoded

    def translate(self, lines: Sequence[str], first_line: int = 1) -> List[List[Translation]]:
        """The n-best translations of every line, in the input order (an empty line: one empty translation)."""
        results: List[List[Translation]] = [[Translation("", 0.0, [] if self.need_weights else None)] for _ in lines]
        todo = [i for i, line in enumerate(lines) if line.strip()]
        ids = self.encode([lines[i] for i in todo], [first_line + i for i in todo]) if todo else []
        by_length = sorted(range(len(todo)), key=lambda k: len(ids[k]))
        for start in range(0, len(by_length), self.batch_size):
            chunk = by_length[start : start + self.batch_size]
            for k, hyps in zip(chunk, self.search([ids[k] for k in chunk])):
                results[todo[k]] = [self.describe(ids[k], hyp) for hyp in hyps]
        return results

    def search(self, batch: List[List[int]]):
        """n-best hypotheses (``models.search.Hypothesis``) of a batch of source id lists."""
        import torch

        from data.specials import BOS_ID, EOS_ID, PAD_ID
        from models.search import beam_search, greedy_search

        src = torch.full((len(batch), max(map(len, batch))), PAD_ID, dtype=torch.long)  # (B, S)
        for row, ids in enumerate(batch):
            src[row, : len(ids)] = torch.tensor(ids)
        src = src.to(self.device)
        src_mask = src != PAD_ID  # (B, S)
        limits = dict(max_len_ratio=self.ratio, max_len_extra=self.extra, need_weights=self.need_weights, pad_id=PAD_ID)
        if self.beam == 1:  # greedy: the same output as a beam of 1, without the bookkeeping
            return [[hyp] for hyp in greedy_search(self.model, src, src_mask, BOS_ID, EOS_ID, **limits)]
        return beam_search(self.model, src, src_mask, BOS_ID, EOS_ID, self.beam, self.alpha, self.nbest, **limits)

    def describe(self, src_ids: List[int], hyp) -> Translation:
        """A hypothesis as text, with its word attention and alignment when asked."""
        from models.alignment import hard_alignment, piece_words, word_attention

        text = " ".join(self.tokenizer.decode_tgt([hyp.tokens])[0].splitlines())
        if not self.need_weights:
            return Translation(text, hyp.score)
        src_pieces = self.tokenizer.src_pieces(src_ids[:-1])  # without EOS
        out_pieces = self.tokenizer.tgt_pieces(hyp.tokens)
        words = word_attention(hyp.alignment, src_pieces, out_pieces)  # (W_out, W_src)
        return Translation(
            text, hyp.score, hard_alignment(words), words,
            src_words=piece_words(src_pieces), out_words=piece_words(out_pieces),
        )


def format_lines(index: int, translations: List[Translation], nbest: bool, alignments: bool) -> List[str]:
    """Output lines of one input sentence."""
    from models.alignment import pharaoh

    lines = []
    for t in translations:
        line = f"{index} ||| {t.text} ||| {t.score:.4f}" if nbest else t.text
        if alignments and (nbest or t.text):  # an empty input line stays an empty line
            line += "\t" + pharaoh(t.alignment or [])
        lines.append(line)
    return lines


def write_plots(folder: Path, translations: List[List[Translation]], first_index: int = 0) -> None:
    """One heatmap per sentence: ``<index>.png``, output words by source words, the best hypothesis."""
    from training.figures import attention_figure

    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    width = max(4, len(str(first_index + len(translations))))
    for offset, nbest in enumerate(translations):
        best = nbest[0]
        if best.words is None or not best.out_words:
            continue
        index = first_index + offset
        title = f"sentence {index}: word attention (output x source)"
        fig = attention_figure(best.words, best.src_words, best.out_words, title, "source", "output")
        fig.savefig(folder / f"{index:0{width}d}.png")
        plt.close(fig)


class OutputFile:
    """``--output FILE`` written through a temporary file in the same folder and renamed at the end,
    so a failed run leaves an earlier FILE as it was; standard output otherwise."""

    def __init__(self, path: Optional[str]):
        self.file = None
        if not path:
            self.stream = sys.stdout
            return
        if Path(path).is_dir():
            raise UsageError(f"--output {path} is a folder, not a file")
        from training.files import AtomicFile

        try:
            self.file = AtomicFile(Path(path))
        except OSError as error:
            raise UsageError(f"cannot write --output {path}: {error.strerror}") from None
        self.stream = self.file.stream

    def write_lines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.stream.write(line + "\n")

    def commit(self) -> None:
        self.stream.flush()
        if self.file is not None:
            self.file.commit()

    def discard(self) -> None:
        if self.file is not None:
            self.file.discard()


def interactive(translator: Translator, out: OutputFile, args: argparse.Namespace) -> None:
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
        translations = translator.translate([line], first_line=index + 1)
        out.write_lines(format_lines(index, translations[0], args.nbest is not None, args.alignments))
        out.stream.flush()
        if args.plot:
            write_plots(Path(args.plot), translations, index)
        index += 1


def run(args: argparse.Namespace) -> None:
    out = OutputFile(args.output)
    try:
        translator = Translator(args)
        if not args.sentences and not args.input and sys.stdin.isatty():
            interactive(translator, out, args)
        else:
            if args.sentences:
                lines = list(args.sentences)
            elif args.input:
                with open(args.input, "rb") as stream:
                    lines = read_lines(stream, f"input file {args.input}")
            else:
                lines = read_lines(sys.stdin.buffer, "standard input")
            translations = translator.translate(lines)
            for index, nbest in enumerate(translations):
                out.write_lines(format_lines(index, nbest, args.nbest is not None, args.alignments))
            if args.plot:
                write_plots(Path(args.plot), translations)
        out.commit()
    finally:
        out.discard()


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_args(args)
        from training.checkpoint import CheckpointError

        try:
            run(args)
        except CheckpointError as error:
            raise UsageError(str(error)) from None
    except (UsageError, ValueError) as error:
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
