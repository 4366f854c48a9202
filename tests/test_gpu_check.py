"""scripts/gpu_check.py without a GPU and without the network: the bundle (the download replaced by
local files), its size limit, the wheels it takes, a step's time limit, and the report assembled
from given pieces."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import ROOT, assert_one_error_line, load_script, write_lines

gpu_check = load_script("gpu_check")
benchmark = load_script("benchmark")

WHEELS = {
    "hydra_core-1.3.8-py3-none-any.whl": 1000,
    "omegaconf-2.3.1-py3-none-any.whl": 1000,
    "antlr4_python3_runtime-4.9.3-py3-none-any.whl": 1000,
    "ctranslate2-4.8.5-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl": 5000,
}
DATA_FILES = [f"{split}.{lang}" for split in ("train", "val", "test_2016_flickr") for lang in ("de", "en")]


@pytest.fixture
def data(tmp_path) -> Path:
    """A raw-layout folder: the six files the check reads, and two it leaves (French, another test set)."""
    folder = tmp_path / "multi30k"
    folder.mkdir()
    for name in [*DATA_FILES, "train.fr", "test_2017_flickr.de"]:
        write_lines(folder / name, ["Ein Mann.", "Zwei Hunde."])
    return folder


@pytest.fixture
def wheels(tmp_path):
    """A folder of ``WHEELS`` (name: bytes, sparse files) for ``prepare --wheels`` (no PyPI in a
    test); ``sizes`` changes a size. Temporary folders go to ``tmp_path / "tmp"``."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    (tmp_path / "tmp").mkdir()

    def write(sizes):
        for name, size in sizes.items():
            with open(folder / name, "wb") as wheel:
                wheel.truncate(size)
        return folder

    write(WHEELS)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
        yield write


def script(capsys, *args) -> subprocess.CompletedProcess:
    """``gpu_check.main(ARGS)`` in this process; its exit code and output, as a subprocess's."""
    code = gpu_check.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def test_prepare_makes_a_bundle_of_the_wheels_the_data_and_a_manifest(wheels, data, tmp_path, capsys):
    out = tmp_path / "bundle"
    done = script(capsys, "prepare", "--out", out, "--data", data, "--wheels", wheels({}))
    assert done.returncode == 0, done.stderr
    content = json.loads((out / "manifest.json").read_text())
    assert sorted(Path(e["file"]).name for e in content["wheels"]) == sorted(WHEELS)
    assert sorted(Path(e["file"]).name for e in content["data"]) == sorted(DATA_FILES)
    assert sorted(p.name for p in (out / "data" / "multi30k").iterdir()) == sorted(DATA_FILES)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and p.name != "manifest.json")
    assert content["total_bytes"] == total and f"{total / 2**20:.1f} MiB of 60" in done.stdout
    assert list((tmp_path / "tmp").iterdir()) == []  # the staging folder is gone
    again = script(
        capsys, "prepare", "--out", out, "--data", data, "--no-ctranslate2", "--wheels", wheels({})
    )
    assert again.returncode == 0  # an earlier bundle is replaced
    assert not any(p.name.startswith("ctranslate2") for p in (out / "wheels").iterdir())


def test_a_bundle_over_60_mib_is_refused_in_one_line_and_leaves_nothing(wheels, data, tmp_path, capsys):
    big = next(name for name in WHEELS if name.startswith("ctranslate2"))
    out = tmp_path / "bundle"
    done = script(capsys, "prepare", "--out", out, "--data", data, "--wheels", wheels({big: 61 * 2**20}))
    assert_one_error_line(done, "the bundle would be 61.0 MiB, over the 60 MiB")
    assert "--no-ctranslate2" in done.stderr
    assert not out.exists() and list((tmp_path / "tmp").iterdir()) == []


def test_prepare_refuses_a_folder_of_something_else_and_a_missing_split(wheels, data, tmp_path, capsys):
    folder = wheels({})
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    assert_one_error_line(
        script(capsys, "prepare", "--out", other, "--data", data, "--wheels", folder),
        "is not a bundle of this script",
    )
    assert [p.name for p in other.iterdir()] == ["notes.txt"]
    (data / "val.en").unlink()
    assert_one_error_line(
        script(capsys, "prepare", "--out", tmp_path / "b", "--data", data, "--wheels", folder),
        "has no val.en[.gz]",
    )
    assert_one_error_line(
        script(capsys, "prepare", "--out", tmp_path / "b", "--data", tmp_path / "none", "--wheels", folder),
        "does not exist",
    )


def test_prepare_without_data_says_how_to_give_it(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("MULTI30K_DIR", raising=False)
    assert_one_error_line(script(capsys, "prepare", "--out", tmp_path / "b"), "give --data DIR")


@pytest.mark.parametrize(
    "name, fits",
    [
        ("hydra_core-1.3.8-py3-none-any.whl", True),
        ("six-1.16.0-py2.py3-none-any.whl", True),
        ("ctranslate2-4.8.5-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl", True),
        ("pkg-1.0-1-cp312-abi3-manylinux2014_x86_64.whl", True),
        ("ctranslate2-4.8.5-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl", False),
        ("ctranslate2-4.8.5-cp312-cp312-manylinux_2_27_aarch64.manylinux_2_28_aarch64.whl", False),
        ("ctranslate2-4.8.5-cp312-cp312-macosx_11_0_arm64.whl", False),
        ("ctranslate2-4.8.5-cp312-cp312-musllinux_1_2_x86_64.whl", False),
        ("antlr4-python3-runtime-4.9.3.tar.gz", False),
    ],
)
def test_only_wheels_for_cpython_312_on_x86_64_linux_are_taken(name, fits):
    assert gpu_check.wheel_fits(name) is fits


def test_the_pins_are_those_of_requirements_txt_and_torch_is_never_brought():
    pins = dict(
        line.split("==")
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    bundled = {**gpu_check.PURE, **gpu_check.BUILT, **gpu_check.NATIVE}
    assert bundled["hydra-core"] == pins["hydra-core"] and bundled["ctranslate2"] == pins["ctranslate2"]
    assert "torch" not in bundled


def child_ends(pid: int, seconds: float = 10) -> bool:
    """Whether process ``pid`` is gone (or dead, not yet reaped) within ``seconds``: a SIGKILL
    takes effect a moment after it is sent."""
    stat = Path(f"/proc/{pid}/stat")
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)
    return False


def test_a_step_past_its_time_limit_is_killed_with_what_it_started():
    """The command and its own child (as pytest starts translate.py) end at the limit; the output so
    far is kept."""
    code = textwrap.dedent(
        """
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print(child.pid, flush=True)
        time.sleep(60)
        """
    )
    tick = time.monotonic()
    step = gpu_check.run_step("slow", [sys.executable, "-c", code], {}, timeout=2)
    assert step.timed_out and not step.ok and time.monotonic() - tick < 20
    assert child_ends(int(step.output.split()[0]))
    assert "stopped at its time limit" in gpu_check.outcome(step)
    quick = gpu_check.run_step("quick", [sys.executable, "-c", "print('done'); raise SystemExit(3)"], {}, 20)
    assert (quick.returncode, quick.output, quick.timed_out) == (3, "done\n", False)


def test_the_facts_line_is_found_among_warnings():
    output = 'UserWarning: something\n{"python": "3.12.3", "gpus": []}\nwarning at exit\n'
    assert gpu_check.parse_facts(output) == {"python": "3.12.3", "gpus": []}
    assert gpu_check.parse_facts("Traceback (most recent call last):\n") == {}


PYTEST_OUTPUT = """\
.F..s
============================= slowest 5 durations ==============================
61.20s setup    tests/test_gpu.py::test_model_family_learns_on_cuda[rnn-bf16]
=========================== short test summary info ============================
PASSED tests/test_gpu.py::test_model_family_learns_on_cuda[rnn-bf16]
SKIPPED [1] tests/test_gpu.py:280: needs 2 GPUs
FAILED tests/test_gpu.py::test_translate_py_runs_on_cuda[bfloat16] - AssertionError: BLEU 12.0
1 failed, 3 passed, 1 skipped in 201.50s (0:03:21)
"""

FACTS = {
    "python": "3.12.3",
    "cpu": "16 cores (x86_64)",
    "packages": {"hydra-core": "1.3.8", "omegaconf": "2.3.1", "ctranslate2": "4.8.5", "sacrebleu": "2.5.1"},
    "torch": "2.11.0+cu130",
    "cuda": "13.0",
    "cudnn": 91300,
    "nccl": "2.27.7",
    "cuda_available": True,
    "gpus": ["NVIDIA H100 80GB HBM3, 79.2 GiB, compute capability 9.0"],
    "driver": "580.159.04",
    "ctranslate2": {"gpus": 1, "missing": ["libcublas.so.12"]},
}


def test_pytest_summary_is_the_short_summary_and_the_final_line():
    assert gpu_check.pytest_summary(PYTEST_OUTPUT) == PYTEST_OUTPUT.splitlines()[-4:]
    assert gpu_check.pytest_summary("collecting ...\nline 2\n") == ["collecting ...", "line 2"]


def test_the_report_is_assembled_from_its_pieces():
    Step = gpu_check.Step
    tests = Step("tests", [sys.executable, "-m", "pytest", "-m", "gpu"], 1, 201.5, PYTEST_OUTPUT)
    steps = [
        Step("install", ["pip"], 0, 8.2),
        Step("facts", ["facts"], 0, 3.0),
        tests,
        Step("benchmark", [sys.executable, "scripts/benchmark.py", "train"], 0, 80.0, "log"),
        Step("epochs", [sys.executable, "scripts/benchmark.py", "epochs"], -9, 120.0, '{"epoch": 1}', True),
    ]
    table = "| model | params |\n| --- | ---: |\n| rnn | 4,216,064 |\n"
    tables = {"benchmark": table, "epochs": None}
    report = gpu_check.render_report(FACTS, steps, tables, 300.0)
    assert report.startswith("# GPU check: FAILED\n")
    for expected in [
        "| GPU | NVIDIA H100 80GB HBM3, 79.2 GiB, compute capability 9.0 |",
        "| driver | 580.159.04 |",
        "| torch | 2.11.0+cu130: CUDA 13.0, cuDNN 91300, NCCL 2.27.7 |",
        "| CTranslate2 | 4.8.5: sees 1 GPU(s); CUDA libraries missing: libcublas.so.12 |",
        "hydra-core 1.3.8, omegaconf 2.3.1, ctranslate2 4.8.5",
        "| tests | failed (exit 1) | 202 |",
        "| install | ok | 8 |",
        "`python -m pytest -m gpu`",
        "FAILED tests/test_gpu.py::test_translate_py_runs_on_cuda[bfloat16] - AssertionError: BLEU 12.0",
        "1 failed, 3 passed, 1 skipped in 201.50s (0:03:21)",
        "<details><summary>pytest output</summary>",
        "## Training throughput and MFU\n\n`python scripts/benchmark.py train`\n\n| model | params |",
        # a measurement stopped at its time limit: what it printed so far
        "| epochs | stopped at its time limit (120 s) | 120 |",
        "## The first epochs, validation and decoding\n\n`python scripts/benchmark.py epochs`\n\n\n```text\n"
        '{"epoch": 1}\n```',
        "300 s in all",
    ]:
        assert expected in report, expected
    tests.returncode = 0
    assert gpu_check.render_report(FACTS, steps[:-1], tables, 300.0).startswith("# GPU check: PASSED\n")
    skipped = [steps[0], steps[1], gpu_check.not_run("tests", "no CUDA device")]
    report = gpu_check.render_report({**FACTS, "gpus": []}, skipped, {}, 5.0)
    assert report.startswith("# GPU check: FAILED\n") and "| tests | not run (no CUDA device) | 0 |" in report
    assert "| GPU | none visible to torch |" in report and "## Tests" not in report


def test_the_report_puts_the_targets_beside_what_was_measured():
    bench = {
        "rows": [
            {"model": "transformer_base", "precision": "bfloat16", "compile": False, "mfu": 0.212},
            {
                "model": "transformer_base,trainer.amp=false",
                "precision": "tf32",
                "compile": False,
                "mfu": 0.2,
            },
        ]
    }
    compiled = {
        "rows": [
            {
                "model": "transformer_base,trainer.compile=true",
                "precision": "bfloat16",
                "compile": True,
                "mfu": 0.31,
            }
        ]
    }
    epochs = {
        "first_to_last": 0.8,
        "validation_sentences": 1014,
        "validation_seconds": [2.6, 1.25],
        "decoding": [
            {"split": "test_2016_flickr", "beam": 1, "seconds": 0.9},
            {"split": "test_2016_flickr", "beam": 5, "seconds": 3.4},
        ],
    }
    assert gpu_check.target_rows({"compiled": compiled, "benchmark": bench, "epochs": epochs}) == [
        "| transformer_base bf16 (eager) MFU >= 25% (moonshot 35%) | 21.2% | no |",
        "| transformer_base bf16 (compiled) MFU >= 25% (moonshot 35%) | 31.0% | yes |",
        "| first epoch within 1.5x of the steady rate | first / last rate 0.80 | yes |",
        "| greedy validation of 1014 sentences < 2 s | 1.25 s warm, 2.60 s cold | yes |",
        "| beam-5 decoding of test_2016_flickr < 3 s | 3.40 s | no |",
    ]
    report = gpu_check.render_report(FACTS, [], {}, 1.0, {"benchmark": None, "epochs": epochs})
    assert "## Targets\n\n| target | measured | met |" in report and "| 3.40 s | no |" in report
    assert "## Targets" not in gpu_check.render_report(
        FACTS, [], {}, 1.0, {"benchmark": None, "epochs": None}
    )


def test_the_measurements_run_the_benchmarks_on_cuda_with_their_tables_in_scratch(tmp_path):
    compiled = gpu_check.measure_command("compiled", tmp_path, tmp_path / "scratch")
    bench = gpu_check.measure_command("benchmark", tmp_path, tmp_path / "scratch")
    assert compiled[1:3] == bench[1:3] == ["scripts/benchmark.py", "train"]
    assert compiled[compiled.index("--models") + 1 : compiled.index("--device")] == [
        "transformer_base,trainer.compile=true"
    ]  # alone, in a step of its own: the eager models never wait for its compilation
    assert "transformer_base,trainer.compile=true" not in bench and "rnn_large" in bench
    assert list(gpu_check.MEASUREMENTS)[0] == "compiled"
    assert bench[bench.index("--device") + 1] == "cuda" and bench[bench.index("--out") + 1].endswith(
        "benchmark"
    )
    epochs = gpu_check.measure_command("epochs", tmp_path, tmp_path / "scratch")
    assert epochs[2] == "epochs" and epochs[epochs.index("--epochs") + 1] == "3"
    assert epochs[-1] == f"data.cache_dir={tmp_path / 'scratch' / 'cache'}"
    # every command line the check runs is one benchmark.py accepts
    for command in (compiled, bench, epochs):
        args = benchmark.parse_args(command[2:])
        assert args.device == "cuda" and args.data == str((tmp_path / gpu_check.DATA).resolve())
    # the steps' own limits fit the whole check's: the tests at their limit still leave each
    # measurement its least, and a measurement may take more when the tests leave it
    assert gpu_check.MEASURE_RESERVE == sum(gpu_check.LEAST[name] for name in gpu_check.MEASUREMENTS)
    assert all(gpu_check.LEAST[name] <= gpu_check.SECONDS[name] for name in gpu_check.MEASUREMENTS)
    assert gpu_check.SECONDS["tests"] + gpu_check.MEASURE_RESERVE <= gpu_check.TOTAL_SECONDS


def test_a_measurement_killed_while_writing_its_results_leaves_a_report_without_them(tmp_path):
    written = tmp_path / "benchmark.json"
    written.write_text('{"runs": [{"model": "transformer_base", "mfu": 0.3')  # cut off mid-write
    assert gpu_check.read_results(written) is None
    assert gpu_check.read_results(tmp_path / "missing.json") is None
    written.write_text('{"runs": []}')
    assert gpu_check.read_results(written) == {"runs": []}


def test_run_refuses_a_folder_without_a_manifest(tmp_path, capsys):
    done = script(capsys, "run", "--bundle", tmp_path, "--report", tmp_path / "report.md")
    assert_one_error_line(done, "holds no manifest.json")
    assert not (tmp_path / "report.md").exists()


def write_wheel(folder: Path, name: str) -> Path:
    """A real wheel of one pure-Python module ``name`` (``name = "installed"``), built by hand."""
    import zipfile

    wheel = folder / f"{name}-1.0-py3-none-any.whl"
    info = f"{name}-1.0.dist-info"
    files = {
        f"{name}.py": f"name = {name!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


def test_install_puts_the_wheels_in_the_bundle_and_prints_the_exports_a_shell_evaluates(tmp_path):
    """The exports of ``gpu_check.py install`` evaluated, then a command of one's own: it imports
    the bundle's packages and the project, and finds the bundle's data. An earlier machine's
    ``site`` goes; a wheel that does not install gives one error line and no exports."""
    bundle = tmp_path / "bundle"
    (bundle / "wheels").mkdir(parents=True)
    write_wheel(bundle / "wheels", "bundled_demo")
    (bundle / "site" / "stale").mkdir(parents=True)
    manifest = {"wheels": [{"file": "wheels/bundled_demo-1.0-py3-none-any.whl"}], "data": []}
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    use = "import bundled_demo, common, os; print(bundled_demo.name, os.environ['MULTI30K_DIR'])"
    install = f"{sys.executable} scripts/gpu_check.py install --bundle {bundle}"
    shell = f'env=$({install}) && eval "$env" && {sys.executable} -S -c "{use}"'
    done = subprocess.run(["bash", "-c", shell], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["bundled_demo", str((bundle / gpu_check.DATA).resolve())]
    assert "gpu_check: install" in done.stderr  # the progress, out of the shell's way
    assert not (bundle / "site" / "stale").exists()
    broken = bundle / "wheels" / "bundled_demo-1.0-py3-none-any.whl"
    broken.write_bytes(b"not a zip")
    done = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "install", "--bundle", str(bundle)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: installing the wheels of {bundle} failed")


def test_the_commands_import_the_project_from_the_repository_without_an_install(tmp_path):
    """The GPU machine cannot install the project: its commands find the packages through the
    ``PYTHONPATH`` of ``child_env`` (``-S``: without site-packages, so without this venv's install)."""
    env = gpu_check.child_env(tmp_path)
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(ROOT), str((tmp_path / "site").resolve())]
    code = "import common, data, inference, models, training; print(common.__file__)"
    done = subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == ROOT / "common" / "__init__.py"
