"""Check the toolkit on a GPU machine without network: bring what it lacks, run the gpu tests and a
training benchmark there, and get one Markdown report back (docs/gpu_check.md).

    # 1. on a machine with the package registries and the data (once):
    python scripts/gpu_check.py prepare --out .gpu_check --data /path/to/multi30k

    # 2. on the GPU machine, from the repository root, with the folder .gpu_check beside it:
    python3 scripts/gpu_check.py run --bundle .gpu_check --report gpu_check.md

    # or, there, the bundle's packages and data for a command of one's own (the GPU recipe):
    env=$(python3 scripts/gpu_check.py install --bundle .gpu_check) && eval "$env" &&
    python3 train.py +experiment=gpu_multi30k data.root="$MULTI30K_DIR"

``prepare`` makes the bundle: the wheels a GPU machine with its own PyTorch lacks, for CPython 3.12
on x86-64 Linux (hydra-core and the omegaconf and antlr4 runtime it needs; antlr4 has no wheel on
PyPI, so it is built here; ctranslate2 unless ``--no-ctranslate2``; never torch, which the GPU
machine brings for its CUDA), the Multi30k de/en splits the check reads, and ``manifest.json``.
It refuses a bundle over 60 MiB (what reaches the GPU machine is at most 64 MiB, the
repository included). ``--data`` defaults to ``$MULTI30K_DIR``; ``--wheels DIR`` takes the wheels
from a folder (an earlier bundle's ``wheels/``) instead of downloading them.

``run`` installs the wheels into ``BUNDLE/site`` (``pip install --no-index --no-deps --target``),
puts the repository (the project is not installed there) and that folder on the ``PYTHONPATH`` of
the processes it starts, records the machine and the versions, runs ``python -m pytest -m gpu
tests/test_gpu.py`` on the bundle's data, then three measurements:

- ``scripts/benchmark.py train --device cuda`` for a few steps of ``COMPILED_MODELS`` (transformer_base
  compiled, in bf16), alone, with a time of its own, then of ``BENCH_MODELS`` (transformer_base in
  bf16 and in TF32 float32; rnn_large in bf16): target tokens/s, step time, the model FLOPs of a
  step and the MFU, and a profile's split of a step;
- ``scripts/benchmark.py epochs --device cuda``: the default Transformer's first three epochs from
  scratch, each one's rate, then greedy validation (cold and warm) and test_2016_flickr decoded at
  beam 1 and 5;

each step under a time limit so that the whole check ends within 9 minutes, and writes the report
to FILE. Exit code 0 when every step passed; 1 when one failed or ran out of time, or when there is
no CUDA device.

``install`` installs the wheels as ``run`` does and prints ``export`` lines for a shell: the
``PYTHONPATH`` and ``MULTI30K_DIR`` of the check's own commands, and no network.
"""

import argparse
import contextlib
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent

LIMIT_MIB = 60  # default --max-mib: a 64 MiB transfer to the GPU machine less room for the repository
# The GPU machine's Python and platform the bundle is made for: CPython 3.12 on x86-64 Linux (the
# machines this check was written for); another Python needs other native wheels (CTranslate2).
TARGET = (
    "--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 "
    "--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
).split()
# hydra-core and ctranslate2 as pinned in requirements.txt; omegaconf and antlr4 as this
# environment resolved them for hydra-core (pip show omegaconf). The GPU machine has PyYAML,
# numpy, packaging and the rest (sentencepiece, sacrebleu, tensorboard, matplotlib, pytest).
PURE = {"hydra-core": "1.3.8", "omegaconf": "2.3.1"}  # py3-none-any wheels on PyPI
BUILT = {"antlr4-python3-runtime": "4.9.3"}  # a source distribution only: built here, pure Python
NATIVE = {"ctranslate2": "4.8.5"}  # a cp312 manylinux wheel, about 41 MiB
SPLITS, LANGS = ("train", "val", "test_2016_flickr"), ("de", "en")
DATA = Path("data") / "multi30k"  # inside the bundle
MANIFEST = "manifest.json"

TOTAL_SECONDS = 540  # the whole run, within 9 minutes
# each step's own limit, the most it may take when the steps before it left the time
SECONDS = {"install": 120, "facts": 90, "tests": 200, "compiled": 150, "benchmark": 240, "epochs": 90}
# the least each measurement is left: kept from the steps before it
LEAST = {"compiled": 110, "benchmark": 130, "epochs": 90}
MEASURE_RESERVE = sum(LEAST.values())  # kept for the measurements when the tests start
PIP_OFFLINE = "--quiet --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check".split()
GPU_TESTS = ["tests/test_gpu.py"]
# the gpu tests, a line per test in the summary (failed, errors, skipped with the reason, passed)
PYTEST_OPTIONS = "-m gpu -p no:cacheprovider -rfEsp --durations=5".split()
BENCH_STEPS = ("--warmup", "10", "--steps", "50")
# the compiled model, measured alone first: its compilation cannot take the others' time, nor
# theirs its turn
COMPILED_MODELS = ("transformer_base,trainer.compile=true",)
# the training benchmark's eager models, each with its own overrides
BENCH_MODELS = (
    "transformer_base",
    "transformer_base,trainer.amp=false",
    "rnn_large",
)
EPOCHS = ("--model", "transformer", "--epochs", "3", "--beams", "1", "5")
# the measurements: step name -> the report's heading of its table
MEASUREMENTS = {
    "compiled": "Training throughput and MFU, compiled",
    "benchmark": "Training throughput and MFU",
    "epochs": "The first epochs, validation and decoding",
}
OUTPUT_LINES = 300  # of the pytest output in the report
# what ``install`` prints for a shell: the project and the bundle's packages, its data, no network
EXPORTED = ("PYTHONPATH", "MULTI30K_DIR", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


class CheckError(Exception):
    """A check that cannot go on; the message is one line that says why."""


# ----- prepare ----------------------------------------------------------------------------------


def wheel_fits(filename: str) -> bool:
    """Whether a wheel installs on CPython 3.12, x86-64 Linux (glibc): pure Python or cp312 manylinux."""
    parts = filename[: -len(".whl")].split("-") if filename.endswith(".whl") else []
    if len(parts) not in (5, 6):  # name-version[-build]-python-abi-platform
        return False
    python, abi, platforms = parts[-3].split("."), parts[-2], parts[-1].split(".")
    pure = abi == "none" and platforms == ["any"] and ("py3" in python or "cp312" in python)
    native = "cp312" in python and abi in ("cp312", "abi3")
    linux = all(p.startswith("manylinux") and p.endswith("_x86_64") for p in platforms)
    return pure or (native and linux)


def pip(*args: str) -> None:
    """``python -m pip ARGS`` here; ``CheckError`` with pip's last line when it fails."""
    done = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or f"exit code {done.returncode}").splitlines()[-1]
        raise CheckError(f"pip {args[0]} failed: {last}")


def fetch_wheels(folder: Path, ctranslate2: bool) -> None:
    """Download (and for antlr4 build) the wheels the GPU machine lacks into ``folder``."""
    wanted = {**PURE, **(NATIVE if ctranslate2 else {})}
    specs = [f"{name}=={version}" for name, version in wanted.items()]
    pip("download", "--no-deps", "--only-binary=:all:", *TARGET, "--dest", str(folder), *specs)
    for name, version in BUILT.items():
        pip("wheel", "--no-deps", "--wheel-dir", str(folder), f"{name}=={version}")


def check_wheels(folder: Path) -> List[Path]:
    """The wheels of ``folder``; ``CheckError`` for one that would not install on the GPU machine."""
    wheels = sorted(folder.glob("*.whl"))
    for wheel in wheels:
        if not wheel_fits(wheel.name):
            raise CheckError(f"{wheel.name} does not install on CPython 3.12 x86-64 Linux")
    return wheels


def copy_data(source: Path, target: Path) -> List[Path]:
    """The splits of ``SPLITS`` in ``LANGS`` of a raw-layout Multi30k folder, copied into ``target``."""
    from data.corpus import split_files

    if not source.is_dir():
        raise CheckError(f"data folder {source} does not exist: give --data DIR (Multi30k, raw layout)")
    files = split_files(source)
    target.mkdir(parents=True)
    copied = []
    for split in SPLITS:
        for lang in LANGS:
            path = files.get(split, {}).get(lang)
            if path is None:
                raise CheckError(f"{source} has no {split}.{lang}[.gz]: the check reads it")
            copied.append(Path(shutil.copy(path, target / path.name)))
    return copied


def size_problem(total_bytes: int, limit_mib: int = LIMIT_MIB) -> Optional[str]:
    """Why a bundle of ``total_bytes`` is refused, or None when it fits."""
    if total_bytes <= limit_mib * 2**20:
        return None
    return (
        f"the bundle would be {total_bytes / 2**20:.1f} MiB, over the {limit_mib} MiB of --max-mib: "
        "leave out CTranslate2 (--no-ctranslate2) or raise --max-mib"
    )


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest(bundle: Path, wheels: Sequence[Path], data: Sequence[Path]) -> Dict[str, Any]:
    def entry(path: Path) -> Dict[str, Any]:
        return {
            "file": path.relative_to(bundle).as_posix(),
            "bytes": path.stat().st_size,
            "sha256": sha256(path),
        }

    entries = {"wheels": [entry(p) for p in wheels], "data": [entry(p) for p in data]}
    return {
        "made": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "for": "CPython 3.12, x86-64 Linux (manylinux)",
        "total_bytes": sum(e["bytes"] for kind in entries.values() for e in kind),
        **entries,
    }


def copy_wheels(source: Path, folder: Path, ctranslate2: bool) -> None:
    """The wheels of ``source`` (downloaded before, e.g. by an earlier ``prepare``) into ``folder``."""
    if not source.is_dir():
        raise CheckError(f"wheel folder {source} does not exist")
    for wheel in sorted(source.glob("*.whl")):
        if ctranslate2 or not wheel.name.startswith("ctranslate2"):
            shutil.copyfile(wheel, folder / wheel.name)


def prepare(
    out: Path,
    data: Optional[str],
    ctranslate2: bool = True,
    wheels: Optional[Path] = None,
    max_mib: int = LIMIT_MIB,
) -> Dict[str, Any]:
    """Make the bundle ``out`` (a new folder, or an earlier bundle, which is replaced); its manifest.
    The wheels are downloaded, or taken from the folder ``wheels``."""
    if not data:
        raise CheckError("give --data DIR (a Multi30k folder in the raw layout) or set MULTI30K_DIR")
    if out.exists() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise CheckError(f"{out} exists and is not a bundle of this script: give another --out")
    staging = Path(tempfile.mkdtemp(prefix="gpu_check."))  # outside the repository until complete
    try:
        (staging / "wheels").mkdir()
        if wheels is None:
            fetch_wheels(staging / "wheels", ctranslate2)
        else:
            copy_wheels(wheels, staging / "wheels", ctranslate2)
        wheels = check_wheels(staging / "wheels")
        copied = copy_data(Path(data), staging / DATA)
        content = manifest(staging, wheels, copied)
        problem = size_problem(content["total_bytes"], max_mib)
        if problem:
            raise CheckError(problem)
        (staging / MANIFEST).write_text(json.dumps(content, indent=1) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(staging, out)
        out.chmod(0o755)  # a temporary folder's mode is 700
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return content


# ----- run --------------------------------------------------------------------------------------


@dataclass
class Step:
    """One command of the check: its output (stdout and stderr together), exit code and time."""

    name: str
    command: List[str]
    returncode: Optional[int]  # None: not run
    seconds: float = 0.0
    output: str = ""
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def run_step(name: str, command: List[str], env: Dict[str, str], timeout: float) -> Step:
    """Run ``command`` in the repository root for at most ``timeout`` seconds. Past it, the command
    and everything it started (its own process group: translate.py, torchrun workers) are killed.
    The output goes to a file, so a killed command's children cannot hold a pipe open."""
    print(f"gpu_check: {name} (at most {timeout:.0f} s): {' '.join(command)}", flush=True)
    tick = time.monotonic()
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        timed_out = False
        try:
            process.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.seek(0)
        output = log.read().decode("utf-8", errors="replace")
    step = Step(name, command, process.returncode, time.monotonic() - tick, output, timed_out)
    print(f"gpu_check: {name}: {outcome(step)} in {step.seconds:.0f} s", flush=True)
    return step


def not_run(name: str, why: str) -> Step:
    return Step(name, [], None, output=why)


def child_env(bundle: Path) -> Dict[str, str]:
    """The environment of the check's commands: the project's packages (the repository: the GPU
    machine cannot install the project), the bundle's packages and data, no network."""
    env = dict(os.environ)
    site = str((bundle / "site").resolve())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), site, env.get("PYTHONPATH")) if p)
    env["MULTI30K_DIR"] = str((bundle / DATA).resolve())
    env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return env


def read_manifest(bundle: Path) -> Dict[str, Any]:
    path = bundle / MANIFEST
    if not path.is_file():
        raise CheckError(f"{bundle} holds no {MANIFEST}: make the bundle with 'gpu_check.py prepare' first")
    content = json.loads(path.read_text())
    for entry in content["wheels"] + content["data"]:
        if not (bundle / entry["file"]).is_file():
            raise CheckError(f"{bundle / entry['file']} is missing: carry the whole bundle")
    return content


def install_command(bundle: Path, content: Dict[str, Any]) -> List[str]:
    wheels = [str(bundle / entry["file"]) for entry in content["wheels"]]
    return [sys.executable, "-m", "pip", "install", *PIP_OFFLINE, "--target", str(bundle / "site"), *wheels]


def install(bundle: Path, content: Dict[str, Any], env: Dict[str, str], timeout: float) -> Step:
    """The bundle's wheels into ``BUNDLE/site``, afresh (a folder carried from another machine may
    hold another Python's)."""
    shutil.rmtree(bundle / "site", ignore_errors=True)
    return run_step("install", install_command(bundle, content), env, timeout)


def install_for_shell(bundle: Path) -> int:
    """``install``: the wheels into ``BUNDLE/site``, then on stdout the ``export`` lines of
    ``EXPORTED`` (the progress goes to stderr), for a shell to ``eval`` before a command of one's
    own, such as training the GPU recipe (the module's docstring)."""
    bundle = bundle.resolve()
    content = read_manifest(bundle)
    env = child_env(bundle)
    with contextlib.redirect_stdout(sys.stderr):
        step = install(bundle, content, env, SECONDS["install"])
    if not step.ok:
        last = tail(step.output, 1)[0] if step.output.strip() else outcome(step)
        raise CheckError(f"installing the wheels of {bundle} failed: {last}")
    for name in EXPORTED:
        print(f"export {name}={shlex.quote(env[name])}")
    return 0


def pytest_command() -> List[str]:
    return [sys.executable, "-m", "pytest", *PYTEST_OPTIONS, *GPU_TESTS]


def measure_command(step: str, bundle: Path, scratch: Path) -> List[str]:
    """The command of a measurement (``MEASUREMENTS``); its table is ``scratch/<step>.md``."""
    models = {"compiled": COMPILED_MODELS, "benchmark": BENCH_MODELS}
    own = ["train", *BENCH_STEPS, "--models", *models[step]] if step in models else ["epochs", *EPOCHS]
    return [
        sys.executable,
        "scripts/benchmark.py",
        *own,
        "--device",
        "cuda",
        "--data",
        str((bundle / DATA).resolve()),
        "--out",
        str(scratch / step),
        "--",
        f"data.cache_dir={scratch / 'cache'}",
    ]


def read_results(path: Path) -> Optional[Dict[str, Any]]:
    """A measurement's JSON results; None when it wrote none or left an unreadable file."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def machine_facts() -> Dict[str, Any]:
    """The machine and the versions the check runs with (``run`` asks a child process, which sees
    the bundle's packages)."""
    import platform
    from importlib import metadata

    import torch

    def version(name: str) -> Optional[str]:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    names = [*PURE, *BUILT, *NATIVE, "PyYAML", "numpy", "sentencepiece", "sacrebleu", "tensorboard", "pytest"]
    facts: Dict[str, Any] = {
        "python": platform.python_version(),
        "cpu": f"{os.cpu_count()} cores ({platform.machine()})",
        "packages": {name: version(name) for name in names},
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_available": torch.cuda.is_available(),
        "gpus": [],
    }
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            facts["gpus"].append(
                f"{props.name}, {props.total_memory / 2**30:.1f} GiB, compute capability {props.major}.{props.minor}"
            )
        facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    smi = shutil.which("nvidia-smi")
    if smi:
        done = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
        )
        facts["driver"] = (
            done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout else None
        )
    try:
        import ctranslate2

        from inference.ctranslate2_engine import missing_cuda_libraries

        facts["ctranslate2"] = {
            "gpus": ctranslate2.get_cuda_device_count(),
            "missing": missing_cuda_libraries(),
        }
    except Exception as error:  # noqa: BLE001 (a fact to report, whatever it is)
        facts["ctranslate2"] = {"error": f"{type(error).__name__}: {error}"}
    return facts


def parse_facts(output: str) -> Dict[str, Any]:
    """The JSON line of ``gpu_check.py facts`` in its output (warnings may come before or after)."""
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                break
    return {}


def pytest_summary(output: str) -> List[str]:
    """The lines of pytest's short summary (one per failed, skipped or passed test) and its final
    line; the last lines of the output when it has none (a run killed at its time limit)."""
    lines = output.rstrip().splitlines()
    start = next((i for i, line in enumerate(lines) if "short test summary info" in line), None)
    if start is None:
        return lines[-5:]
    return [line.strip("= ") if line.startswith("=") else line for line in lines[start + 1 :]]


def outcome(step: Step) -> str:
    if step.returncode is None:
        return f"not run ({step.output})"
    if step.timed_out:
        return f"stopped at its time limit ({step.seconds:.0f} s)"
    return "ok" if step.ok else f"failed (exit {step.returncode})"


def versions_table(facts: Dict[str, Any]) -> List[str]:
    packages = facts.get("packages", {})
    bundled = [*PURE, *BUILT, *NATIVE]
    ct2 = facts.get("ctranslate2", {})
    if "error" in ct2:
        ct2_line = ct2["error"]
    else:
        missing = ", ".join(ct2.get("missing") or []) or "none"
        ct2_line = (
            f"{packages.get('ctranslate2')}: sees {ct2.get('gpus')} GPU(s); CUDA libraries missing: {missing}"
        )
    libraries = f"CUDA {facts.get('cuda')}, cuDNN {facts.get('cudnn')}, NCCL {facts.get('nccl', '-')}"
    rows = [
        ("GPU", "; ".join(facts.get("gpus") or []) or "none visible to torch"),
        ("driver", facts.get("driver") or "-"),
        ("CPU", facts.get("cpu", "-")),
        ("Python", facts.get("python", "-")),
        ("torch", f"{facts.get('torch')}: {libraries}"),
        ("CTranslate2", ct2_line),
        ("brought in the bundle", ", ".join(f"{n} {packages.get(n)}" for n in bundled if packages.get(n))),
        ("from the machine", ", ".join(f"{n} {v}" for n, v in packages.items() if n not in bundled and v)),
    ]
    return ["| | |", "| --- | --- |", *[f"| {key} | {value} |" for key, value in rows]]


def target_rows(results: Dict[str, Any]) -> List[str]:
    """The targets of a GPU's speed (one H100) against the measurements' JSON ``results`` (by step
    name), a table row each: what was aimed at, what was measured, whether it was met."""
    rows = []

    def row(target: str, measured: Optional[float], text: str, met: bool) -> None:
        rows.append(
            f"| {target} | {text if measured is not None else 'not measured'} | "
            f"{('yes' if met else 'no') if measured is not None else '-'} |"
        )

    benchmarked = [r for step in ("benchmark", "compiled") for r in (results.get(step) or {}).get("rows", [])]
    for r in benchmarked:
        if r["model"].split(",")[0] == "transformer_base" and r["precision"] == "bfloat16" and r.get("mfu"):
            kind = "compiled" if r["compile"] else "eager"
            row(
                f"transformer_base bf16 ({kind}) MFU >= 25% (moonshot 35%)",
                r["mfu"],
                f"{100 * r['mfu']:.1f}%",
                r["mfu"] >= 0.25,
            )
    epochs = results.get("epochs") or {}
    if epochs:
        ratio = epochs["first_to_last"]
        row(
            "first epoch within 1.5x of the steady rate",
            ratio,
            f"first / last rate {ratio:.2f}",
            ratio >= 1 / 1.5,
        )
        cold, warm = epochs["validation_seconds"]
        row(
            f"greedy validation of {epochs['validation_sentences']} sentences < 2 s",
            warm,
            f"{warm:.2f} s warm, {cold:.2f} s cold",
            warm < 2,
        )
        for d in epochs["decoding"]:
            if d["beam"] == 5:
                row(
                    f"beam-5 decoding of {d['split']} < 3 s",
                    d["seconds"],
                    f"{d['seconds']:.2f} s",
                    d["seconds"] < 3,
                )
    return rows


def render_report(
    facts: Dict[str, Any],
    steps: Sequence[Step],
    tables: Dict[str, Optional[str]],
    seconds: float,
    results: Optional[Dict[str, Any]] = None,
) -> str:
    """The Markdown report: verdict, machine and versions, steps, test summary and output, the
    targets against the measurements' JSON ``results`` (by step name), the measurements' ``tables``
    (by step name; None: the step's last output lines instead)."""
    verdict = "PASSED" if steps and all(s.ok for s in steps) else "FAILED"
    by_name = {s.name: s for s in steps}
    lines = [
        f"# GPU check: {verdict}",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {seconds:.0f} s in all "
        f"(the steps are stopped by {TOTAL_SECONDS} s).",
        "",
        "## Machine and versions",
        "",
        *versions_table(facts),
        "",
        "## Steps",
        "",
        "| step | result | seconds |",
        "| --- | --- | ---: |",
        *[f"| {s.name} | {outcome(s)} | {s.seconds:.0f} |" for s in steps],
    ]
    for step in steps:
        if step.returncode is not None and not step.ok and step.name not in ("tests", *MEASUREMENTS):
            lines += [
                "",
                f"{step.name}: `{' '.join(step.command)}`",
                "",
                "```text",
                *tail(step.output, 40),
                "```",
            ]
    tests = by_name.get("tests")
    if tests is not None and tests.returncode is not None:
        lines += ["", "## Tests", "", f"`{' '.join(['python', *tests.command[1:]])}`", "", "```text"]
        lines += [*pytest_summary(tests.output), "```", "", "<details><summary>pytest output</summary>", ""]
        lines += ["```text", *tail(tests.output, OUTPUT_LINES), "```", "", "</details>"]
    targets = target_rows(results or {})
    if targets:
        lines += ["", "## Targets", "", "| target | measured | met |", "| --- | --- | --- |", *targets]
    for name, heading in MEASUREMENTS.items():
        step = by_name.get(name)
        if step is None or step.returncode is None:
            continue
        lines += ["", f"## {heading}", "", f"`{' '.join(['python', *step.command[1:]])}`", ""]
        if tables.get(name):
            lines.append(tables[name].strip())  # type: ignore[union-attr]
        if not step.ok or not tables.get(name):
            lines += ["", "```text", *tail(step.output, 40), "```"]
    return "\n".join(lines) + "\n"


def tail(text: str, n: int) -> List[str]:
    lines = text.rstrip().splitlines()
    return ([f"... ({len(lines) - n} lines before)"] if len(lines) > n else []) + lines[-n:]


def time_for(step: str, deadline: float, reserve: float = 0) -> float:
    """The seconds ``step`` may take: its own limit, within what the deadline leaves after ``reserve``."""
    return max(1.0, min(SECONDS[step], deadline - time.monotonic() - reserve))


def run_check(bundle: Path, report: Path) -> int:
    """Install, gather facts, test, benchmark; write the report; 0 when every step passed."""
    start = time.monotonic()
    deadline = start + TOTAL_SECONDS
    bundle = bundle.resolve()
    content = read_manifest(bundle)
    report.parent.mkdir(parents=True, exist_ok=True)
    env = child_env(bundle)
    steps = [install(bundle, content, env, time_for("install", deadline))]
    facts: Dict[str, Any] = {}
    tables: Dict[str, Optional[str]] = {}
    results: Dict[str, Any] = {}
    if steps[0].ok:
        command = [sys.executable, str(Path(__file__).resolve()), "facts"]
        steps.append(run_step("facts", command, env, time_for("facts", deadline)))
        facts = parse_facts(steps[-1].output) if steps[-1].ok else {}
        print("\n".join(versions_table(facts)), flush=True)
    if not facts.get("cuda_available"):
        why = "no CUDA device" if facts else "no facts of the machine"
        steps += [not_run("tests", why), *[not_run(name, why) for name in MEASUREMENTS]]
    else:
        tests = run_step("tests", pytest_command(), env, time_for("tests", deadline, MEASURE_RESERVE))
        steps.append(tests)
        print("\n".join(pytest_summary(tests.output)), flush=True)
        with tempfile.TemporaryDirectory() as scratch:
            for name in MEASUREMENTS:
                command = measure_command(name, bundle, Path(scratch))
                later = sum(LEAST[n] for n in list(MEASUREMENTS)[list(MEASUREMENTS).index(name) + 1 :])
                steps.append(run_step(name, command, env, time_for(name, deadline, later)))
                # the training benchmark writes its table after each model: a stopped one has a table
                # of what it measured (the epochs benchmark prints each epoch's line as it ends)
                table = Path(scratch) / f"{name}.md"
                tables[name] = table.read_text() if table.is_file() else None
                results[name] = read_results(table.with_suffix(".json"))
    report.write_text(render_report(facts, steps, tables, time.monotonic() - start, results))
    passed = all(s.ok for s in steps)
    print(f"gpu_check: {'PASSED' if passed else 'FAILED'}; report: {report}", flush=True)
    return 0 if passed else 1


# ----- command line -----------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare", help="make the bundle (here: needs the package registries)")
    prep.add_argument(
        "--out", type=Path, default=ROOT / ".gpu_check", help="the bundle folder (default: .gpu_check)"
    )
    prep.add_argument(
        "--data",
        default=os.environ.get("MULTI30K_DIR"),
        help="Multi30k folder in the raw layout, {split}.{lang}[.gz] (default: $MULTI30K_DIR)",
    )
    prep.add_argument(
        "--no-ctranslate2", action="store_true", help="leave CTranslate2 out (its test is skipped)"
    )
    prep.add_argument(
        "--wheels",
        type=Path,
        help="take the wheels from this folder instead of downloading them (e.g. an earlier bundle's wheels/)",
    )
    prep.add_argument("--max-mib", type=int, default=LIMIT_MIB, help="refuse a bundle larger than this (MiB)")
    check = commands.add_parser("run", help="run the check (on the GPU machine, from the repository root)")
    check.add_argument("--bundle", type=Path, default=ROOT / ".gpu_check", help="the folder prepare made")
    check.add_argument("--report", type=Path, required=True, help="the Markdown report to write")
    setup = commands.add_parser(
        "install",
        help="install the bundle's wheels and print the shell's exports that use them "
        '(env=$(... install) && eval "$env" && python3 train.py ...)',
    )
    setup.add_argument("--bundle", type=Path, default=ROOT / ".gpu_check", help="the folder prepare made")
    commands.add_parser("facts", help="internal: the machine and versions as JSON (a child of run)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.command == "facts":
            print(json.dumps(machine_facts()))
            return 0
        if args.command == "run":
            return run_check(args.bundle, args.report)
        if args.command == "install":
            return install_for_shell(args.bundle)
        content = prepare(args.out, args.data, not args.no_ctranslate2, args.wheels, args.max_mib)
    except (CheckError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    listed = ", ".join(Path(entry["file"]).name for entry in content["wheels"])
    size = content["total_bytes"] / 2**20
    print(f"{args.out}: {size:.1f} MiB of {args.max_mib}: {listed}; {len(content['data'])} data files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
