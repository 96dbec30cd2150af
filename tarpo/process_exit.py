"""A command's process ends without the interpreter's last garbage collection over everything it imported.

At exit, after the ``atexit`` handlers, CPython collects garbage once more over every object still tracked:
for a process that imported the trainer (torch, transformers, TRL, PEFT), about 1.3 s of CPU walking objects
that the operating system is about to free anyway (2-core AMD EPYC; a 2-process launcher run ended 2.3 s sooner,
every process of it paying the walk). :func:`skip_the_final_collection`, called first in a command's
``__main__``, registers :func:`gc.freeze` as the last handler to run: the objects alive then are left out of the
final collection (Unsloth's ``train()`` freezes the same way, for the collections during training). Every other
exit handler (logging's flush, TensorBoard's or W&B's close, ``weakref.finalize``) has run by then; objects freed
by reference counting as the modules are torn down are freed as before.
"""

import atexit
import gc


def skip_the_final_collection() -> None:
    """Register :func:`gc.freeze` to run after every exit handler registered later (``atexit`` runs them last in,
    first out): call it before anything else registers one."""
    atexit.register(gc.freeze)
