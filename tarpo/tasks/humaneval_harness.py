"""The trusted program that checks one HumanEval completion inside the sandbox.

:func:`tarpo.tasks.sandbox.run_humaneval` sends this file's source as the sandbox's ``main.py``,
followed by one line ``main({...})`` that carries the job (prompt, completion, tests, entry
point and a random nonce); the host imports it only for :func:`pass_token`. It uses the
standard library only and runs under the sandbox's ``python -I -S``.

Two processes run inside the sandbox:

* this one, the **test process**, which runs only trusted code: the task's prompt (for its
  helper functions, e.g. ``poly``), the task's tests, and ``check(candidate)``;
* a **candidate process**, a fresh interpreter started from here, which runs the completion
  and answers calls: the tests' ``candidate(*args)`` sends the arguments over a pipe and gets
  back either a value or the name of the exception it raised.

Values cross in a tagged JSON encoding that can express plain data only (``None``, ``bool``,
``int``, ``float``, ``complex``, ``str``, ``bytes``, and ``tuple``, ``list``, ``set``,
``frozenset`` and ``dict`` of those, exact types): an object with its own ``__eq__`` never
reaches the tests. Whatever the completion does to its own process (exit, hooks, signal
handlers, threads, rebound builtins), the tests run elsewhere, with untouched builtins.

The test process proves that every assertion ran by writing a token derived from the
nonce, as the only thing on its standard output, after ``check`` has returned; the host
counts a pass only on that exact token and exit status 0. The nonce exists only in this
process: the script is deleted and the process made non-dumpable (no ptrace, no
``/proc/<pid>/mem``) before the candidate process starts, and that process never receives it.
"""

import hashlib
import json
import os
import subprocess
import sys
import traceback

REPLY_LIMIT = 64 << 20  # bytes of one encoded message

# Plain data as JSON, shared by both processes: scalars as themselves, anything else as
# [tag, items]. `decode` accepts nothing else; the test process trusts only what it decodes.
CODEC = r"""
SCALARS = (type(None), bool, int, float, str)
CONTAINERS = {"tuple": tuple, "list": list, "set": set, "frozenset": frozenset}


def encode(value, depth=0):
    kind = type(value)
    if depth > 100:
        raise ValueError("plain data nested more than 100 deep")
    if kind in SCALARS:
        return value
    if kind is bytes:
        return ["bytes", value.hex()]
    if kind is complex:
        return ["complex", [value.real, value.imag]]
    if kind is dict:
        return ["dict", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
    for tag, container in CONTAINERS.items():
        if kind is container:
            return [tag, [encode(x, depth + 1) for x in value]]
    raise TypeError(f"not plain data (a {kind.__name__})")


def decode(value, depth=0):
    if type(value) in SCALARS:
        return value
    if type(value) is not list or len(value) != 2 or depth > 100:
        raise ValueError("malformed plain data")
    tag, items = value
    if tag == "bytes" and type(items) is str:
        return bytes.fromhex(items)
    if tag == "complex" and type(items) is list and len(items) == 2 and all(type(x) is float for x in items):
        return complex(*items)
    if type(items) is not list:
        raise ValueError("malformed plain data")
    if tag == "dict":
        if not all(type(pair) is list and len(pair) == 2 for pair in items):
            raise ValueError("malformed plain data")
        return {decode(k, depth + 1): decode(v, depth + 1) for k, v in items}
    if tag not in CONTAINERS:
        raise ValueError("malformed plain data")
    return CONTAINERS[tag](decode(x, depth + 1) for x in items)
"""
_codec: dict = {}
exec(CODEC, _codec)
encode, decode = _codec["encode"], _codec["decode"]

# The candidate process: a fresh interpreter (nothing of the test process's memory) that runs
# the completion and answers calls. Requests come on fd 0 and answers go on fd 1, both moved
# aside first: the completion's stdin is /dev/null and its prints go to stderr.
CANDIDATE = CODEC + r"""
import json, os, sys
sys.set_int_max_str_digits(0)
rx, tx = os.dup(0), os.dup(1)
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
os.dup2(2, 1)


def read(n):
    data = b""
    while len(data) < n:
        chunk = os.read(rx, n - len(data))
        if not chunk:
            os._exit(0)
        data += chunk
    return data


def send(message):
    data = json.dumps(message).encode()
    data = len(data).to_bytes(8, "big") + data
    while data:
        data = data[os.write(tx, data):]


def failure(exc):
    try:
        return ["raise", type(exc).__name__, str(exc)[:300]]
    except BaseException:
        return ["raise", "Exception", ""]


source, entry_point = json.loads(read(int.from_bytes(read(8), "big")))
namespace = {"__name__": "__main__"}
try:
    exec(compile(source, "<completion>", "exec"), namespace)
    function = namespace[entry_point]
    send(["ready"])
except BaseException as exc:
    send(failure(exc))
    os._exit(1)
while True:
    args = decode(json.loads(read(int.from_bytes(read(8), "big"))))
    try:
        value = function(*args)
        try:
            value = encode(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"the return value is {exc}") from None
        send(["value", value])
    except BaseException as exc:
        send(failure(exc))
"""


class CandidateError(Exception):
    """The completion raised, returned something that is not plain data, or its process ended."""


class Candidate:
    """The completion's entry point as the tests see it: each call goes to the candidate process."""

    def __init__(self, source: str, entry_point: str):
        self.process = subprocess.Popen([sys.executable, "-I", "-S", "-c", CANDIDATE], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, close_fds=True)
        self._send([source, entry_point])
        reply = self._recv()
        if reply != ["ready"]:
            raise CandidateError(f"the completion did not load: {self._describe(reply)}")

    def __call__(self, *args):
        self._send(encode(args))
        reply = self._recv()
        if type(reply) is list and len(reply) == 2 and reply[0] == "value":
            try:
                return decode(reply[1])
            except (TypeError, ValueError, RecursionError) as exc:
                raise CandidateError(f"bad return value: {exc}") from None
        raise CandidateError(self._describe(reply))

    def close(self):
        self.process.kill()
        self.process.wait()

    def _send(self, message):
        data = json.dumps(message).encode()
        try:
            self.process.stdin.write(len(data).to_bytes(8, "big") + data)
            self.process.stdin.flush()
        except OSError:
            raise CandidateError("the candidate process ended") from None

    def _recv(self):
        header = self.process.stdout.read(8)
        size = int.from_bytes(header, "big")
        if len(header) != 8 or size > REPLY_LIMIT:
            raise CandidateError("the candidate process ended" if len(header) != 8 else "reply too large")
        data = self.process.stdout.read(size)
        if len(data) != size:
            raise CandidateError("the candidate process ended")
        try:
            return json.loads(data)
        except (ValueError, RecursionError):
            raise CandidateError("malformed reply from the candidate process") from None

    @staticmethod
    def _describe(reply):
        if type(reply) is list and len(reply) == 3 and reply[0] == "raise":
            return f"{str(reply[1])[:100]}: {str(reply[2])[:300]}"
        return "malformed reply from the candidate process"


def pass_token(nonce: str) -> str:
    return hashlib.sha256(f"tarpo-humaneval-pass:{nonce}".encode()).hexdigest()


def _non_dumpable():
    """Close this process's memory, fds and environ (ptrace, /proc/<pid>/*) to its own uid."""
    import ctypes
    if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE, 0
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def main(job: dict) -> None:
    """Check ``job`` (program, prompt, test, entry_point, nonce); exit 0 with the token if it passed."""
    os.unlink(os.path.abspath(sys.argv[0]))  # the job, nonce included, is now only in this memory
    if sys.platform == "linux":
        _non_dumpable()  # fails closed: no token without it
    token_out = os.dup(1)  # standard output carries the token only: prints go to stderr
    os.dup2(2, 1)
    sys.set_int_max_str_digits(0)
    nonce = job.pop("nonce")
    candidate, passed = None, False
    try:
        candidate = Candidate(job["program"], job["entry_point"])
        tests = {"__name__": "__tests__"}
        exec(compile(job["prompt"], "<prompt>", "exec"), tests)  # the task's own helpers (poly, encode_cyclic...)
        tests[job["entry_point"]] = candidate  # a test may name the function instead of `candidate`
        tests["candidate"] = candidate
        exec(compile(job["test"], "<tests>", "exec"), tests)
        tests["check"](candidate)
        passed = True  # check returned: every assertion ran and held
    except BaseException:
        traceback.print_exc()
    if candidate is not None:
        candidate.close()
    if passed:
        os.write(token_out, (pass_token(nonce) + "\n").encode())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if passed else 1)
