"""The sandbox really contains hostile programs (these tests run real subprocesses)."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

import pytest

from tarpo.tasks import sandbox
from tarpo.tasks.sandbox import humaneval_source, isolation, run_humaneval, run_python

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox targets Linux")
MARGIN = 5.0  # seconds allowed beyond the timeout for start-up and clean-up


def nobody_pids():
    pids = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{entry}").st_uid == sandbox.NOBODY:
                pids.add(int(entry))
        except OSError:
            pass
    return pids


@pytest.fixture
def no_leftovers():
    """Fails the test if a process of uid 65534 started during it is still alive afterwards."""
    before = nobody_pids()
    yield
    assert nobody_pids() - before == set()


def test_isolation_level():
    level = isolation()
    assert level in ("namespaces+nobody", "userns", "rlimits")
    if os.geteuid() != 0:
        pytest.skip("'namespaces+nobody' needs root; this process is not root")
    assert level == "namespaces+nobody"


def test_passing_program():
    result = run_python("print(sum(range(10)))")
    assert (result.status, result.returncode, result.stdout) == ("passed", 0, "45\n")
    assert result.passed


def test_assertion_failure():
    result = run_python("assert 1 + 1 == 3, 'bad math'")
    assert result.status == "failed" and not result.passed
    assert "AssertionError: bad math" in result.stderr


def test_syntax_error():
    result = run_python("def f(:\n    pass")
    assert result.status == "failed"
    assert "SyntaxError" in result.stderr


def test_fresh_workdir_and_scrubbed_env():
    probe = "import os; print(sorted(os.listdir('.')), sorted(os.environ))\nopen('left.txt', 'w').write('x')"
    first, second = run_python(probe), run_python(probe)
    assert first.stdout == second.stdout == "['main.py'] ['HOME', 'LANG', 'PATH']\n"


def test_humaneval_program():
    prompt = 'def add(a, b):\n    """Add."""\n'
    test = "def check(candidate):\n    assert candidate(2, 3) == 5\n"
    assert humaneval_source(prompt, "    return a + b\n", "add").startswith(prompt)
    assert humaneval_source(prompt, "def add(a, b):\n    return a + b\n", "add").startswith("def add")
    body = run_humaneval(prompt, "    return a + b\n", test, "add")
    full = run_humaneval(prompt, "def add(a, b):\n    return a + b\n", test, "add")
    assert body.passed and full.passed, (body, full)
    assert len(body.stdout.strip()) == 64 and body.stdout != full.stdout  # a fresh token per run
    wrong = run_humaneval(prompt, "    return a - b\n", test, "add")
    assert wrong.status == "failed" and "AssertionError" in wrong.stderr
    assert run_humaneval(prompt, "    return a +\n", test, "add").status == "failed"  # a syntax error


def test_fork_bomb(no_leftovers):
    start = time.monotonic()
    result = run_python("import os\nwhile True: os.fork()", timeout=3)
    assert result.status in ("failed", "timeout")
    assert time.monotonic() - start < 3 + MARGIN


def test_memory_bomb():
    result = run_python("x = bytearray(8 * 1024**3)", memory_mb=512)
    assert result.status == "failed"
    assert "MemoryError" in result.stderr


def test_infinite_loop():
    start = time.monotonic()
    result = run_python("while True: pass", timeout=2)
    elapsed = time.monotonic() - start
    assert result.status == "timeout" and result.returncode is None
    assert 2 <= elapsed < 2 + MARGIN


def test_escaped_sleeper_is_killed(no_leftovers):
    """A child that leaves the process group (setsid) and sleeps must not outlive the run."""
    if isolation() == "rlimits":
        pytest.skip("without a pid namespace a setsid() child escapes (documented)")
    program = "import os, time\nif os.fork() == 0:\n    os.setsid()\ntime.sleep(60)"
    start = time.monotonic()
    assert run_python(program, timeout=2).status == "timeout"
    assert time.monotonic() - start < 2 + MARGIN
    daemon = "import os, time\nif os.fork() == 0:\n    os.setsid(); time.sleep(60)"
    assert run_python(daemon).status == "passed"


def test_writes_outside_workdir(tmp_path):
    name = f"tarpo-sandbox-{uuid.uuid4().hex}"
    targets = [str(tmp_path / name), f"/work/main/{name}", f"/tmp/{name}"]
    program = textwrap.dedent(f"""
        for path in {targets!r}:
            try:
                with open(path, "w") as f:
                    f.write("pwned")
                print(path, "written")
            except OSError as e:
                print(path, type(e).__name__, e)
    """)
    result = run_python(program)
    try:
        assert result.status == "passed", result.stderr
        for path in targets:
            assert path in result.stdout
            assert not os.path.exists(path), f"sandbox wrote {path}: {result.stdout}"
    finally:
        for path in targets:
            if os.path.exists(path):
                os.remove(path)


def test_environment_secret(monkeypatch):
    monkeypatch.setenv("TARPO_TEST_SECRET", "s3cret")
    program = textwrap.dedent("""
        import os
        for pid in ["1", "self", str(os.getppid())] + [p for p in os.listdir("/proc") if p.isdigit()]:
            try:
                environ = open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
                if not pid.isdigit() or int(pid) <= 1 or "TARPO_TEST_SECRET" in environ:  # keep output short
                    print(pid, environ)
            except OSError as e:
                if not pid.isdigit() or int(pid) <= 1:
                    print(pid, type(e).__name__)
        print("env:", os.environ.get("TARPO_TEST_SECRET"))
    """)
    # os.environ changes do not show in /proc/<pid>/environ; a process started with the secret does
    holder = subprocess.Popen(["sleep", "30"], env=dict(os.environ))
    try:
        result = run_python(program)
    finally:
        holder.kill()
        holder.wait()
    assert result.status == "passed", result.stderr
    assert "env: None" in result.stdout
    assert "s3cret" not in result.stdout


def test_no_network():
    if isolation() == "rlimits":
        pytest.skip("the rlimits fallback has no network namespace")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(1.0)
        port = server.getsockname()[1]
        program = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\ns.sendall(b'hi')"
        result = run_python(program, timeout=5)
        with pytest.raises(socket.timeout):
            server.accept()
    assert result.status == "failed"
    assert "OSError" in result.stderr or "Error" in result.stderr


def test_filesystem_view_holds_only_what_python_needs(tmp_path):
    """No project, no data sets, no home, no /run or /work: the system folders, the
    interpreter's installation, the loader's configuration, a few devices and scratch space."""
    if isolation() == "rlimits":
        pytest.skip("the rlimits fallback sees the host's filesystem (documented)")
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    os.chmod(tmp_path, 0o755)
    os.chmod(secret, 0o644)
    project = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    probes = [project, os.path.join(project, "tarpo", "sandbox.py"), str(secret), "/run", "/work", "/home", "/mnt",
              "/opt", "/srv", "/var", "/sys", "/etc/passwd", "/etc/hostname"]
    install = os.path.realpath(sys.base_prefix)
    home = os.path.expanduser("~")  # it may hold the interpreter (pyenv): then only that path shows
    probes += [home] if not install.startswith(home + "/") else [
        os.path.join(home, name) for name in os.listdir(home)
        if not install.startswith(os.path.join(home, name) + "/")]
    program = textwrap.dedent(f"""
        import json, os, hashlib, math
        print(json.dumps({{"root": sorted(os.listdir("/")), "etc": sorted(os.listdir("/etc")),
                          "dev": sorted(os.listdir("/dev")), "seen": [p for p in {probes!r} if os.path.lexists(p)]}}))
    """)
    result = run_python(program)
    assert result.passed, result.stderr
    seen = json.loads(result.stdout)
    assert seen["seen"] == []
    install_top = {os.path.realpath(sys.base_prefix).split("/")[1]}
    assert set(seen["root"]) <= {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "dev", "proc",
                                 "tmp"} | install_top
    assert set(seen["etc"]) <= {"ld.so.cache", "ld.so.conf", "ld.so.conf.d"}
    assert set(seen["dev"]) <= {"null", "zero", "full", "random", "urandom", "fd", "stdin", "stdout", "stderr", "shm"}


def test_no_host_unix_socket(tmp_path):
    """A world-writable unix socket of the host (under /run, where one was reachable) is not."""
    if isolation() == "rlimits":
        pytest.skip("the rlimits fallback sees the host's filesystem (documented)")
    folder = tempfile.mkdtemp(prefix="tarpo-test-", dir="/run" if os.access("/run", os.W_OK) else tmp_path)
    path = os.path.join(folder, "s.sock")
    try:
        os.chmod(folder, 0o777)
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(path)
            os.chmod(path, 0o777)
            server.listen(1)
            server.settimeout(1.0)
            program = f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({path!r})\ns.sendall(b'hi')"
            result = run_python(program, timeout=5)
            with pytest.raises(socket.timeout):
                server.accept()
        assert result.status == "failed" and "FileNotFoundError" in result.stderr, result.stderr
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_screen():
    screened = ["import os\nos._exit(0)", "raise SystemExit(0)", "import sys\nsys.exit(0)", "exit(0)",
                "import atexit", "import signal", "from threading import Thread", "import sys\nsys.excepthook = 1",
                "import sys\nsys.setprofile(print)", "import sys\nsys.settrace(print)", "import builtins",
                "__builtins__['abs'] = 1", "import sys\nsys._getframe(1).f_back", "open('/etc/passwd')",
                "class A:\n    def __eq__(self, other):\n        return True", "import ctypes", "import gc"]
    honest = ["import sys\nx = sys.maxsize", "open = 0\nopen += 1", "import math\nmath.isclose(1, 1)",
              "eval('1 + 2')", "def f(x):\n    return sorted(set(x))", "def f(:"]
    assert [code for code in screened if sandbox.screen(code) is None] == []
    assert [(code, sandbox.screen(code)) for code in honest if sandbox.screen(code)] == []


def test_unbounded_output():
    start = time.monotonic()
    result = run_python("while True: print('x' * 1000)", timeout=5, max_file_mb=4)
    assert result.status in ("failed", "timeout")
    assert len(result.stdout) <= 2000 and len(result.stderr) <= 2000
    assert time.monotonic() - start < 5 + MARGIN


def test_rlimits_fallback(monkeypatch):
    """The last-resort level still limits time, memory and output, and cleans its directory."""
    monkeypatch.setattr(sandbox, "isolation", lambda: "rlimits")
    result = run_python("import os; print(os.getcwd())")
    assert result.passed and not os.path.exists(result.stdout.strip())
    assert run_python("while True: pass", timeout=1).status == "timeout"
    assert run_python("x = bytearray(8 * 1024**3)", memory_mb=512).status == "failed"


def test_setup_failure_is_an_error(monkeypatch):
    if isolation() == "rlimits":
        pytest.skip("only the namespace levels run a setup script")
    monkeypatch.setattr(sandbox, "_script", lambda *args: "mount -t nosuchfs none /tmp || exit 125")
    result = run_python("print('never runs')")
    assert (result.status, result.returncode, result.stdout) == ("error", 125, "")
    assert "mount" in result.stderr
