"""Every command the documentation gives, run, so that README.md and the pages of docs/ cannot
drift from the code.

The commands are read from each document itself (README.md and every ``docs/*.md``, each checked
on its own, the tests named by the document): its ```bash blocks and its inline code spans that
start with ``python``, ``make``, ``torchrun`` or a script of the project, and the make targets the
Makefile's header lists. Then:

- the README leads with ``make train`` and ``make test``, and the documents together give a
  command for every script;
- every file a document names (``scripts/X.py``, ``training/step.py``, ``trainer.py``) exists, and
  every link of a document leads to a file that exists and, with ``#anchor``, to one of its headings;
- every ``--option`` a command gives a script of the project is in that script's ``--help``, and
  so is every option of a table of options (translate.py's), which belong to the script the
  section ran last; an option in a span of its own must be some script's, or a named other tool's;
- every set of ``train.py`` overrides composes and is accepted by the config readers (``-m``
  sweeps value by value), in this process; ``train.py --help`` and ``--cfg job`` run for real;
- the scripts that are quick run for real on small inputs: data_stats.py on the Multi30k slice,
  compare.py on run folders in train.py's format, tb_images.py on real image events,
  bench_attention.py on a one-case grid; benchmark.py and translate.py (which need trained
  checkpoints) answer ``--help``;
- ``make -n TARGET`` works for every target, and the scripts its recipe runs exist and take the
  options it gives them.
"""

import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from helpers import ROOT, SPLIT, compose, drop_words, write_run

# The documents, (name, text): the README first, then the pages of docs/.
DOCUMENTS: List[Tuple[str, str]] = [
    (path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8"))
    for path in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
]
NAMES = [name for name, _ in DOCUMENTS]
DOCS = dict(DOCUMENTS)
README = DOCS["README.md"]
MAKEFILE = (ROOT / "Makefile").read_text(encoding="utf-8")
ENTRY_POINTS = ("train.py", "translate.py")
SUBCOMMANDS = {"scripts/benchmark.py": ("train", "translate"), "scripts/gpu_check.py": ("prepare", "run")}
# Options the documents give to other tools, in spans of their own: not the project's to check.
OTHER_TOOLS = {
    "--samples_per_plugin": "tensorboard",
    "--print-alignment": "fairseq",
    "--rdrop-alpha": "fairseq",
    "--activation-dropout": "fairseq",
    "--dist": "pytest-xdist",
}
# Placeholders the documents write for a number in an override (``trainer.lr=LR``), and a number.
NUMBERS = {"LR": "1e-3"}
OPTION = re.compile(r"^\[?(--?[A-Za-z][\w-]*)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")
# A document in order: headings, fenced blocks, rows of option tables and inline code spans.
PIECES = re.compile(r"^## (.+?)$|^```(\w*)\n(.*?)^```|^\| `(--[^\n]*)$|`([^`]+)`", re.S | re.M)

Script = Tuple[str, Optional[str]]  # (script path from the root, subcommand)


# ----- reading the documents -----
def bash_lines(text: str) -> List[str]:
    """The commands of the ```bash blocks of ``text``: continuation lines joined, comments dropped."""
    lines = []
    for lang, body in FENCE.findall(text):
        if lang == "bash":
            joined = body.replace("\\\n", " ")
            words = [shlex.split(line, comments=True) for line in joined.splitlines()]
            lines += [shlex.join(command) for command in words if command]
    return lines


def spans(text: str) -> List[str]:
    """The inline code spans of ``text`` outside fenced blocks (a span may wrap onto the next line)."""
    prose = FENCE.sub("", text)
    return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]


def is_command(words: List[str]) -> bool:
    first = words[0] if words else ""
    return first in ("python", "make", "torchrun", "nohup") or first.endswith(".py")


def commands(text: str) -> List[List[str]]:
    """Every documented command line of ``text`` as words (shell redirections and ``&`` cut off)."""
    found = []
    for line in bash_lines(text) + spans(text):
        try:
            words = shlex.split(line)
        except ValueError:  # prose with an odd quote: not a command
            continue
        if is_command(words):
            cut = next((i for i, w in enumerate(words) if w in ("<", ">", "|", "&", "&&")), len(words))
            found.append(words[:cut])
    return found


def script_call(words: List[str]) -> Optional[Tuple[Script, List[str]]]:
    """``((script, subcommand), arguments)`` of a command that runs a script of the project."""
    for i, word in enumerate(words):
        if word in ENTRY_POINTS or re.fullmatch(r"scripts/\w+\.py", word):
            args = [w for w in words[i + 1 :] if w != "..."]
            sub = args[0] if args and args[0] in SUBCOMMANDS.get(word, ()) else None
            return (word, sub), args[1:] if sub else args
    return None


def options(args: List[str]) -> List[str]:
    return [m.group(1) for m in map(OPTION.match, args) if m]


def documented_options(text: str) -> Dict[Script, Dict[str, str]]:
    """``{(script, subcommand): {option: where the document gives it}}``: the options of its
    commands, and those of a table of options (``| `--beam N` | ...``), which are the script's that
    the section (``## ...``) ran last before the table."""
    found: Dict[Script, Dict[str, str]] = {}
    last: Optional[Script] = None
    for match in PIECES.finditer(text):
        heading, lang, body, row, span = match.groups()
        if heading is not None:
            last = None
            continue
        if row is not None:
            if last is not None:
                for option in re.findall(r"`(--[\w-]+)", "`" + row.split(" | ")[0]):
                    found.setdefault(last, {}).setdefault(option, f"table row {option}")
            continue
        text = f"```{lang}\n{body}```\n" if body is not None else f"`{span}`"
        for script, args in filter(None, map(script_call, commands(text))):
            last = script
            for option in options(args):
                found.setdefault(script, {}).setdefault(option, shlex.join([script[0], *args]))
    return found


def all_documented_options() -> Dict[Script, Dict[str, str]]:
    """``documented_options`` of every document together (where: the document's name first)."""
    found: Dict[Script, Dict[str, str]] = {}
    for name, text in DOCUMENTS:
        for script, given in documented_options(text).items():
            for option, where in given.items():
                found.setdefault(script, {}).setdefault(option, f"{name}: {where}")
    return found


def free_options(text: str) -> List[str]:
    """Options in spans of their own (``--out DIR``), outside tables."""
    prose = "\n".join(line for line in FENCE.sub("", text).splitlines() if not line.startswith("|"))
    return sorted({o for span in spans(prose) if span.startswith("--") for o in options(span.split())})


def override(word: str) -> str:
    """An override as it composes: a number's placeholder (``trainer.lr=LR``) made a number."""
    key, _, value = word.partition("=")
    return f"{key}={NUMBERS[value]}" if value in NUMBERS else word


def train_overrides() -> List[Tuple[str, str, List[str]]]:
    """``(document, command, overrides)`` of every documented ``train.py`` run, ``make train ARGS=``
    too; optional words (``[OVERRIDE]``, ``[...]``) left out."""
    found = []
    for name, text in DOCUMENTS:
        for words in commands(text):
            call = script_call(words)
            if call and call[0][0] == "train.py":
                args = [override(a) for a in call[1] if not a.startswith(("-", "["))]
                found.append((name, shlex.join(words), args))
            elif words[:2] == ["make", "train"]:
                args = [w.split("=", 1)[1] for w in words[2:] if w.startswith("ARGS=")]
                found.append((name, shlex.join(words), args[0].split() if args else []))
    # one test per document and set of overrides, named by the document and its first command
    unique: Dict[Tuple[str, Tuple[str, ...]], str] = {}
    for name, command, overrides in found:
        unique.setdefault((name, tuple(overrides)), command)
    return [(name, command, list(overrides)) for (name, overrides), command in unique.items()]


def make_targets() -> List[List[str]]:
    """The make commands of the Makefile's header and of the documents (``make`` left out)."""
    header = [line[1:].strip() for line in MAKEFILE.splitlines() if re.match(r"#\s+make ", line)]
    lines = [shlex.split(line.split("  ")[0])[1:] for line in header]
    lines += [words[1:] for _, text in DOCUMENTS for words in commands(text) if words[0] == "make"]
    lines = [[w for w in line if not w.startswith("[")] for line in lines]  # [VAR=...]: optional
    unique = []
    for line in lines:
        if line and line not in unique:
            unique.append(line)
    return unique


def anchors(text: str) -> set:
    """The anchors GitHub gives the headings of ``text`` (``## CPUs and GPUs``: ``cpus-and-gpus``;
    a repeated heading's second ``-1``)."""
    found, seen = set(), {}  # seen: how many headings gave each slug so far
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return found


def links(text: str) -> List[str]:
    """The targets of the links and images of ``text`` outside fenced blocks, but the web's."""
    return [t for t in LINK.findall(FENCE.sub("", text)) if not re.match(r"[a-z]+:", t)]


def run_command(argv: List[str], cwd: Path = ROOT, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)


# ----- the runs: all started at once (four at a time), each test reads its own -----
REAL_RUNS = tuple(f"scripts/{name}.py" for name in ("data_stats", "compare", "tb_images", "bench_attention"))
BENCH_ATTENTION = (
    "--lengths 16 --dims 32 --heads 2 --batch 2 --repeats 1 --warmup 1 --devices cpu --threads 1"
)


def help_jobs() -> Dict[Script, List[str]]:
    """``--help`` of each script the documents give options to, and of each script they name that
    is not run for real here (train.py's Hydra help is a real run of its own)."""
    given = set(all_documented_options())
    scripts = given | {(path, sub) for path, subs in SUBCOMMANDS.items() for sub in subs}
    for _, text in DOCUMENTS:
        scripts |= {(path, None) for path in re.findall(r"\b(?:scripts/\w+|translate)\.py\b", text)}
    scripts -= {(path, None) for path in (*REAL_RUNS, "train.py")} - given
    scripts.discard(("train.py", None))
    return {
        script: [script[0], *([script[1]] if script[1] else []), "--help"]
        for script in sorted(scripts, key=str)
    }


@pytest.fixture(scope="module")
def ran(multi30k_slice, tmp_path_factory) -> Dict[object, Tuple[subprocess.CompletedProcess, Path]]:
    """The quick documented commands run for real, and the ``--help`` of the others:
    ``{name or script: (result, scratch folder)}``."""
    from data.corpus import read_lines

    scratch = tmp_path_factory.mktemp("readme")
    refs = read_lines(multi30k_slice / f"{SPLIT}.en")
    runs = scratch / "multirun" / "compare_multi30k" / "DATE"
    write_run(runs / "0_model=rnn", drop_words(refs, 2), refs, ["model=rnn"])
    write_run(runs / "1_model=transformer", drop_words(refs, 5), refs, ["model=transformer"])
    tb = write_images(scratch / "RUN" / "tb")
    data = [f"data.cache_dir={scratch / 'cache'}", "data.vocab_size=500"]
    step2 = scratch / "step2.png"
    jobs: Dict[object, List[str]] = {  # the slow starters (torch) first
        "train_help": ["train.py", "--help"],
        "train_cfg": [str(ROOT / "train.py"), "--cfg", "job", "model=rnn"],
        # as docs/data.md writes it: data.root=DIR [--batch-tokens N] [overrides]
        "data_stats": [
            "scripts/data_stats.py",
            f"data.root={multi30k_slice}",
            "--batch-tokens",
            "2000",
            *data,
        ],
        "bench_attention": ["scripts/bench_attention.py", *BENCH_ATTENTION.split()],
        **help_jobs(),
        "compare": ["scripts/compare.py", str(runs), "--bootstrap", "100"],
        "tb_list": ["scripts/tb_images.py", str(tb), "--list"],
        "tb_last": ["scripts/tb_images.py", str(tb), "--tag", TAG, "--out", str(scratch / "last.png")],
        "tb_step": ["scripts/tb_images.py", str(tb), "--tag", TAG, "--step", "2", "--out", str(step2)],
    }
    cwd = {"train_cfg": scratch}  # nothing may appear there: --cfg composes and prints, it trains nothing

    def start(name):
        return run_command([sys.executable, *jobs[name]], cwd=cwd.get(name, ROOT))

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = dict(zip(jobs, pool.map(start, jobs)))
    return {name: (result, scratch) for name, result in results.items()}


@pytest.fixture(scope="module")
def helps(ran) -> Dict[Script, str]:
    texts = {}
    for script in help_jobs():
        done, _ = ran[script]
        assert done.returncode == 0 and done.stdout.startswith("usage:"), (script, done.stderr[-2000:])
        texts[script] = done.stdout
    return texts


@pytest.fixture(scope="module")
def real_runs(ran):
    return {name: result for name, result in ran.items() if isinstance(name, str)}


def known_options(helps, real_runs) -> set:
    """The options of every ``--help``, and those the real runs used with success."""
    known = set(re.findall(r"--[A-Za-z][\w-]*", "\n".join(helps.values())))
    return known | {
        o for done, _ in real_runs.values() if done.returncode == 0 for o in options(done.args[2:])
    }


TAG = "attention/sent0/cross"


def write_images(tb_dir: Path) -> Path:
    """A TensorBoard image tag at steps 2 and 4, as the attention images of a run."""
    import torch
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(tb_dir))
    for step, shade in ((2, 0.2), (4, 0.9)):
        writer.add_image(TAG, torch.full((3, 8, 12), shade), step)
    writer.close()
    return tb_dir


# ----- the documents' names -----
def test_the_readme_leads_with_make_train_and_make_test():
    first = re.search(r"^## (.+)$", README, re.M).group(1)
    assert first == "Quick start" and [shlex.split(line) for line in bash_lines(README)[:2]] == [
        ["make", "train"],
        ["make", "test"],
    ]


def test_the_documents_give_a_command_for_every_script():
    calls = [call for _, text in DOCUMENTS for call in map(script_call, commands(text)) if call]
    run = {script for (script, _), _ in calls}
    documented = {"train.py", "translate.py", *(f"scripts/{p.name}" for p in (ROOT / "scripts").glob("*.py"))}
    assert documented <= run, f"scripts without a documented command: {sorted(documented - run)}"


@pytest.mark.parametrize("name", NAMES)
def test_every_file_the_document_names_exists(name):
    folders = [ROOT, *(p for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith("."))]
    missing = []
    for file in sorted(set(re.findall(r"(?<![\w./-])([\w./-]*\w\.py)\b", DOCS[name]))):
        if file.startswith("/"):  # a path of another machine, in a copied log (docs/gpu_runs.md)
            continue
        exists = (ROOT / file).is_file() if "/" in file else any((f / file).is_file() for f in folders)
        if not exists:
            missing.append(file)
    assert missing == []


@pytest.mark.parametrize("name", NAMES)
def test_every_link_of_the_document_leads_to_a_file_and_a_heading_that_exist(name):
    here = (ROOT / name).parent
    wrong = []
    for target in links(DOCS[name]):
        path, _, anchor = target.partition("#")
        file = (here / path).resolve() if path else ROOT / name
        if not file.is_file():
            wrong.append(f"{target}: no file")
        elif anchor and anchor not in anchors(file.read_text(encoding="utf-8")):
            wrong.append(f"{target}: no heading #{anchor}")
    assert wrong == []


@pytest.mark.parametrize("name", NAMES)
def test_every_option_given_to_a_script_is_in_its_help(name, helps):
    wrong = []
    for script, found in documented_options(DOCS[name]).items():
        if script[0] == "train.py":  # Hydra's flags (-m): its overrides are composed below
            continue
        words = set(re.findall(r"--?[A-Za-z][\w-]*", helps[script]))
        wrong += [f"{script}: {option} ({where})" for option, where in found.items() if option not in words]
    assert wrong == []


@pytest.mark.parametrize("name", NAMES)
def test_an_option_in_a_span_of_its_own_is_some_scripts(name, helps, real_runs):
    known = known_options(helps, real_runs)
    assert [o for o in free_options(DOCS[name]) if o not in known and o not in OTHER_TOOLS] == []


def test_the_option_checks_find_what_they_check():
    """The parsing sees the documents' commands, each in the page that documents it (a parser that
    finds nothing would pass everything)."""
    assert {"--checkpoint", "--beam", "--nbest", "--alignments", "--input", "--output"} <= set(
        documented_options(README)[("translate.py", None)]
    )
    assert {"--checkpoint", "--beam", "--nbest", "--alignments", "--batch-size", "--max-len-ratio"} <= set(
        documented_options(DOCS["docs/translation.md"])[("translate.py", None)]
    )
    assert {"--checkpoint", "--data"} <= set(
        documented_options(DOCS["docs/benchmarks.md"])[("scripts/benchmark.py", "translate")]
    )
    assert "--batch-tokens" in documented_options(DOCS["docs/data.md"])[("scripts/data_stats.py", None)]
    assert "--list" in documented_options(DOCS["docs/comparing.md"])[("scripts/tb_images.py", None)]
    assert {"--out", "--bootstrap", "--tag", "--step"} <= set(free_options(DOCS["docs/comparing.md"]))
    assert "--lengths" in free_options(DOCS["docs/attention.md"])
    assert len(train_overrides()) >= 10 and len(make_targets()) >= 8


# ----- train.py -----
def expand_sweeps(overrides: List[str]) -> List[List[str]]:
    """One override list per value of each ``key=a,b`` sweep (the others at their first value)."""
    sweeps = [
        i
        for i, o in enumerate(overrides)
        if "=" in o and "," in o.split("=", 1)[1] and not o.split("=", 1)[1].startswith(("[", "{", "'", '"'))
    ]
    first = [
        o.split("=", 1)[0] + "=" + o.split("=", 1)[1].split(",")[0] if i in sweeps else o
        for i, o in enumerate(overrides)
    ]
    runs = [first]
    for i in sweeps:
        key, values = overrides[i].split("=", 1)
        runs += [first[:i] + [f"{key}={value}"] + first[i + 1 :] for value in values.split(",")[1:]]
    return runs


@pytest.mark.parametrize(
    "name, command, overrides", train_overrides(), ids=[f"{n}:{c}" for n, c, _ in train_overrides()]
)
def test_every_documented_train_command_composes_a_config_train_accepts(name, command, overrides):
    from data.config import data_config
    from training.config import model_config, trainer_config

    if any(o.startswith("hydra/launcher=slurm") for o in overrides):
        pytest.importorskip(
            "hydra_plugins.hydra_submitit_launcher", reason="hydra-submitit-launcher (optional)"
        )
    for run in expand_sweeps(overrides):
        cfg = compose(run, hydra_config=True)
        trainer_config(cfg.trainer)  # the readers train.py's prepare() uses: keys forced in with +, ranges
        data_config(cfg.data)
        model_config(cfg.model)


def test_train_answers_hydra_help_and_prints_the_composed_config_without_training(real_runs):
    from omegaconf import OmegaConf

    done, _ = real_runs["train_help"]
    assert done.returncode == 0, done.stderr[-2000:]
    assert "train is powered by Hydra." in done.stdout
    groups = dict(
        line.split(": ", 1) for line in done.stdout.splitlines() if re.match(r"(data|model|trainer): ", line)
    )
    assert {"rnn", "transformer", "transformer_base"} <= set(groups["model"].split(", "))
    done, scratch = real_runs["train_cfg"]
    assert done.returncode == 0, done.stderr[-2000:]
    cfg = OmegaConf.create(done.stdout)
    assert cfg.model.name == "rnn" and cfg.trainer.schedule == "cosine" and "hydra" not in cfg
    assert not (scratch / "outputs").exists()


# ----- the scripts, for real -----
def test_data_stats_prints_the_stats_block_of_the_slice(real_runs, multi30k_slice):
    done, _ = real_runs["data_stats"]
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == f"data: {multi30k_slice} (de-en)"
    assert re.match(r"\s+train\s+\d{3} pairs\s+src mean/max", lines[1]) and re.match(
        r"\s+val\s+40 pairs", lines[2]
    )
    assert re.match(rf"\s+{SPLIT}\s+30 pairs", lines[3])
    assert "  vocabulary: 500 (joint)" in lines
    assert any(re.match(r"  train batches: \d+ per epoch, .*\(batch_tokens=2000\)$", line) for line in lines)
    assert lines[-2].startswith("  time: ") and "sampler epoch" in lines[-2] and "ready" in lines[-2]
    assert lines[-1].startswith("  peak memory: ") and "private memory added by the data" in lines[-1]


def test_compare_reports_on_a_folder_of_runs(real_runs):
    done, scratch = real_runs["compare"]
    assert done.returncode == 0, done.stderr[-2000:]
    folder = scratch / "multirun" / "compare_multi30k" / "DATE"
    assert done.stdout == (folder / "comparison.md").read_text(encoding="utf-8")
    assert "`0_model=rnn`" in done.stdout and f"## Significance on {SPLIT}" in done.stdout
    assert (folder / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tb_images_lists_and_exports_the_images_of_a_run(real_runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    done, scratch = real_runs["tb_list"]
    assert (done.returncode, done.stdout) == (0, f"{TAG} 2 4\n"), done.stderr
    events = EventAccumulator(str(scratch / "RUN" / "tb"), size_guidance={"images": 0})
    events.Reload()
    images = {image.step: image.encoded_image_string for image in events.Images(TAG)}
    for name, png, step in (("tb_last", "last.png", 4), ("tb_step", "step2.png", 2)):
        done, _ = real_runs[name]
        assert done.returncode == 0, done.stderr
        assert (scratch / png).read_bytes() == images[step] and images[step][:4] == b"\x89PNG"
    assert images[2] != images[4]


def test_bench_attention_times_a_small_grid(real_runs):
    done, _ = real_runs["bench_attention"]
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| cpu | 32 | 16 |")]
    functions = [row.split("|")[4].strip() for row in rows]
    assert functions == [
        "additive",
        "general",
        "scaled_dot",
        "multihead",
        "multihead weights",
        "multihead additive",
    ]


# ----- make -----
@pytest.mark.parametrize("target", make_targets(), ids=[shlex.join(t) for t in make_targets()])
def test_every_make_target_dry_runs_scripts_that_exist_with_options_they_take(target, helps):
    done = run_command(["make", "-n", *target], timeout=60)
    assert done.returncode == 0, done.stderr
    for line in done.stdout.splitlines():
        words = shlex.split(line)
        for word in words:
            if word.endswith((".py", ".sh")) and not word.startswith("-"):
                assert (ROOT / word).is_file(), f"make {shlex.join(target)} runs {word}, which does not exist"
        call = script_call(words)
        if call and call[0] in helps:
            known = set(re.findall(r"--?[A-Za-z][\w-]*", helps[call[0]]))
            assert [o for o in options(call[1]) if o not in known] == [], line
