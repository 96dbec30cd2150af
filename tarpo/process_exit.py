"""A command's process ends without the interpreter's last garbage collection over everything it imported.

At exit, after the ``atexit`` handlers, CPython collects garbage once more over every object still tracked:
for a process that imported the trainer (torch, transformers, TRL, PEFT), about 1.3 s of CPU walking objects
that the operating system is about to free anyway (2-core AMD EPYC; a 2-process launcher run ended 2.3 s sooner,
every process of it paying the walk). :func:`skip_the_final_collection`, called in a command's ``__main__`` block
(and by the ``tarpo`` console script), registers :func:`gc.freeze` as an exit handler: the handlers registered after
it (the command's own) run before it, those registered while its modules were imported (logging's flush,
multiprocessing's clean-up) after it, all of them as before. What is skipped is only the collection itself:
objects in reference cycles still alive at exit are not finalized (a buffered file reachable only through a cycle
would not be flushed; the commands write their files inside ``with`` blocks). Objects freed by reference counting
as the modules are torn down are freed as before. Unsloth's ``train()`` freezes the same way, for the collections
during training.
"""

import atexit
import gc


def skip_the_final_collection() -> None:
    """Register :func:`gc.freeze` as an exit handler (``atexit`` runs them last in, first out)."""
    atexit.register(gc.freeze)
