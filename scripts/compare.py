"""Compare finished training runs: ``python scripts/compare.py PATH [PATH ...]``.

PATH is a run folder (it holds ``results.json``) or a folder of runs, such as a Hydra multirun
folder (every finished run below it is taken, in job order). Prints a Markdown report and writes
it to ``comparison.md``, with ``comparison.png`` beside it:

- one row per run: model, parameters, steps, epochs, training time, target tokens/s, validation
  BLEU (greedy, best evaluation), and BLEU and chrF of every test split (beam search, best
  checkpoint), with the sacrebleu signatures once;
- significance: sacrebleu's paired bootstrap resampling of every run against the first one, per
  test split, from the runs' ``<split>.hyp`` and ``<split>.ref`` files (p-values, and each
  system's mean score with a 95% confidence interval over the resampled test sets);
- runs whose configs differ only by ``seed`` form a group: mean and standard deviation over the
  seeds (``python train.py -m model=rnn,transformer seed=1,2,3``);
- ``comparison.png``: validation BLEU against training time and against steps, read from each
  run's TensorBoard event files.

``--out DIR`` chooses where the two files go (default: the folder of runs when one is given, else
the current folder). A PATH that holds no finished run is an error (exit 1).
"""

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

# None of these imports torch: this script stays quick to start.
from common.files import AtomicFile
from common.settings import NOT_SETTINGS, flatten
from data.corpus import read_lines
from data.errors import DataError

RESULTS = "results.json"
REQUIRED = ("model", "params", "steps", "epochs", "train_seconds", "train_tokens_per_second", "valid", "test")
# Keys left out of groups and their labels: the shared NOT_SETTINGS (where data, caches and
# checkpoints lie) and, for comparisons only, the seed (runs that differ only by it form a group),
# the device and hydra.* overrides (where and how a run was launched). Elsewhere these are settings:
# a resume must repeat the seed, which decides the batches.
NOT_A_SETTING = (*NOT_SETTINGS, "seed", "device", "hydra.")


class CompareError(Exception):
    """Runs that cannot be compared; the message is one line for the user."""


@dataclass
class Run:
    path: Path
    name: str  # as shown in the tables
    results: Dict[str, Any]
    config: Optional[Dict[str, Any]] = None  # the run's .hydra/config.yaml, when there is one
    overrides: List[str] = field(default_factory=list)  # its .hydra/overrides.yaml

    @property
    def seed(self) -> Optional[int]:
        return (self.config or {}).get("seed")

    def settings(self) -> List[str]:
        """The overrides that make this configuration (not the seed, paths or the model group)."""
        return [
            o
            for o in self.overrides
            if not _override_key(o).startswith(NOT_A_SETTING) and _override_key(o) != "model"
        ]

    def model_name(self) -> str:
        """The model config (``model=transformer_base``), else the family in results.json."""
        chosen = [o.split("=", 1)[1] for o in self.overrides if _override_key(o) == "model"]
        return chosen[-1] if chosen else self.results["model"]

    def group_key(self) -> str:
        if self.config is None:
            return str(self.path)  # nothing to compare with: a group of its own
        settings = {k: v for k, v in flatten(self.config).items() if not k.startswith(NOT_A_SETTING)}
        return json.dumps(settings, sort_keys=True, default=str)


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


# ----- finding and reading runs -----
def _job_order(path: Path) -> Tuple:
    """Hydra multirun subfolders are ``<job number>_<overrides>``: sort by the number, then by name."""
    head = path.name.split("_", 1)[0]
    return (int(head), path.name) if head.isdigit() else (math.inf, path.name)


def _sorted_runs(folders: Sequence[Path]) -> List[Path]:
    return sorted(folders, key=lambda p: [_job_order(Path(part)) for part in p.parts])


def find_runs(path: Path) -> List[Path]:
    """The finished run folders at or below ``path``, in job order."""
    if not path.exists():
        raise CompareError(f"{path} does not exist")
    if (path / RESULTS).is_file():
        return [path]
    if not path.is_dir():
        raise CompareError(f"{path} is not a run folder or a folder of runs")
    finished = _sorted_runs([p.parent for p in path.rglob(RESULTS)])
    if not finished:
        started = unfinished_runs(path)
        detail = (
            f" ({len(started)} run folder(s) without {RESULTS}: still training, interrupted or failed)"
            if started
            else ""
        )
        raise CompareError(
            f"{path} holds no finished run: no {RESULTS} below it{detail}; "
            "a run writes it when training and testing are done"
        )
    return finished


def unfinished_runs(path: Path) -> List[Path]:
    """Run folders below ``path`` that Hydra started (``.hydra/config.yaml``) and that wrote no results."""
    return [
        p.parent
        for p in path.rglob(".hydra")
        if (p / "config.yaml").is_file() and not (p.parent / RESULTS).is_file()
    ]


def read_run(folder: Path, name: str) -> Run:
    from omegaconf import OmegaConf

    path = folder / RESULTS
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CompareError(f"{path}: not a readable results file ({error})") from None
    missing = [key for key in REQUIRED if key not in results]
    if missing:
        raise CompareError(f"{path}: missing {', '.join(missing)}: not a results.json written by train.py")
    config, overrides = None, []
    hydra_dir = folder / ".hydra"
    if (hydra_dir / "config.yaml").is_file():
        config = OmegaConf.to_container(OmegaConf.load(hydra_dir / "config.yaml"), resolve=False)
    if (hydra_dir / "overrides.yaml").is_file():
        overrides = [str(o) for o in OmegaConf.to_container(OmegaConf.load(hydra_dir / "overrides.yaml"))]
    return Run(folder, name, results, config, overrides)


def collect_runs(paths: Sequence[Path]) -> List[Run]:
    """Every finished run under ``paths``, named relative to its PATH (with the PATH's own name in
    front when two PATHs hold runs of the same name, as two sweeps do)."""
    found, seen = [], set()
    for path in paths:
        for folder in find_runs(path):
            if folder.resolve() not in seen:
                seen.add(folder.resolve())
                found.append((path, folder))
        for folder in unfinished_runs(path) if path.is_dir() else []:
            print(
                f"warning: {folder} has no {RESULTS} (still training, interrupted or failed): left out",
                file=sys.stderr,
            )
    names = [folder.name if folder == path else str(folder.relative_to(path)) for path, folder in found]
    if len(set(names)) < len(names):
        names = [
            str(Path(path.resolve().name) / name)
            if folder != path
            else str(Path(folder.resolve().parent.name) / name)
            for (path, folder), name in zip(found, names)
        ]
    return [read_run(folder, name) for (_, folder), name in zip(found, names)]


# ----- numbers -----
def test_splits(runs: Sequence[Run]) -> List[str]:
    """Every test split of any run, in the order they first appear."""
    splits: List[str] = []
    for run in runs:
        splits += [s for s in run.results["test"] if s not in splits]
    return splits


def paired_bootstrap(
    runs: Sequence[Run], split: str, samples: int
) -> Tuple[Optional[Dict[str, List[Any]]], str]:
    """sacrebleu's paired bootstrap resampling of every run against the first on ``split``.

    Returns ``({"BLEU": [Result per run], "chrF": [...]}, signature text)``, or ``(None, why not)``
    when the runs cannot be paired on this split.
    """
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    systems, references = [], None
    for run in runs:
        hyp, ref = run.path / f"{split}.hyp", run.path / f"{split}.ref"
        if not (hyp.is_file() and ref.is_file()):
            return None, f"{run.name} has no {hyp.name} and {ref.name}"
        hyps, refs = read_lines(hyp), read_lines(ref)
        if len(hyps) != len(refs):
            raise CompareError(
                f"{hyp}: {len(hyps)} lines for {len(refs)} references in {ref}: the run folder is damaged"
            )
        if references is None:
            references = refs
        elif refs != references:
            other = f"other references than {runs[0].name} (another data set or direction)"
            return None, f"{run.name} was scored against {other}"
        systems.append((run.name, hyps))
    if len(systems) < 2:
        return None, "one run: nothing to compare"
    test = PairedTest(
        systems, {"BLEU": BLEU(), "chrF": CHRF()}, [references], test_type="bs", n_samples=samples
    )
    signatures, scores = test()
    text = "; ".join(f"{name} `{sig}`" for name, sig in signatures.items())
    scores = {name: scores[key] for name, key in (("BLEU", "BLEU"), ("chrF", _metric_key(scores, "chrF")))}
    for metric in scores.values():
        for result in metric[1:]:
            if result.score == metric[0].score:
                # No observed difference is no evidence of one: p = 1. (sacrebleu counts resampled
                # differences strictly above the observed one, so an output identical to the
                # baseline's, every resample differing by 0, would get its smallest p-value.)
                result.p_value = 1.0
    return scores, text


def _metric_key(scores: Dict[str, Any], prefix: str) -> str:
    return next(key for key in scores if key.startswith(prefix))  # sacrebleu names chrF "chrF2"


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def group_labels(groups: Sequence[List[Run]]) -> List[str]:
    """A name per group: its model and the settings that not every run shares."""
    common = set.intersection(*(set(run.settings()) for group in groups for run in group))
    return [" ".join([g[0].model_name(), *(o for o in g[0].settings() if o not in common)]) for g in groups]


def groups_of(runs: Sequence[Run]) -> List[List[Run]]:
    """Runs whose configs differ only by ``seed``, in the order of their first run."""
    groups: Dict[str, List[Run]] = {}
    for run in runs:
        groups.setdefault(run.group_key(), []).append(run)
    return list(groups.values())


# ----- the report -----
def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def _score(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


def runs_table(runs: Sequence[Run], splits: Sequence[str]) -> List[str]:
    head = ["run", "model", "seed", "params", "steps", "epochs", "train time", "tgt tok/s", "valid BLEU"]
    for split in splits:
        head += [f"{split} BLEU", f"{split} chrF"]
    lines = [
        "| " + " | ".join(head) + " |",
        "| " + " | ".join(["---"] * 3 + ["---:"] * (len(head) - 3)) + " |",
    ]
    for run in runs:
        r = run.results
        cells = [
            f"`{run.name}`",
            r["model"],
            str(run.seed if run.seed is not None else "-"),
            f"{r['params']:,}",
            f"{r['steps']:,}",
            f"{r['epochs']:g}",
            _minutes(r["train_seconds"]),
            f"{r['train_tokens_per_second']:,.0f}",
            _score(r["valid"].get("bleu")),
        ]
        for split in splits:
            scores = r["test"].get(split, {})
            cells += [_score(scores.get("bleu")), _score(scores.get("chrf"))]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def significance_table(runs: Sequence[Run], split: str, scores: Dict[str, List[Any]]) -> List[str]:
    lines = [
        "| run | BLEU | mean ± 95% CI | p | chrF | mean ± 95% CI | p |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for i, run in enumerate(runs):
        cells = [f"`{run.name}`"]
        for metric in ("BLEU", "chrF"):
            result = scores[metric][i]
            p = "(baseline)" if i == 0 else f"{result.p_value:.4f}"
            cells += [f"{result.score:.2f}", f"{result.mean:.2f} ± {result.ci:.2f}", p]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def seeds_table(groups: Sequence[List[Run]], splits: Sequence[str]) -> List[str]:
    head = (
        ["configuration", "seeds", "valid BLEU"]
        + [f"{s} {m}" for s in splits for m in ("BLEU", "chrF")]
        + ["train time", "tgt tok/s"]
    )
    lines = [
        "| " + " | ".join(head) + " |",
        "| --- | ---: | " + " | ".join(["---:"] * (len(head) - 2)) + " |",
    ]
    for group, label in zip(groups, group_labels(groups)):

        def cell(values: List[Optional[float]], fmt: str = "{:.2f}") -> str:
            values = [v for v in values if v is not None]
            if not values:
                return "-"
            mean, std = mean_std(values)
            return f"{fmt.format(mean)} ± {fmt.format(std)}"

        cells = [label, str(len(group)), cell([r.results["valid"].get("bleu") for r in group])]
        for split in splits:
            for metric in ("bleu", "chrf"):
                cells.append(cell([r.results["test"].get(split, {}).get(metric) for r in group]))
        cells.append(cell([r.results["train_seconds"] / 60 for r in group], "{:.1f}") + " min")
        cells.append(cell([r.results["train_tokens_per_second"] for r in group], "{:,.0f}"))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def report(runs: Sequence[Run], samples: int) -> str:
    """The Markdown report."""
    splits = test_splits(runs)
    lines = ["## Runs", ""] + runs_table(runs, splits) + [""]
    lines.append(
        "Valid BLEU: greedy search, best evaluation. Test scores: beam search with the best checkpoint."
    )
    sacre = {
        json.dumps(r.results.get("sacrebleu"), sort_keys=True) for r in runs if r.results.get("sacrebleu")
    }
    for text in sorted(sacre):
        sig = json.loads(text)
        lines.append(f"sacrebleu signatures: BLEU `{sig.get('bleu')}`, chrF `{sig.get('chrf')}`")
    if len(sacre) > 1:
        lines.append(
            "**The runs were scored with different sacrebleu settings: their scores are not comparable.**"
        )
    for split in splits:
        lines += ["", f"## Significance on {split}", ""]
        scores, detail = paired_bootstrap(runs, split, samples)
        if scores is None:
            lines.append(f"No paired test: {detail}.")
            continue
        lines.append(
            f"Paired bootstrap resampling ({samples} resamples of the test set) of each run against "
            f"`{runs[0].name}`: p is the probability of a difference at least this large if the two "
            "systems were equally good. Mean and 95% confidence interval over the resamples."
        )
        lines += [""] + significance_table(runs, split, scores) + ["", f"sacrebleu: {detail}"]
    groups = groups_of(runs)
    lines += ["", "## Seeds", ""]
    if all(len(g) == 1 for g in groups):
        lines.append(
            "One seed per configuration. On Multi30k a difference of a point of BLEU or less between "
            "single runs can be seed noise: sweep `seed=1,2,3` to measure the spread."
        )
    else:
        lines.append("Runs whose configs differ only by `seed`: mean ± standard deviation over the seeds.")
        lines += [""] + seeds_table(groups, splits)
    return "\n".join(lines) + "\n"


# ----- the figure -----
def bleu_curve(run: Run) -> Optional[Tuple[List[int], List[float], List[float]]]:
    """``(steps, minutes, valid BLEU)`` of every evaluation, from the run's TensorBoard events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = run.path / "tb"
    if not tb.is_dir():
        return None
    events = EventAccumulator(str(tb), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags().get("scalars", []))
    if "valid/bleu" not in tags:
        return None
    bleu = {
        e.step: e.value for e in events.Scalars("valid/bleu")
    }  # a resumed run logs a step again: keep the last
    if "valid/train_seconds" in tags:
        seconds = {e.step: e.value for e in events.Scalars("valid/train_seconds")}
    else:  # older runs: wall-clock time since the first event
        first = min(e.wall_time for tag in tags for e in events.Scalars(tag))
        seconds = {e.step: e.wall_time - first for e in events.Scalars("valid/bleu")}
    steps = sorted(s for s in bleu if s in seconds)
    return steps, [seconds[s] / 60 for s in steps], [bleu[s] for s in steps]


def plot(runs: Sequence[Run], path: Path) -> List[str]:
    """Write ``comparison.png``; returns the names of runs without curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_time, by_step) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=100)
    missing = []
    for run in runs:
        curve = bleu_curve(run)
        if curve is None:
            missing.append(run.name)
            continue
        steps, minutes, bleu = curve
        by_time.plot(minutes, bleu, marker="o", markersize=3, label=run.name)
        by_step.plot(steps, bleu, marker="o", markersize=3, label=run.name)
    by_time.set_xlabel("training time (minutes, evaluations included)")
    by_step.set_xlabel("steps")
    for ax in (by_time, by_step):
        ax.set_ylabel("validation BLEU (greedy)")
        ax.grid(alpha=0.3)
    by_step.legend(fontsize=8, loc="lower right")
    fig.suptitle("Validation BLEU", fontsize=11)
    fig.tight_layout()
    with AtomicFile(path, "wb") as out:
        fig.savefig(out, format="png")
    plt.close(fig)
    return missing


# ----- the command -----
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "paths", nargs="+", type=Path, metavar="PATH", help="a run folder or a folder of runs"
    )
    parser.add_argument("--out", type=Path, help="folder for comparison.md and comparison.png")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (default 1000)")
    parser.add_argument("--no-plot", action="store_true", help="do not write comparison.png")
    args = parser.parse_args(argv)
    if args.bootstrap < 1:
        parser.error("--bootstrap must be at least 1")
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
        runs = collect_runs(args.paths)
        markdown = report(runs, args.bootstrap)
        out = out_folder(args)
        if not out.is_dir():
            raise CompareError(f"--out {out}: no such folder")
        written = [out / "comparison.md"]
        with AtomicFile(written[0]) as stream:
            stream.write(markdown)
        if not args.no_plot:
            missing = plot(runs, out / "comparison.png")
            written.append(out / "comparison.png")
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
