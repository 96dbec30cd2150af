"""Run untrusted Python (HumanEval completions and their unit tests) in a sandboxed subprocess.

Every run, whatever the isolation level, gets:

* a fresh, empty working directory, removed afterwards;
* the interpreter this process runs (its real binary: outside a virtual environment) as
  ``python -I -S`` (the standard library only: no site-packages, no ``PYTHONPATH``, no script
  folder on ``sys.path``) with a scrubbed environment: only
  ``PATH=/usr/bin:/bin``, ``LANG=C.UTF-8`` and ``HOME=<working directory>``;
* rlimits: address space (``memory_mb``), CPU seconds, processes, file size (``max_file_mb``,
  which also caps the captured stdout/stderr) and no core dumps;
* its own session, a wall-clock ``timeout`` after which it is SIGKILLed, and a final SIGKILL of
  its process group after every run; only the last 2,000 characters of stdout/stderr are kept.

What else is enforced depends on :func:`isolation`, detected once per process:

``namespaces+nobody`` (root, util-linux ``unshare``, ``setpriv`` and ``pivot_root``)
    New network namespace (only a downed loopback: no network at all, no host unix socket
    reachable by address). New pid namespace with its own ``/proc``: host processes are
    invisible, and killing the namespace's init on timeout kills everything inside, including
    children that called ``setsid()``. New mount namespace whose root is an empty read-only
    tmpfs holding only what the interpreter needs (see :func:`view`): ``/usr`` and the other
    system library folders, the interpreter's own installation, ``/etc/ld.so.*``, a ``/dev``
    with ``null``, ``zero``, ``full``, ``random`` and ``urandom`` (those the host has),
    ``/proc``, and fresh private tmpfs on ``/tmp`` and ``/dev/shm``. No project, data sets, home
    folders, ``/run``, ``/work`` or ``/mnt`` exist there; the host's root is unmounted
    (``pivot_root``). The program runs as uid/gid 65534 without supplementary groups, with an
    empty capability bounding set and ``no_new_privs``, so RLIMIT_NPROC is enforced; it counts
    every uid-65534 process of the host, so concurrent runs share that budget (a HumanEval
    check uses two processes).
``userns`` (non-root, unprivileged user namespaces)
    The same namespaces and filesystem view, as root of a new user namespace (the calling user
    on the host) with an empty capability bounding set: no uid drop. RLIMIT_NPROC counts all of
    that user's processes, so it is set to ``max_processes`` above the user's current count.
``rlimits`` (no namespaces)
    Only the guarantees above. The program runs as the calling user (as root, RLIMIT_NPROC is
    not enforced): it can read and write whatever that user can, use the network, and a child
    that calls ``setsid()`` escapes the final kill. Use it only inside an outer sandbox.

HumanEval completions go through :func:`run_humaneval`, which adds a static screen and the
trusted harness of :mod:`tarpo.tasks.humaneval_harness` (docs/humaneval-sandbox.md).
"""

from __future__ import annotations

import ast
import functools
import math
import os
import secrets
import shutil
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import suppress
from dataclasses import dataclass, replace
from pathlib import Path
from resource import RLIMIT_AS, RLIMIT_CORE, RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NPROC, setrlimit

from .humaneval_harness import pass_token

NOBODY = 65534
TAIL_CHARS = 2000
SETUP_FAILED = 125  # exit code of the namespace setup script when it fails before Python starts
PYTHON = os.path.realpath(sys.executable)  # the real interpreter, not a virtual environment's link to it
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")  # top-level folders the view keeps
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d")  # the dynamic loader's configuration
DEVICES = ("null", "zero", "full", "random", "urandom")


@dataclass(frozen=True)
class SandboxResult:
    status: str  # "passed" | "failed" | "timeout" | "error" (the sandbox itself could not start)
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def humaneval_source(prompt: str, code: str, entry_point: str) -> str:
    """The completion as a module: ``code`` alone if it defines the entry point itself, else
    ``prompt + code`` (a function body)."""
    return code if f"def {entry_point}(" in code else prompt + code


def run_humaneval(prompt: str, code: str, test: str, entry_point: str, *, timeout: float = 10.0,
                  memory_mb: int = 1024) -> SandboxResult:
    """Check one HumanEval completion; ``passed`` only if the tests ran to the end and held.

    The completion is screened (:func:`screen`), then run by the trusted harness of
    :mod:`tarpo.tasks.humaneval_harness`: the completion in a process of its own, the tests in
    another, values crossing as plain data only. A pass needs exit status 0 *and*, as the only
    output, a token derived from a nonce that exists only in the tests' process.
    """
    source = humaneval_source(prompt, code, entry_point)
    problem = screen(source)
    if problem:
        return SandboxResult("failed", None, "", f"screened out: {problem}", 0.0)
    nonce = secrets.token_hex(32)
    job = {"prompt": prompt, "program": source, "test": test, "entry_point": entry_point, "nonce": nonce}
    result = run_python(f"{_harness()}\nmain({job!r})\n", timeout=timeout, memory_mb=memory_mb)
    if result.status == "passed" and result.stdout != pass_token(nonce) + "\n":
        return replace(result, status="failed",
                       stderr=result.stderr + "\nsandbox: exit status 0 without the pass token")
    return result


# The static screen, a last layer: what a HumanEval solution never needs and an attack on the
# grader reaches for first (ending or hooking the process, other frames or namespaces, files).
SCREENED_MODULES = {"atexit", "builtins", "ctypes", "faulthandler", "gc", "importlib", "inspect", "io",
                    "multiprocessing", "pathlib", "pty", "signal", "socket", "subprocess", "threading", "_thread"}
SCREENED_CALLS = {"exit", "quit", "open", "breakpoint", "__import__"}  # as names: `open = 0` is fine
SCREENED_NAMES = {"SystemExit", "__builtins__"}
SCREENED_ATTRIBUTES = {"_exit", "exit", "abort", "kill", "killpg", "fork", "forkpty", "system", "popen", "open",
                       "excepthook", "unraisablehook", "setprofile", "settrace", "_getframe", "setitimer", "alarm",
                       "f_back", "f_globals", "f_locals", "f_builtins", "tb_frame", "gi_frame", "cr_frame",
                       "__globals__", "__builtins__", "__code__", "__subclasses__"}
SCREENED_METHODS = {"__eq__", "__ne__"}


def screen(source: str) -> str | None:
    """Why ``source`` is rejected without running (the first reason found), or None.

    It catches only the obvious (``getattr`` with a computed name evades it), so nothing
    relies on it alone: every attack it names also fails without it.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None  # it will fail to compile in the sandbox too
    for node in ast.walk(tree):
        modules = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                   [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        for module in modules:
            if module.split(".")[0] in SCREENED_MODULES:
                return f"imports {module}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in SCREENED_CALLS:
            return f"calls {node.func.id}()"
        if isinstance(node, ast.Name) and node.id in SCREENED_NAMES:
            return f"uses {node.id}"
        if isinstance(node, ast.Attribute) and node.attr in SCREENED_ATTRIBUTES:
            return f"uses .{node.attr}"
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in SCREENED_METHODS:
            return f"defines {node.name}"
    return None


@functools.cache
def _harness() -> str:
    """The harness's source, sent as the sandbox's main.py (it runs there, not here)."""
    return (Path(__file__).parent / "humaneval_harness.py").read_text()


@functools.cache
def isolation() -> str:
    """``"namespaces+nobody"``, ``"userns"`` or ``"rlimits"`` (see the module docstring)."""
    if sys.platform == "linux" and shutil.which("unshare") and shutil.which("setpriv") and _pivot_root():
        for level, uid in (("namespaces+nobody", NOBODY), ("userns", 0)):
            if level == "userns" or os.geteuid() == 0:
                with suppress(Exception):  # the probe must run the very interpreter this process runs
                    probe = _run(level, "import os, sys; print(sys.version, sys.prefix, os.getuid())", timeout=30.0,
                                 memory_mb=1024, max_processes=64, max_file_mb=16, cpu_seconds=None)
                    if probe.passed and probe.stdout.strip() == f"{sys.version} {sys.base_prefix} {uid}":
                        return level
    return "rlimits"


def run_python(program: str, *, timeout: float = 10.0, memory_mb: int = 1024, max_processes: int = 64,
               max_file_mb: int = 16, cpu_seconds: int | None = None) -> SandboxResult:
    """Run ``program`` as a script in the sandbox; ``passed`` means exit code 0 within ``timeout``."""
    return _run(isolation(), program, timeout=timeout, memory_mb=memory_mb, max_processes=max_processes,
                max_file_mb=max_file_mb, cpu_seconds=cpu_seconds)


def _run(level: str, program: str, *, timeout: float, memory_mb: int, max_processes: int, max_file_mb: int,
         cpu_seconds: int | None) -> SandboxResult:
    namespaced = level != "rlimits"
    nproc = max_processes  # RLIMIT_NPROC counts all tasks of the uid: as ourselves, allow that many more
    if level != "namespaces+nobody":
        nproc += sum(threads for _, uid, _, threads in _processes() if uid == os.getuid())
    cpu = cpu_seconds if cpu_seconds is not None else math.ceil(timeout) + 1
    limits = [(RLIMIT_AS, (memory_mb << 20,) * 2), (RLIMIT_NPROC, (nproc, nproc)), (RLIMIT_CPU, (cpu, cpu)),
              (RLIMIT_FSIZE, (max_file_mb << 20,) * 2), (RLIMIT_CORE, (0, 0))]
    workdir = None if namespaced else tempfile.mkdtemp(prefix="tarpo-sandbox-")
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir or "/tmp/work"}
    if namespaced:
        user = ["--user", "--map-root-user"] if level == "userns" else []
        argv = [shutil.which("unshare"), "--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
                *user, "sh", "-c", _script(level == "namespaces+nobody", max_file_mb)]
    else:
        argv = [PYTHON, "-I", "-S", "main.py"]
        with open(os.path.join(workdir, "main.py"), "w") as f:
            f.write(program)
    start, status, returncode = time.monotonic(), "error", None
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=workdir or "/", env=env,
                                    start_new_session=True, preexec_fn=lambda: [setrlimit(*limit) for limit in limits])
            try:
                proc.communicate(program.encode() if namespaced else b"", timeout=timeout)
                returncode = proc.returncode
                setup_failed = namespaced and returncode == SETUP_FAILED
                status = "passed" if returncode == 0 else "error" if setup_failed else "failed"
            except subprocess.TimeoutExpired:
                status = "timeout"
            finally:
                _kill(proc, namespaced)
        except OSError as e:
            err.write(f"sandbox: {e}".encode())
        finally:
            if workdir:
                shutil.rmtree(workdir, ignore_errors=True)
        return SandboxResult(status, returncode, _tail(out), _tail(err), time.monotonic() - start)


def _kill(proc: subprocess.Popen, namespaced: bool) -> None:
    """SIGKILL everything the run started and reap it."""
    if namespaced and proc.poll() is None:
        for pid in [pid for pid, _, ppid, _ in _processes() if ppid == proc.pid]:
            with suppress(ProcessLookupError):  # the pid namespace's init: the kernel kills all inside,
                os.kill(pid, signal.SIGKILL)  # and unshare exits once the namespace is empty
        with suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _processes():
    """``(pid, uid, ppid, threads)`` of every process, from /proc."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with suppress(OSError, IndexError, ValueError), open(f"/proc/{entry}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
            yield int(entry), os.stat(f"/proc/{entry}").st_uid, int(fields[1]), int(fields[17])


def _script(drop_uid: bool, max_file_mb: int) -> str:
    """The shell script run as root of the new namespaces. It builds the filesystem view of
    :func:`view` on a tmpfs, makes it the root (``pivot_root``; the host's root is unmounted),
    saves the program (read from stdin) as /tmp/work/main.py and runs it. It stays the pid
    namespace's init (no ``exec``), so the program can neither signal it nor outlive it."""
    q = shlex.quote
    root = "/tmp"  # the new root: a tmpfs over the host's /tmp, inside this mount namespace only
    symlinks, binds, dev_links = view()
    folders = [p for p in binds if os.path.isdir(p)] + ["/proc", "/tmp", "/dev/shm", "/old"]
    folders += sorted({os.path.dirname(p) for p in binds if p not in folders})
    files = [p for p in binds if p not in folders]
    steps = [f"mount -t tmpfs -o size=1m,mode=755 tmpfs {root}", "mkdir -p " + " ".join(root + q(p) for p in folders)]
    steps += ["touch " + " ".join(root + q(p) for p in files)] if files else []
    steps += [f"ln -s {q(target)} {root}{q(link)}" for link, target in symlinks]
    steps += [f"ln -s {q(target)} {root}/dev/{name}" for name, target in dev_links]
    for path in binds:
        steps.append(f"mount --bind {q(path)} {root}{q(path)}")
        if not path.startswith("/dev/"):  # device nodes ignore read-only mounts; all else is read-only
            steps.append(f"mount -o remount,bind,ro,nosuid {root}{q(path)}")
    steps += [f"mount --rbind /proc {root}/proc",  # this pid namespace's /proc (unshare --mount-proc)
              f"cd {root}", f"{q(_pivot_root())} . old", "umount -l /old", "rmdir /old", "cd /",
              "mount -o remount,ro /"]
    steps += [f"mount -t tmpfs -o size={max_file_mb}m,nr_inodes=4096,mode=1777,nosuid,nodev tmpfs {d}"
              for d in ("/tmp", "/dev/shm")]
    steps += ["mkdir /tmp/work", "cat > /tmp/work/main.py", "cd /tmp/work", "unset PWD OLDPWD"]
    if drop_uid:
        steps.append(f"chown -R {NOBODY}:{NOBODY} /tmp/work")
    drop = f"--reuid={NOBODY} --regid={NOBODY} --clear-groups " if drop_uid else ""
    return (" &&\n".join(steps) + f" || exit {SETUP_FAILED}\n"
            f"setpriv {drop}--bounding-set=-all --inh-caps=-all --no-new-privs {q(PYTHON)} -I -S main.py "
            "</dev/null\nexit $?\n")


def _pivot_root() -> str | None:
    return shutil.which("pivot_root", path="/usr/sbin:/sbin:/usr/bin:/bin")


def view() -> tuple[list[tuple[str, str]], list[str], list[tuple[str, str]]]:
    """What the sandbox's filesystem holds: ``(symlinks, binds, dev_links)``.

    ``symlinks`` are the top-level system folders that are links (``/bin -> usr/bin``),
    ``binds`` the host paths mounted at the same place (the system library folders, the
    loader's configuration in ``/etc``, the interpreter's installation, a few devices), and
    ``dev_links`` the links ``/dev/fd``, ``/dev/stdin``... Nothing else of the host exists.
    """
    symlinks, binds = [], []
    for name in SYSTEM_DIRS:
        path = f"/{name}"
        if os.path.islink(path):
            symlinks.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            binds.append(path)
    binds += [f"/etc/{name}" for name in ETC_FILES if os.path.exists(f"/etc/{name}")]
    install = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(PYTHON))}
    for path in sorted(install):
        covered = any(path == b or path.startswith(b.rstrip("/") + "/") for b in binds + list(install - {path}))
        if not covered:
            binds.append(path)
    binds += [f"/dev/{name}" for name in DEVICES if os.path.exists(f"/dev/{name}")]
    dev_links = [("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                 ("stderr", "/proc/self/fd/2")]
    return symlinks, binds, dev_links


def _tail(f) -> str:
    f.seek(0, os.SEEK_END)
    f.seek(max(0, f.tell() - 4 * TAIL_CHARS))
    return f.read().decode("utf-8", "replace")[-TAIL_CHARS:]
