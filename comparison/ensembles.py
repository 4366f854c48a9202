"""Ensembles of finished runs, scored on the runs' test splits next to their members.

Every system is decoded here the same way, by ``translate.py``'s path
(``inference.translator.Translator``: one checkpoint, or several as an ensemble): the weights each
run was tested with (``results.json``'s ``test_weights``: ``best.pt``, ``ema.pt`` or ``average.pt``), the run's
beam size, the length penalty of the run (an ensemble: the mean of its members'), the test sources
read through the run's own data config and scored against its ``<split>.ref``. So a member's
score here may differ from its Runs row by the batches' rounding (the run decoded in batches of
tokens), and its decoding time is measured beside the ensemble's, in one process.
"""

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from comparison.formats import format_p
from comparison.runs import RESULTS, CompareError, Run, read_run
from comparison.significance import bootstrap_systems
from data.corpus import read_lines
from data.errors import DataError


@dataclass
class Decoded:
    """One system's translation of a test split: a run's model or an ensemble of runs."""

    label: str
    hyps: List[str]
    scores: Dict[str, float]  # bleu, chrf
    seconds: float  # decoding only (the models loaded before the clock starts)


def test_checkpoint(run: Run) -> Path:
    """The weights a run's test splits were decoded with (``results.json``'s ``test_weights``)."""
    used = (run.results.get("test_weights") or {}).get("used")
    if used is None:
        raise CompareError(
            f"{run.name} stopped before its first evaluation: it has no test weights to ensemble"
        )
    path = run.path / "checkpoints" / used
    if not path.is_file():
        raise CompareError(f"{path} does not exist: the weights {run.name} was tested with are gone")
    return path


def system_label(runs: Sequence[Run]) -> str:
    """``rnn seed 1``, or ``rnn seed 1 + transformer seed 1`` for an ensemble."""
    return " + ".join(f"{run.model_name()} seed {run.seed}" for run in runs)


def split_text(run: Run, split: str) -> Tuple[List[str], List[str]]:
    """The sources and references of ``split``, read as the run read them (its data config: a
    relative ``data.root`` is taken from the current folder, as train.py took it); the references
    must be the ones the run scored against (its ``<split>.ref``)."""
    from data.config import data_config
    from data.sources import corpus_splits

    if run.config is None:
        raise CompareError(f"{run.path} has no .hydra/config.yaml: its test data cannot be found")
    try:
        pairs = list(corpus_splits(data_config(run.config["data"]))[split].pairs())
    except (DataError, KeyError, ValueError) as error:  # ValueError: a config the schema refuses
        raise CompareError(f"{run.name}: cannot read its {split} split ({error})") from None
    sources, references = [src for src, _ in pairs], [tgt for _, tgt in pairs]
    ref_file = run.path / f"{split}.ref"
    if ref_file.is_file() and read_lines(ref_file) != references:
        raise CompareError(f"{ref_file} differs from the {split} references its data config reads now")
    return sources, references


def decode(runs: Sequence[Run], sources: List[str], references: List[str], device: str) -> Decoded:
    """``sources`` translated by one run's test weights or by the ensemble of several, with the
    beam of the first run; its BLEU and chrF against ``references``, and the seconds it took (after
    a warm-up batch)."""
    from common.checkpoint import CheckpointError
    from inference.translator import Translator
    from training.validation import corpus_scores

    try:
        translator = Translator.from_checkpoints([test_checkpoint(run) for run in runs], device)
    except CheckpointError as error:
        raise CompareError(str(error)) from None
    beam = int(runs[0].config["trainer"]["beam_size"])  # split_text read the config already
    translator.translate(sources[:8], beam=beam)  # warm-up: the first batch's one-off costs are no system's
    tick = time.perf_counter()
    hyps = [result.text for result in translator.translate(sources, beam=beam)]
    seconds = time.perf_counter() - tick
    return Decoded(system_label(runs), hyps, corpus_scores(hyps, references), seconds)


def best_member(members: Sequence[Decoded]) -> Decoded:
    """The member with the highest BLEU: the one an ensemble's gain is measured against."""
    return max(members, key=lambda m: m.scores["bleu"])


def ensemble_runs(folders: Sequence[Path]) -> List[Run]:
    """The finished runs of one ``--ensemble`` (at least two run folders)."""
    if len(folders) < 2:
        raise CompareError(f"--ensemble {' '.join(map(str, folders))}: an ensemble needs at least 2 runs")
    for folder in folders:
        if not (folder / RESULTS).is_file():
            raise CompareError(f"--ensemble {folder}: not a finished run folder (no {RESULTS})")
    return [read_run(folder, folder.name) for folder in folders]


def common_splits(runs: Sequence[Run]) -> List[str]:
    """The test splits every run of ``runs`` was scored on, in the first run's order."""
    return [s for s in runs[0].results["test"] if all(s in run.results["test"] for run in runs)]


Scored = Dict[str, List[Tuple[List[Decoded], Decoded, float]]]  # split -> (members, ensemble, p)


def score_ensembles(ensembles: Sequence[Sequence[Run]], samples: int, device: str = "auto") -> Scored:
    """Per test split, for each ensemble: its members decoded one by one, then the ensemble, and
    the p-value of sacrebleu's paired bootstrap (``samples`` resamples) of the ensemble's BLEU
    against its best member's. A run in several ensembles is decoded once per split."""
    scored: Scored = {}
    alone: Dict[Tuple[Path, str], Decoded] = {}
    for runs in ensembles:
        splits = common_splits(runs)
        if not splits:
            raise CompareError(f"{system_label(runs)}: its runs share no test split")
        for split in splits:
            sources, references = split_text(runs[0], split)
            for run in runs[1:]:
                if split_text(run, split)[1] != references:
                    raise CompareError(
                        f"{run.name} and {runs[0].name} scored {split} against other references"
                    )
            members = []
            for run in runs:
                key = (run.path.resolve(), split)
                if key not in alone:
                    alone[key] = decode([run], sources, references, device)
                members.append(alone[key])
            together = decode(runs, sources, references, device)
            best = best_member(members)
            results, _ = bootstrap_systems(
                [(best.label, best.hyps), (together.label, together.hyps)], references, samples
            )
            scored.setdefault(split, []).append((members, together, results["BLEU"][1].p_value))
    return scored


def ensembles_section(scored: Scored) -> List[str]:
    """The Markdown of ``score_ensembles``: per split, each ensemble below its members, with its gain
    over the best member (and the bootstrap's p of it) and its decoding time against the slowest
    member's."""
    lines = [
        "## Ensembles",
        "",
        "Each system decoded here by translate.py's path (the runs' test weights and beam; an "
        "ensemble: the mean of its members' log-probabilities at every step, the mean of their length "
        "penalties), one after the other in this process: a member's score can differ from its Runs "
        "row by the batching. p: sacrebleu's paired bootstrap of the ensemble's BLEU against its best "
        "member's.",
    ]
    for split, rows in scored.items():
        lines += [
            "",
            f"### {split}",
            "",
            "| system | BLEU | chrF | decoding | BLEU over the best member | p | time over the slowest member |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for members, ensemble, p in rows:
            for member in members:
                bleu, chrf = member.scores["bleu"], member.scores["chrf"]
                lines.append(f"| {member.label} | {bleu:.2f} | {chrf:.2f} | {member.seconds:.1f} s | | | |")
            best = best_member(members).scores["bleu"]
            slowest = max(m.seconds for m in members)
            lines.append(
                f"| **{ensemble.label}** | **{ensemble.scores['bleu']:.2f}** | {ensemble.scores['chrf']:.2f} "
                f"| {ensemble.seconds:.1f} s | {ensemble.scores['bleu'] - best:+.2f} | {format_p(p)} "
                f"| {ensemble.seconds / slowest:.2f}x |"
            )
    return lines
