"""``tests/preloaded.py``: a script started from the preloading server behaves as the same script
started from nothing (``subprocess.Popen``'s own start): the same output, exit code and signals.
Each script here prints whether torch was imported before it ran: the one line that tells the two
starts apart, so that a test cannot pass by starting both afresh."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import preloaded
import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"),
    reason="the preloading server needs Linux (a child subreaper): every process starts afresh here",
)

SCRIPT = """
import atexit, os, sys, threading, time
print("torch before the script:", "torch" in sys.modules)
here = os.path.dirname(os.path.realpath(sys.argv[0]))
print(__name__, __file__ == os.path.abspath(sys.argv[0]), sys.argv[1:], sys.path[0] == here)
print("cwd", os.getcwd() == os.environ["EXPECTED_CWD"], "stdin", sys.stdin.read().strip())
atexit.register(lambda: print("exit handler"))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined")), daemon=False).start()
kind = sys.argv[1]
sys.stdout.flush()
if kind == "code":
    sys.exit(3)
if kind == "message":
    sys.exit("a message")
if kind == "error":
    raise ValueError("an error")
if kind == "interrupt":
    raise KeyboardInterrupt
if kind == "sleep":
    time.sleep(60)
"""


@pytest.fixture
def script(tmp_path, monkeypatch):
    path = tmp_path / "script.py"
    path.write_text(SCRIPT)
    monkeypatch.setattr(preloaded, "ROOTS", (*preloaded.ROOTS, tmp_path.resolve()))
    return path


def started(popen, script: Path, kind: str, **kwargs) -> subprocess.Popen:
    env = {**preloaded.Server.get().env, "EXPECTED_CWD": str(script.parent.resolve())}
    return popen(
        [sys.executable, script.name, kind],
        cwd=script.parent,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def outcome(process: subprocess.Popen, stdin: str = "some input"):
    out, err = process.communicate(stdin, timeout=60)
    return process.returncode, out, err


@pytest.mark.parametrize("kind", ["zero", "code", "message", "error", "interrupt"])
def test_a_script_from_the_server_ends_as_one_started_from_nothing(script, kind):
    fresh = outcome(started(preloaded.ORIGINAL_POPEN, script, kind))
    warm = outcome(started(preloaded.PreloadedPopen, script, kind))
    assert fresh[1].startswith("torch before the script: False\n")
    assert warm[1].startswith("torch before the script: True\n")
    same = lambda result: (result[0], result[1].split("\n", 1)[1], result[2])  # noqa: E731
    assert same(warm) == same(fresh)
    expected = {"zero": 0, "code": 3, "message": 1, "error": 1, "interrupt": -signal.SIGINT}[kind]
    assert warm[0] == expected
    assert "__main__ True ['" + kind + "'] True" in warm[1]
    assert "cwd True stdin some input" in warm[1]
    assert warm[1].endswith("thread joined\nexit handler\n")


def test_a_script_from_the_server_is_the_test_process_child_and_takes_its_signals(script):
    process = started(preloaded.PreloadedPopen, script, "sleep", start_new_session=True)
    process.stdin.close()
    assert process.stdout.readline() == "torch before the script: True\n"
    assert Path(f"/proc/{process.pid}/stat").read_text().split()[3] == str(os.getpid())
    time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == -signal.SIGTERM


def test_other_starts_are_left_to_subprocess(script, tmp_path_factory):
    """Interpreter options, a script outside the repository, an import-time variable of its own."""
    code = [sys.executable, "-c", "import sys; print('torch' in sys.modules)"]
    assert outcome(preloaded.PreloadedPopen(code, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))[
        1
    ] == ("False\n")
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "script.py"
    elsewhere.write_text(SCRIPT)
    for path, variables in ((elsewhere, {}), (script, {"OMP_NUM_THREADS": "7"})):
        env = {**preloaded.Server.get().env, **variables, "EXPECTED_CWD": str(path.parent.resolve())}
        process = preloaded.PreloadedPopen(
            [sys.executable, path.name, "zero"],
            cwd=path.parent,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert process.communicate(timeout=60)[0].startswith("torch before the script: False\n")


def test_scripts_from_the_server_draw_numpys_global_numbers_anew(script):
    """NumPy seeds its global generator from the system's entropy when it is imported: each script
    from the server gets a seed of its own, not the server's."""
    draw = script.parent / "draw.py"
    draw.write_text("import sys, numpy\nprint('torch' in sys.modules, numpy.random.randint(2**62))\n")
    draws = set()
    for _ in range(2):
        process = preloaded.PreloadedPopen(
            [sys.executable, draw.name],
            cwd=draw.parent,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        warm, number = process.communicate(timeout=60)[0].split()
        assert warm == "True"
        draws.add(number)
    assert len(draws) == 2
