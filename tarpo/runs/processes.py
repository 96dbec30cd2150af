"""The processes of a launcher run: which one this is, the ``accelerate launch`` command that starts several, the
check that the machine has a device for each, and waiting for them (with the signals a scheduler sends passed on).

With ``NUM_PROCESSES`` > 1 or an ``ACCELERATE_CONFIG``, the launcher's first process (the starter) trains nothing:
it runs :func:`training_command` and waits (:func:`run_command`). A stop signal (``SAVE_ON_SIGNALS``: SIGTERM and
SIGUSR1 by default) is passed to the training processes themselves, not to ``accelerate launch``: torch's elastic
agent, which ``accelerate launch`` runs, answers SIGTERM by killing its workers 30 s later, before a step of the
paper's size can end; the workers finish their step, save a checkpoint together and stop
(tarpo.training.preemption). Other signals (SIGINT, SIGHUP) go to ``accelerate launch`` as before.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys

from .launch_config import LaunchConfig

LAUNCHED = "TARPO_LAUNCHED"  # "1" in the processes that accelerate launch starts for a launcher run
WORKER = "tarpo.runs.launch"  # the module a training process runs


def accelerate_settings(path: str) -> tuple[int, int, str | None]:
    """``(num_processes, num_machines, sharding)`` of an accelerate config file: its process and machine
    counts (1 where it leaves them open) and ``"fsdp2"`` when it shards the parameters with FSDP2 (None: data
    parallel). A file that
    accelerate cannot read, FSDP1 and DeepSpeed ZeRO-3 raise ``ValueError`` naming ACCELERATE_CONFIG."""
    if not os.path.isfile(path):
        raise ValueError(f"ACCELERATE_CONFIG={path}: no such file")
    from accelerate.commands.config.config_args import load_config_from_file
    try:
        config = load_config_from_file(path)
    except Exception as exc:  # YAML/JSON syntax, unknown keys, a bad value: whatever accelerate would fail on
        raise ValueError(f"ACCELERATE_CONFIG={path}: not an accelerate config file ({exc})") from None
    n = getattr(config, "num_processes", 1)
    kind = str(getattr(config, "distributed_type", "")).rsplit(".", 1)[-1]
    sharding = None
    if kind == "FSDP":
        if int((getattr(config, "fsdp_config", None) or {}).get("fsdp_version", 1)) != 2:
            raise ValueError(f"ACCELERATE_CONFIG={path}: FSDP version 1; TARPO shards with FSDP2: set "
                             "fsdp_config.fsdp_version: 2 (configs/fsdp2.yaml, docs/several-gpus.md)")
        sharding = "fsdp2"
    if kind == "DEEPSPEED" and int((getattr(config, "deepspeed_config", None) or {}).get("zero_stage", 0)) == 3:
        raise ValueError(f"ACCELERATE_CONFIG={path}: DeepSpeed ZeRO-3; TARPO shards with FSDP2 "
                         "(configs/fsdp2.yaml, docs/several-gpus.md)")
    m = getattr(config, "num_machines", 1)
    return (n if isinstance(n, int) and n >= 1 else 1), (m if isinstance(m, int) and m >= 1 else 1), sharding


def machines(s: dict, processes: int, configured: int = 1) -> dict:
    """The multi-node settings ``accelerate launch`` gets (NUM_MACHINES, MACHINE_RANK, MAIN_PROCESS_IP,
    MAIN_PROCESS_PORT), checked: NUM_PROCESSES counts the processes of every machine together. ``configured``:
    the ACCELERATE_CONFIG's num_machines, used where NUM_MACHINES is not set.

    >>> machines({"NUM_MACHINES": 2, "MACHINE_RANK": 1, "MAIN_PROCESS_IP": "10.0.0.1"}, 16)["machine_rank"]
    1
    """
    n = s.get("NUM_MACHINES", configured)
    rank, ip, port = s.get("MACHINE_RANK", 0), s.get("MAIN_PROCESS_IP"), s.get("MAIN_PROCESS_PORT")
    if n < 1:
        raise ValueError(f"NUM_MACHINES={n}: must be >= 1")
    if not 0 <= rank < n:
        raise ValueError(f"MACHINE_RANK={rank}: must be 0 .. NUM_MACHINES-1 = {n - 1} (0 on the main machine)")
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"MAIN_PROCESS_PORT={port}: must be a port number, 1 .. 65535")
    if n > 1 and "NUM_MACHINES" in s:  # a config file's machines are its own business
        if not ip:
            raise ValueError(f"NUM_MACHINES={n}: set MAIN_PROCESS_IP to the address of the machine with "
                             "MACHINE_RANK=0")
        if processes % n:
            raise ValueError(f"NUM_PROCESSES={processes}: the processes of all {n} machines together "
                             f"(NUM_MACHINES={n}), so a multiple of NUM_MACHINES")
    return {"num_machines": n, "machine_rank": rank, "main_process_ip": ip, "main_process_port": port}


def process_rank() -> int:
    """This process's rank among the processes of the run (RANK, else LOCAL_RANK, as ``accelerate
    launch`` sets them); 0 when it runs alone. Rank 0 is the main process."""
    return int(os.environ.get("RANK") or os.environ.get("LOCAL_RANK") or 0)


def first_on_machine() -> bool:
    """Whether this process is its machine's first (``LOCAL_RANK`` 0, or alone): the one that writes what each
    machine's launcher reads in its own run folder (the preemption marker)."""
    return int(os.environ.get("LOCAL_RANK") or 0) == 0


def accelerate_prefix(cfg: LaunchConfig) -> list[str] | None:
    """The ``accelerate launch`` command line, up to the module it runs, that starts the run's
    processes; None for one plain process (NUM_PROCESSES=1 and no ACCELERATE_CONFIG).

    >>> from tarpo.runs.presets import resolve
    >>> accelerate_prefix(resolve("math", {"NUM_PROCESSES": "2"}))[1:]
    ['-m', 'accelerate.commands.launch', '--num_processes', '2', '--multi_gpu']
    >>> accelerate_prefix(resolve("math", {})) is None
    True
    >>> two = resolve("math", {"NUM_PROCESSES": "16", "NUM_MACHINES": "2", "MACHINE_RANK": "1",
    ...                        "MAIN_PROCESS_IP": "10.0.0.1", "MAIN_PROCESS_PORT": "29500"})
    >>> " ".join(accelerate_prefix(two)[5:])
    '--multi_gpu --num_machines 2 --machine_rank 1 --main_process_ip 10.0.0.1 --main_process_port 29500'
    """
    n, config = cfg.num_processes, cfg.accelerate_config
    if n == 1 and config is None:
        return None
    nodes = []  # NUM_MACHINES, MACHINE_RANK, MAIN_PROCESS_IP, MAIN_PROCESS_PORT (:func:`machines`)
    if cfg.num_machines > 1 and cfg.main_process_ip:  # else the config file's own
        nodes = ["--num_machines", str(cfg.num_machines), "--machine_rank", str(cfg.machine_rank),
                 "--main_process_ip", cfg.main_process_ip]
    if cfg.main_process_port is not None:
        nodes += ["--main_process_port", str(cfg.main_process_port)]
    return [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(n),
            *(["--config_file", config] if config else ["--multi_gpu"]), *nodes]


def training_command(cfg: LaunchConfig) -> list[str] | None:
    """The command that trains with several processes (None: this process trains)."""
    prefix = accelerate_prefix(cfg)
    return None if prefix is None else [*prefix, "-m", "tarpo.runs.launch", cfg.dataset]


def check_processes(cfg: LaunchConfig, devices: int, cpu: bool) -> None:
    """Several processes need a CUDA device each (``devices``: this machine's count), or ``cpu``
    (ACCELERATE_USE_CPU=true), which runs them on the CPU talking over gloo (tests, CI)."""
    total, machines = cfg.num_processes, cfg.num_machines
    n = total // machines  # this machine's processes
    if total == 1 or cpu:
        return
    if devices == 0:
        raise ValueError(f"NUM_PROCESSES={total}: no CUDA device on this machine to run {n} processes on. Set "
                         "NUM_PROCESSES=1, or ACCELERATE_USE_CPU=true to run the processes on the CPU "
                         "(gloo; for tests, with a tiny local MODEL)")
    if n > devices:
        each = f" (NUM_PROCESSES={total} over NUM_MACHINES={machines})" if machines > 1 else ""
        raise ValueError(f"NUM_PROCESSES={total}: {n} processes on this machine{each}, which has {devices} CUDA "
                         "device(s) (one process per device; see CUDA_VISIBLE_DEVICES); use at most that many, or "
                         "more machines (NUM_MACHINES, docs/several-gpus.md)")


def training_processes(root: int) -> list[int]:
    """The processes below ``root`` that run :data:`WORKER` (not ``accelerate launch`` itself, whose command line
    names the module too), read from ``/proc``; empty where there is no ``/proc``."""
    children: dict[int, list[int]] = {}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if WORKER.encode() in argv and b"accelerate.commands.launch" not in argv:
            found.append(pid)
    return found


def run_command(cmd: list[str], env: dict[str, str], stop_signals=(), received: list | None = None,
                stop_as_term: bool = False) -> int:
    """Run ``cmd`` and return its exit status (128 + N when signal N ended it). A signal of ``stop_signals`` sent
    to this process goes to the training processes below it (:func:`training_processes`), others (SIGINT, SIGTERM
    and SIGHUP when they are not stop signals) to ``cmd``: stopping the launcher (a scheduler's kill) stops the
    processes it started, and a preemption lets them save first. ``received``: the names of the stop signals that
    came are appended to it. ``stop_as_term``: a stop signal is sent to ``cmd`` as SIGTERM (an evaluation under
    ``accelerate launch``, whose agent passes SIGTERM on to its workers but dies of a USR1 and leaves them running)."""
    print(f"tarpo launch: running {shlex.join(cmd)}", flush=True)
    proc = subprocess.Popen(cmd, env=env)
    stops = set(stop_signals)

    def forward(sig, _frame):
        if sig in stops and received is not None:
            received.append(signal.Signals(sig).name)
        if sig in stops and stop_as_term:
            proc.send_signal(signal.SIGTERM)
            return
        targets = training_processes(proc.pid) if sig in stops else []
        for pid in targets:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if not targets:
            proc.send_signal(sig)
    sigs = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, *stops}
    previous = {sig: signal.signal(sig, forward) for sig in sigs}
    try:
        status = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - status if status < 0 else status
