"""On PYTHONPATH in the tests that train under FSDP2 on the CPU through ``accelerate launch`` (the launcher's
own command): every process it starts installs tests/workers/fsdp_cpu.py before anything else runs."""

import os
import sys

if os.environ.get("TARPO_TEST_FSDP_ON_CPU") == "1":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import fsdp_cpu

    fsdp_cpu.install()
    fsdp_cpu.install_run_doubles()
