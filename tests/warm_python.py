"""A warm Python for the tests that run Python scripts in processes of their own (the
device scripts' dry runs, the examples): each call starts in milliseconds instead of
seconds.

A dry run calls the interpreter about 15 times, and each cold start spends 3-4 s of CPU
importing torch (with torch._dynamo, which an optimizer's constructor imports), numba and
matplotlib before the step's own work of a second or two. Here one server process imports
those once; every call of the wrapper script (``PYTHON``) is a small client that hands its
argument list, environment, working directory and standard streams to the server, which
forks a child to run them as ``python`` would, and exits with the child's status.

What a step runs is unchanged: the repository's modules (offrecomp, scheduler, the
benchmarks) are imported by each child from its own ``PYTHONPATH`` and working directory,
after its environment is in place, so environment variables they read apply as in a cold
start; only the third-party modules above are imported beforehand, under the environment
the server started with. The objects they made are frozen (gc.freeze) before each fork,
so a child's ``gc.collect()`` walks its own objects only. A signal the client gets
(``timeout`` sends SIGTERM) goes on to the child. A form the server does not take (any
option but ``-c`` and ``-m``), or no server to reach, runs the cold interpreter instead.

Usage: ``python warm_python.py serve SOCKET`` (prints ``ready`` once it listens), and
``python -I -S warm_python.py client SOCKET ARGS...`` for one call (``write_wrapper``).
Stdlib only: the client runs with ``-I -S``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import sys

_LEN = struct.Struct("!q")
#: What a cold start of a step imports first, in this order (those installed).
PRELOAD = ("torch", "torch._dynamo", "numpy", "numba", "matplotlib.pyplot")


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


# ------------------------------------------------------------------------------ client


def client(sock_path: str, args: list[str]) -> int:
    if not _takes(args):
        os.execv(sys.executable, [sys.executable, *args])
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(sock_path)
    except OSError:
        os.execv(sys.executable, [sys.executable, *args])
    request = json.dumps({"args": args, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    socket.send_fds(conn, [_LEN.pack(len(request))], [0, 1, 2])
    conn.sendall(request)
    (pid,) = _LEN.unpack(_recv_exact(conn, _LEN.size))

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, forward)
    try:
        (code,) = _LEN.unpack(_recv_exact(conn, _LEN.size))
    except EOFError:  # the server went away mid-run
        return 1
    if code < 0:  # the child died of a signal: so does this process, for the caller to see
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code  # a signal this process does not die of
    return code


def _takes(args: list[str]) -> bool:
    """Whether ``args`` is a form the server runs: ``-c CODE ...``, ``-m MODULE ...`` or
    ``SCRIPT ...``."""
    if not args:
        return False
    if args[0] in ("-c", "-m"):
        return len(args) >= 2
    return not args[0].startswith("-")


# ------------------------------------------------------------------------------ server


def serve(sock_path: str) -> None:
    import gc
    import importlib.util

    for name in PRELOAD:
        if importlib.util.find_spec(name.partition(".")[0]) is not None:
            __import__(name)
    base_path = list(sys.path)  # run with -I: the standard library and site-packages only
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(16)
    srv.settimeout(1.0)
    parent = os.getppid()
    print("ready", flush=True)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nobody reads the pipe past that line
    while os.getppid() == parent:  # ends with the process that started it
        _reap()
        try:
            conn, _ = srv.accept()
        except TimeoutError:
            continue
        gc.freeze()
        if os.fork() == 0:
            srv.close()
            code = 1
            try:
                _handle(conn, base_path)
                code = 0
            finally:
                os._exit(code)
        conn.close()
    _reap()


def _reap() -> None:
    """Collect the calls that ended (their CPU time then counts as this process's)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _handle(conn: socket.socket, base_path: list[str]) -> None:
    """In a fork of the server: run one request in a fork of this process, send its pid,
    then its exit status (``-N`` for signal N)."""
    conn.settimeout(None)
    head, fds, _flags, _addr = socket.recv_fds(conn, _LEN.size, 3)
    (n,) = _LEN.unpack(head)
    request = json.loads(_recv_exact(conn, n))
    pid = os.fork()
    if pid == 0:
        conn.close()
        _run(request, fds, base_path)  # never returns
    for fd in fds:
        os.close(fd)
    conn.sendall(_LEN.pack(pid))
    _, status = os.waitpid(pid, 0)
    conn.sendall(_LEN.pack(os.waitstatus_to_exitcode(status)))


def _run(request: dict, fds: list[int], base_path: list[str]) -> None:
    """Run ``python ARGS`` in this process, then exit with its status."""
    import atexit
    import builtins
    import io
    import runpy
    import threading
    import types

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    for fd, name in ((1, "stdout"), (2, "stderr")):
        raw = io.FileIO(fd, "w", closefd=False)
        wrapper = io.TextIOWrapper(
            raw if unbuffered else io.BufferedWriter(raw),
            errors="backslashreplace" if fd == 2 else None,
            line_buffering=fd == 2 and not unbuffered,
            write_through=unbuffered,
        )
        setattr(sys, name, wrapper)
        setattr(sys, f"__{name}__", wrapper)
    pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    args = request["args"]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    code = 0
    try:
        if args[0] == "-m":
            sys.argv = ["-m", *args[2:]]
            sys.path[:] = [os.getcwd(), *pythonpath, *base_path]
            runpy._run_module_as_main(args[1])  # type: ignore[attr-defined]  # what -m runs
        else:
            if args[0] == "-c":
                sys.argv = ["-c", *args[2:]]
                sys.path[:] = ["", *pythonpath, *base_path]
                source, filename = args[1], "<string>"
            else:
                sys.argv = list(args)
                sys.path[:] = [os.path.dirname(os.path.abspath(args[0])), *pythonpath, *base_path]
                with open(args[0], "rb") as f:
                    source, filename = f.read(), args[0]
                main.__file__ = args[0]
            exec(compile(source, filename, "exec"), main.__dict__)
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException as e:
        tb = e.__traceback__
        sys.excepthook(type(e), e, tb.tb_next if tb is not None else tb)  # from the code run on
        code = 1
    finally:
        threading._shutdown()  # type: ignore[attr-defined]  # as the interpreter at exit
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed pipe: nothing more to say
                stream.flush()
        os._exit(code & 0xFF)


def write_wrapper(path: str, sock_path: str) -> str:
    """Write an executable ``python`` at ``path`` that runs through the server at
    ``sock_path``; returns ``path``."""
    import shlex

    cmd = [sys.executable, "-I", "-S", os.path.abspath(__file__), "client", sock_path]
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\nexec {" ".join(shlex.quote(c) for c in cmd)} "$@"\n')
    os.chmod(path, 0o755)
    return path


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        sys.exit(client(sys.argv[2], sys.argv[3:]))
