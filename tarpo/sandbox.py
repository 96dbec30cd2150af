"""Run untrusted Python (HumanEval completions and their unit tests) in a sandboxed subprocess.

Every run, whatever the isolation level, gets:

* a fresh, empty working directory, removed afterwards;
* ``python -I`` (no user site-packages, no ``PYTHONPATH``) with a scrubbed environment: only
  ``PATH=/usr/bin:/bin``, ``LANG=C.UTF-8`` and ``HOME=<working directory>``;
* rlimits: address space (``memory_mb``), CPU seconds, processes, file size (``max_file_mb``,
  which also caps the captured stdout/stderr) and no core dumps;
* its own session, a wall-clock ``timeout`` after which it is SIGKILLed, and a final SIGKILL of
  its process group after every run; only the last 2,000 characters of stdout/stderr are kept.

What else is enforced depends on :func:`isolation`, detected once per process:

``namespaces+nobody`` (root, util-linux ``unshare`` and ``setpriv``)
    New network namespace (only a downed loopback: no network at all). New pid namespace with
    its own ``/proc``: host processes are invisible, and killing the namespace's init on timeout
    kills everything inside, including children that called ``setsid()``. New mount namespace in
    which every mount is read-only except fresh private tmpfs on ``/tmp``, ``/var/tmp`` and
    ``/dev/shm``. The program runs as uid/gid 65534 without supplementary groups and with
    ``no_new_privs``, so RLIMIT_NPROC is enforced; it counts every uid-65534 process of the
    host, so concurrent runs share that budget. Directories on the interpreter's path that
    uid 65534 could not enter (e.g. ``/root``) are replaced, inside the namespace only, by an
    empty tmpfs on which just the interpreter's own directories are mounted back.
``userns`` (non-root, unprivileged user namespaces)
    The same namespaces and read-only mounts, as root of a new user namespace, i.e. as the
    calling user on the host: no uid drop. RLIMIT_NPROC counts all of that user's processes,
    so it is set to ``max_processes`` above the user's current count.
``rlimits`` (no namespaces)
    Only the guarantees above. The program runs as the calling user (as root, RLIMIT_NPROC is
    not enforced): it can read and write whatever that user can, use the network, and a child
    that calls ``setsid()`` escapes the final kill. Use it only inside an outer sandbox.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import shlex
import signal
import stat
import subprocess
import sys
import tempfile
import time
from contextlib import suppress
from dataclasses import dataclass
from resource import RLIMIT_AS, RLIMIT_CORE, RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NPROC, setrlimit

NOBODY = 65534
TAIL_CHARS = 2000
SETUP_FAILED = 125  # exit code of the namespace setup script when it fails before Python starts
# Remount every mount read-only inside the mount namespace (one that refuses stays as it was).
_READ_ONLY = ("{ awk '{print $2}' /proc/self/mounts | while read -r m; do mount -o remount,bind,ro \"$m\"; done; "
              "true; } 2>/dev/null")


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


def humaneval_program(prompt: str, code: str, test: str, entry_point: str) -> str:
    """The program that checks one completion: ``code`` alone if it defines the entry point
    itself, else ``prompt + code`` (a function body), then the tests and ``check(...)``."""
    body = code if f"def {entry_point}(" in code else prompt + code
    return f"{body}\n\n{test}\n\ncheck({entry_point})\n"


@functools.cache
def isolation() -> str:
    """``"namespaces+nobody"``, ``"userns"`` or ``"rlimits"`` (see the module docstring)."""
    if sys.platform == "linux" and shutil.which("unshare") and shutil.which("setpriv"):
        for level, uid in (("namespaces+nobody", NOBODY), ("userns", 0)):
            if level == "userns" or os.geteuid() == 0:
                with suppress(Exception):  # the probe must run the very interpreter this process runs
                    probe = _run(level, "import os, sys; print(sys.version, sys.prefix, os.getuid())", timeout=30.0,
                                 memory_mb=1024, max_processes=64, max_file_mb=16, cpu_seconds=None)
                    if probe.passed and probe.stdout.strip() == f"{sys.version} {sys.prefix} {uid}":
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
        argv = [sys.executable, "-I", "main.py"]
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
    """The shell script run as root of the new namespaces. It mounts, saves the program (read
    from stdin) as /tmp/work/main.py and runs it; it stays the pid namespace's init (no ``exec``),
    so the program can neither signal it nor outlive it."""
    q = shlex.quote
    covers, exposes = _hidden() if drop_uid else ([], [])
    steps = ["mount -t tmpfs -o size=1m,mode=700 tmpfs /tmp"]  # scratch, covered by the final /tmp
    steps += [f"mkdir /tmp/{i} && mount --bind {q(x)} /tmp/{i}" for i, x in enumerate(exposes)]
    steps += [f"mount -t tmpfs -o size=1m,mode=711 tmpfs {q(c)}" for c in covers]
    steps += [f"mkdir -p {q(x)} && mount --bind /tmp/{i} {q(x)}" for i, x in enumerate(exposes)]
    steps.append(_READ_ONLY)
    steps += [f"mount -t tmpfs -o size={max_file_mb}m,nr_inodes=4096,mode=1777,nosuid,nodev tmpfs {d}"
              for d in ("/tmp", "/var/tmp", "/dev/shm") if os.path.isdir(d)]
    steps += ["mkdir /tmp/work", "cat > /tmp/work/main.py", "cd /tmp/work", "unset PWD OLDPWD"]
    if drop_uid:
        steps.append(f"chown -R {NOBODY}:{NOBODY} /tmp/work")
    drop = f"--reuid={NOBODY} --regid={NOBODY} --clear-groups " if drop_uid else ""
    return (" &&\n".join(steps) + f" || exit {SETUP_FAILED}\n"
            f"setpriv {drop}--no-new-privs {q(sys.executable)} -I main.py </dev/null\nexit $?\n")


def _hidden() -> tuple[list[str], list[str]]:
    """Where the interpreter sits below a directory that uid 65534 cannot enter (e.g. ``/root``):
    the outermost such directories, to cover with an empty tmpfs, and the interpreter's own
    directories below them, to mount back. Nothing else of the covered directories is visible."""
    covers, exposes = set(), set()
    for path in {os.path.dirname(os.path.realpath(sys.executable)), sys.prefix, sys.base_prefix}:
        path = os.path.realpath(path)
        parts = path.split("/")
        ancestors = ["/".join(parts[:i]) for i in range(2, len(parts))]
        blocked = [d for d in ancestors if not os.stat(d).st_mode & stat.S_IXOTH]
        if blocked:
            covers.add(blocked[0])
            exposes.add(path)
    return sorted(covers), sorted(x for x in exposes if not any(x.startswith(y + "/") for y in exposes))


def _tail(f) -> str:
    f.seek(0, os.SEEK_END)
    f.seek(max(0, f.tell() - 4 * TAIL_CHARS))
    return f.read().decode("utf-8", "replace")[-TAIL_CHARS:]
