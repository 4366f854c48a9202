"""Script processes of the tests, started from a Python that has imported torch already.

A test that runs ``python train.py ...`` (or translate.py, or a script) pays about 2 s of a 2.5 s
refusal for importing torch, Hydra, SentencePiece, sacreBLEU and TensorBoard, and a training run
1.5 s more for torch's compiler package; the suite starts about a hundred such processes. Here a server
per pytest worker imports them once (``PRELOAD``) and forks for each process, which then runs the
script as ``python SCRIPT ARGS`` does: its argv, ``sys.path[0]`` (the script's folder), working
folder, environment, standard streams, ``__main__``, exit code (``sys.exit``, an uncaught
exception's 1, the signal that killed it) and exit handlers. The server has done nothing but import
(no thread of Python's, no torch operation run, nothing logged), so what the script finds is what a
fresh interpreter would, less the import time, with two differences: the string hash seed is the
server's (every script of a worker shares it) and NumPy's global generator, seeded at its import,
is seeded anew from the system's entropy, as at a fresh import.

The fork is the test process's own child: the server forks twice and, meanwhile, the test process is
a child subreaper (``PR_SET_CHILD_SUBREAPER``), so ``subprocess.Popen`` waits for it, signals it and
reads its exit status as for any child. ``PreloadedPopen`` is ``subprocess.Popen`` with that one
difference; ``tests/conftest.py`` puts it in place of ``subprocess.Popen`` in every worker. Every
other start is ``subprocess.Popen``'s own: another program, interpreter options (``-m``, ``-c``,
``-X``), a terminal on a standard stream (Python's start-up buffers a terminal differently),
``preexec_fn``, ``pass_fds``, user or group changes, or an environment that differs from the
server's in a variable read at start-up or import (``IMPORT_TIME_ENV``).
"""

import atexit
import builtins
import contextlib
import ctypes
import gc
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import types
from pathlib import Path
from typing import Dict, List, Optional

# only the scripts under these folders start from the server: the repository's
ROOTS = (Path(__file__).resolve().parent.parent,)
# torch's compiler package too: a training run's first optimizer step imports it (1.5 s here)
PRELOAD = (
    "torch",
    "torch._dynamo",
    "torch.utils.tensorboard",
    "hydra",
    "omegaconf",
    "numpy",
    "sentencepiece",
    "sacrebleu",
)
# Variables read when the interpreter starts or when the preloaded packages load (the search path,
# buffering, the locale's encodings, GNU OpenMP's and OpenBLAS's threads, the allocator, the library
# path, the home and temporary folders, torch's own and its compiler's configuration, the CPU
# kernels): a process whose values differ from the server's starts afresh. Those read later
# (CUDA_VISIBLE_DEVICES when CUDA starts, KMP_* of Intel's OpenMP, which torch's wheels for Linux do
# not load, RUNTIME_ENV) are the process's own environment.
IMPORT_TIME_ENV = (
    "PYTHON",
    "LANG",
    "LC_",
    "TZ",
    "HOME",
    "TMPDIR",
    "OMP_",
    "GOMP_",
    "OPENBLAS_",
    "MKL_",
    "LD_",
    "MALLOC_",
    "GLIBC_TUNABLES",
    "TORCH_",
    "TORCHINDUCTOR_",
    "TORCHDYNAMO_",
    "PYTORCH_",
    "ATEN_",  # the CPU kernels torch and oneDNN pick (make test-kernels)
    "ONEDNN_",
    "DNNL_",
    "SACREBLEU",  # its cache folder
)
# read when used: torch sets it in the test process when it first compiles, the server never reads it
RUNTIME_ENV = ("TORCHINDUCTOR_CACHE_DIR",)
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
MESSAGE_BYTES = 1 << 20


def import_time_env(env: Dict[str, str]) -> Dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV) and k not in RUNTIME_ENV}


# ----- the server (its own process) -------------------------------------------------------------


def serve(sock: socket.socket) -> None:
    """Fork a script process for each request until the test process closes its end."""
    while True:
        message, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, 3)
        if not message:
            return
        try:
            reply = {"pid": spawn(json.loads(message), fds)}
        except OSError as error:
            reply = {"error": f"{type(error).__name__}: {error}"}
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(json.dumps(reply).encode())


def spawn(request: dict, fds: List[int]) -> int:
    """Fork twice: the grandchild runs the script; the child exits at once, so the grandchild's
    parent becomes the test process (the nearest subreaper) before its pid is returned."""
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:
        code = 1
        try:
            os.close(read)
            pid = os.fork()
            if pid == 0:
                os.close(write)
                run_script(request, fds)  # never returns
            os.write(write, str(pid).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        pid = pipe.read()
    os.waitpid(middle, 0)
    if not pid:
        raise OSError("the fork of the script process failed")
    return int(pid)


def run_script(request: dict, fds: List[int]) -> None:
    """In the forked process: become ``python SCRIPT ARGS`` and exit as it would."""
    code = 1
    try:
        if request["new_session"]:
            os.setsid()
        for target, fd in enumerate(fds):  # stdin, stdout, stderr
            os.dup2(fd, target)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # subprocess's close_fds: the server's socket too
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = list(request["argv"])
        script = sys.argv[0]
        sys.path[0] = os.path.dirname(os.path.realpath(script))
        if "numpy" in sys.modules:  # its global generator as a fresh import seeds it, not the server's
            sys.modules["numpy"].random.seed()
        code = run_main(os.path.abspath(script))
    finally:
        os._exit(code)


def run_main(path: str) -> int:
    """Run the script at ``path`` in a new ``__main__`` module, as the interpreter runs a file; the
    exit code it would give, after its own ending: non-daemon threads joined, exit handlers run,
    the standard streams flushed (120 if they cannot be), ``__main__``'s objects deleted. An
    interpreter stopped by SIGINT ends by that signal."""
    code, signum = 0, None
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __builtins__=builtins)
    sys.modules["__main__"] = main
    try:
        with io.open_code(path) as source:
            exec(compile(source.read(), path, "exec", dont_inherit=True), main.__dict__)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:  # sys.exit("message"): printed, exit code 1
            print(stop.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        print_uncaught()
        signum = signal.SIGINT
    except BaseException:
        print_uncaught()
        code = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    if not flushed() and code == 0:
        code = 120  # the interpreter's exit code when it cannot flush its standard streams
    main.__dict__.clear()  # what the interpreter's module teardown closes and deletes
    gc.collect()
    flushed()
    if signum is not None:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    return code & 0xFF


def flushed() -> bool:
    """Flush stdout and stderr; whether both could be."""
    done = True
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            done = False
    return done


def print_uncaught() -> None:
    """The traceback of the exception being handled, from the script's own frame (as the
    interpreter prints it, without ``run_main``'s)."""
    kind, error, trace = sys.exc_info()
    trace = trace.tb_next  # None where compiling failed: the interpreter prints no frame then
    sys.excepthook(kind, error.with_traceback(trace), trace)


def main() -> None:
    fd = int(sys.argv[1])
    sock = socket.socket(fileno=fd)
    for name in PRELOAD:
        __import__(name)
    sock.send(b"ready")
    serve(sock)


# ----- the test process's side -------------------------------------------------------------------


@contextlib.contextmanager
def subreaper():
    """This process a child subreaper meanwhile: an orphan of its descendants becomes its child. Only
    while a script process starts, so that the other orphans (a killed run's workers) are init's, as
    without the server."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


class Server:
    """One server per test process, started at its first request; it ends with the test process
    (its socket closes)."""

    _instance: Optional["Server"] = None
    _lock = threading.Lock()
    # it could not start, or this is not Linux (no child subreaper): every process starts afresh
    broken = not sys.platform.startswith("linux")

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.env = dict(os.environ)
        self.import_env = import_time_env(self.env)  # what its imports read
        self.process = ORIGINAL_POPEN(
            [sys.executable, __file__, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=self.env,
        )
        theirs.close()
        self.sock = ours
        self.owner = os.getpid()
        if self.sock.recv(16) != b"ready":
            raise OSError(f"the preloading server did not start (exit code {self.process.poll()})")

    @classmethod
    def get(cls) -> Optional["Server"]:
        """The server of this process (None when it could not start)."""
        with cls._lock:
            server = cls._instance
            # a forked test process (multiprocessing) starts its own: the socket is its parent's
            if not cls.broken and (
                server is None or server.owner != os.getpid() or server.process.poll() is not None
            ):
                try:
                    cls._instance = cls()
                except OSError as error:
                    cls.broken, cls._instance = True, None
                    print(f"tests/preloaded.py: {error}; every process starts afresh", file=sys.stderr)
            return cls._instance

    def start(self, argv: List[str], cwd: str, env: Dict[str, str], fds: List[int], new_session: bool) -> int:
        request = {"argv": argv, "cwd": cwd, "env": env, "new_session": new_session}
        with self._lock, subreaper():
            try:
                socket.send_fds(self.sock, [json.dumps(request).encode()], fds)
                reply = json.loads(self.sock.recv(MESSAGE_BYTES))
            except BaseException:  # a signal between the two: the reply would answer the next request
                self.close()
                raise
        if "error" in reply:
            raise OSError(reply["error"])
        return reply["pid"]

    def close(self) -> None:
        """End the server; the next request starts another."""
        self.sock.close()
        self.process.kill()
        self.process.wait()
        if Server._instance is self:
            Server._instance = None


ORIGINAL_POPEN = subprocess.Popen


def script_argv(args, executable, shell, cwd) -> Optional[List[str]]:
    """``[SCRIPT, ARGS...]`` of ``[sys.executable, SCRIPT, ARGS...]`` (SCRIPT a file of the repository
    ending in .py), else None."""
    if shell or executable is not None or isinstance(args, (str, bytes, os.PathLike)):
        return None
    args = [os.fspath(a) if isinstance(a, os.PathLike) else a for a in args]
    if len(args) < 2 or args[0] != sys.executable or not all(isinstance(a, str) for a in args):
        return None
    script = (Path(cwd or ".") / args[1]).resolve()
    if (
        not args[1].endswith(".py")
        or not script.is_file()
        or not any(root in script.parents for root in ROOTS)
    ):
        return None
    return args[1:]


def open_files(fds: List[int]) -> bool:
    """Whether every one of ``fds`` is open (a closed standard stream cannot be sent)."""
    try:
        for fd in fds:
            os.fstat(fd)
    except OSError:
        return False
    return True


def env_fits(env: Dict[str, str], server: Server) -> bool:
    """Whether a process with ``env`` finds what the server's imports read."""
    return import_time_env(env) == server.import_env


class PreloadedPopen(ORIGINAL_POPEN):
    """``subprocess.Popen``; a ``python SCRIPT.py`` process it may start from the preloading server
    starts there (the module's docstring)."""

    def _execute_child(
        self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo, creationflags, shell,
        p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, restore_signals, gid, gids, uid, umask,
        start_new_session, process_group,
    ):  # fmt: skip
        argv = script_argv(args, executable, shell, cwd)
        fds = [p2cread, c2pwrite, errwrite]
        fds = [own if fd == -1 else fd for own, fd in zip((0, 1, 2), fds)]
        usual = (
            preexec_fn is None
            and close_fds
            and not pass_fds
            and restore_signals
            and (gid, gids, uid, process_group) == (None, None, None, -1)
            and umask < 0
        )
        server = Server.get() if argv is not None and usual and open_files(fds) else None
        if server is not None:
            named = dict(
                os.environ if env is None else {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}
            )
        if server is None or any(os.isatty(fd) for fd in fds) or not env_fits(named, server):
            return super()._execute_child(
                args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo, creationflags, shell,
                p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, restore_signals, gid, gids, uid, umask,
                start_new_session, process_group,
            )  # fmt: skip
        cwd = os.path.abspath(os.fspath(cwd)) if cwd is not None else os.getcwd()
        self.pid = server.start(argv, cwd, named, fds, bool(start_new_session))
        self._child_created = True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)


if __name__ == "__main__":
    main()
