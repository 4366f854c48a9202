"""Compare finished training runs: ``python scripts/compare.py PATH [PATH ...]``.

PATH is a run folder (it holds ``results.json``) or a folder of runs, such as a Hydra multirun
folder (every finished run below it is taken, in job order). Prints a Markdown report and writes
it to ``comparison.md``, with ``comparison.png`` beside it:

- one row per run: model, parameters, steps, epochs, training time, target tokens/s, validation
  BLEU (greedy, best evaluation), the test weights (whichever of ``best.pt`` and the weight
  averages validated best), and BLEU and chrF of every test split (beam search with those
  weights), with the sacrebleu signatures once;
- significance: sacrebleu's paired bootstrap resampling of every run against the first one, per
  test split, from the runs' ``<split>.hyp`` and ``<split>.ref`` files (p-values, and each
  system's mean score with a 95% confidence interval over the resampled test sets);
- runs whose configs differ only by ``seed`` form a group: mean and standard deviation over the
  seeds (``python train.py -m +experiment=compare_multi30k seed=1,2,3``);
- significance across seeds, when two or more groups have 2+ seeds: every such group against the
  first, per test split and metric: the paired bootstrap of each pair of runs with the same seed,
  Welch's t-test on the per-seed scores, an exact permutation test over the pooled per-seed
  scores, and a sentence that says what they show;
- architecture and attention, when the groups of 2+ seeds cross the ``model`` group with
  ``model.attention`` (read from each run's config; ``+experiment=attention_grid``): per cell the
  mean ± std over the seeds of validation BLEU and chrF, training minutes, target tokens/s and
  each test split's BLEU and chrF, the cell with the highest mean validation BLEU, and each
  factor's effect within each level of the other (the attention in each architecture, the
  architecture with each attention): the difference of the means, Welch's and the permutation
  test's p, and what they show; when the cells were trained at several peak rates (``trainer.lr``,
  nothing else differing within a cell), all of it under two protocols, one rate per architecture
  (the rate all its cells were trained at) and each cell at its best rate (both chosen on
  validation), with a table of the verdicts under both side by side;
- configurations with one seed, when others have 2+ (exploratory runs): their scores and cost,
  and whether their validation BLEU is below, within or above the seeds of each configuration of
  their model with 2+ seeds;
- validation BLEU at equal budgets: a table of each group's validation BLEU (mean ± std over its
  seeds, interpolated between evaluations) after 5, 10, 15, ... minutes of training
  (``--minutes-step``) and after 1, 2, 3, ... epochs, with which group leads at each budget and
  where Welch's t-test over the seeds shows the lead (among the groups of 2+ seeds, when there
  are some);
- the learning rate, when runs differ only by ``trainer.lr`` and the seed
  (``+experiment=attention_lr``): per configuration and rate the validation BLEU of each seed
  and their mean, the cross-attention's entropy at the last evaluation (with the collapsed
  runs), and the best rate, said to lie inside the range or at an end of it; the figure
  ``learning_rates.png`` draws both against the rate, a line per configuration; with curves of
  one configuration at several budgets (a 3-epoch sweep and full runs), whether the shorter budget
  chooses the longer one's best rate and orders the pairs of rates as it does;
- ``comparison.png``: validation BLEU against training minutes and against epochs, per group the
  mean over its seeds and a band from the lowest to the highest seed (one run: its curve), read
  from each run's TensorBoard event files (``valid/bleu`` and ``valid/train_seconds`` at each
  evaluation's step; the epoch of that step from ``valid_history`` in ``results.json``).

- ``--ensemble RUN RUN [RUN ...]`` (repeatable): those runs' test weights decode their test
  splits together, as ``translate.py --checkpoint A --checkpoint B`` does, scored next to each
  member decoded alone the same way, with the decoding times (this part loads torch and decodes;
  ``--device`` chooses where).

``--out DIR`` chooses where the two files go (default: the folder of runs when one is given, else
the current folder). A PATH that holds no finished run is an error (exit 1).
"""

import argparse
import sys
from pathlib import Path

# None of these imports torch: this script stays quick to start.
from common.files import AtomicFile
from comparison.curves import run_curves, run_events
from comparison.figure import plot
from comparison.rates import cross_entropy, plot_rates, rate_curves
from comparison.report import report
from comparison.runs import RESULTS, CompareError, collect_runs, groups_of
from data.errors import DataError


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "paths", nargs="+", type=Path, metavar="PATH", help="a run folder or a folder of runs"
    )
    parser.add_argument("--out", type=Path, help="folder for comparison.md and comparison.png")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (default 1000)")
    parser.add_argument(
        "--minutes-step",
        type=float,
        default=5.0,
        metavar="MIN",
        help="the training-time budgets of the equal-time table: MIN, 2 MIN, ... minutes (default 5)",
    )
    parser.add_argument("--no-plot", action="store_true", help="do not write comparison.png")
    parser.add_argument(
        "--ensemble",
        nargs="+",
        action="append",
        type=Path,
        default=[],
        metavar="RUN",
        help="run folders whose test weights decode the test splits as an ensemble, scored next to "
        "each of them (repeat for more ensembles; give the PATHs first: --ensemble takes every folder "
        "after it)",
    )
    parser.add_argument("--device", default="auto", help="where ensembles decode: auto, cpu, cuda or cuda:N")
    args = parser.parse_args(argv)
    if args.bootstrap < 1:
        parser.error("--bootstrap must be at least 1")
    if not args.minutes_step > 0:
        parser.error("--minutes-step must be above 0")
    return args


def out_folder(args: argparse.Namespace) -> Path:
    if args.out is not None:
        return args.out
    only = args.paths[0]
    if len(args.paths) == 1 and only.is_dir() and not (only / RESULTS).is_file():
        return only
    return Path(".")


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        run_events.cache_clear()  # events read afresh for each report (runs may have gone on)
        runs = collect_runs(args.paths)
        curves = {run.path: run_curves(run) for run in runs}
        out = out_folder(args)
        if not out.is_dir():
            raise CompareError(f"--out {out}: no such folder")
        rates = rate_curves(runs)
        entropy = {
            run.path: cross_entropy(run) for curve in rates.values() for rs in curve.values() for run in rs
        }
        markdown = report(runs, args.bootstrap, curves, args.minutes_step, entropy)
        if args.ensemble:
            from comparison.ensembles import ensemble_runs, ensembles_section, score_ensembles

            ensembles = [ensemble_runs(folders) for folders in args.ensemble]
            section = ensembles_section(score_ensembles(ensembles, args.bootstrap, args.device))
            markdown += "\n" + "\n".join(section) + "\n"
        written = [out / "comparison.md"]
        with AtomicFile(written[0]) as stream:
            stream.write(markdown)
        if not args.no_plot:
            plot(groups_of(runs), curves, out / "comparison.png")
            written.append(out / "comparison.png")
            if rates:
                plot_rates(rates, entropy, out / "learning_rates.png")
                written.append(out / "learning_rates.png")
        missing = [run.name for run in runs if curves[run.path] is None]
        if missing:
            print(
                f"warning: no validation curve in the TensorBoard events of {', '.join(missing)}",
                file=sys.stderr,
            )
    except (CompareError, DataError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"error: {error.filename or ''}: {error.strerror or error}", file=sys.stderr)
        return 1
    print(markdown, end="")
    print(f"\nwrote {', '.join(str(p) for p in written)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
