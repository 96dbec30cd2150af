"""Import ``tarpo.patches`` from this checkout's ``patches/`` folder.

``setup.py`` installs ``patches/`` as ``tarpo.patches`` (``package_dir``); an editable install maps
that name to the installed checkout's folder, so a second checkout put first on ``PYTHONPATH``
would get its own ``tarpo`` but another checkout's ``tarpo.patches``. The tests (conftest.py) and
the workers they start call :func:`use_checkout_patches` before anything imports the patches.
"""

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def use_checkout_patches() -> None:
    import tarpo

    folder = os.path.join(ROOT, "patches")
    if os.path.dirname(os.path.abspath(tarpo.__file__)) != os.path.join(ROOT, "tarpo") or not os.path.isdir(folder):
        return  # an installed tarpo (not this checkout's): its own patches
    loaded = sys.modules.get("tarpo.patches")
    if loaded is not None:
        if os.path.dirname(os.path.abspath(loaded.__file__)) != folder:
            raise RuntimeError(f"tarpo.patches was imported from {loaded.__file__} before this checkout's {folder}")
        return
    spec = importlib.util.spec_from_file_location("tarpo.patches", os.path.join(folder, "__init__.py"),
                                                  submodule_search_locations=[folder])
    module = importlib.util.module_from_spec(spec)
    sys.modules["tarpo.patches"] = module
    spec.loader.exec_module(module)
    tarpo.patches = module
