"""What scripts/test.sh prepares beside the suite instead of before it: the two downloads that wait on the network
(the GPU machine's torch 2.11 for tests/test_torch_side.py, the real model for tests/test_real_model.py). Each
writes ``runs/cache/preparing/<name>.pid`` when it starts and ``<name>.status`` (its exit status) when it ends; a
test that needs one waits here (tests/conftest.py deals those tests last). Run outside test.sh, nothing is being
prepared and :func:`wait_for` returns at once."""

import os
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKS = os.path.join(ROOT, "runs", "cache", "preparing")


def wait_for(name: str, timeout: float = 1200) -> None:
    """Until the preparation ``name`` ended (its status written, or its process gone), at most ``timeout`` s."""
    pid_path, status_path = (os.path.join(MARKS, f"{name}.{kind}") for kind in ("pid", "status"))
    deadline = time.monotonic() + timeout
    while os.path.exists(pid_path) and not os.path.exists(status_path) and time.monotonic() < deadline:
        try:
            os.kill(int(open(pid_path).read()), 0)
        except (OSError, ValueError):
            return  # its process is gone (test.sh was stopped): what it left is what there is
        time.sleep(1)
