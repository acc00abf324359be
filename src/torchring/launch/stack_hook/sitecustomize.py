"""Put first on a local rank's ``PYTHONPATH`` by ``torchring run``: the first Python process of the rank
dumps every thread's stack to the file named by ``TORCHRING_STACK_FILE`` when it receives SIGUSR2 (the
launcher's hang detector asks for it), then the next ``sitecustomize`` on ``sys.path`` (the user's or the
distribution's) is loaded as if this one were not there. Imports only the standard library's cheapest
modules; the variable is removed so that the rank's own child processes do not claim the file too."""

import _signal  # the builtin behind ``signal``, without its enum import
import faulthandler
import os
import sys
from importlib.machinery import PathFinder

_path = os.environ.pop("TORCHRING_STACK_FILE", None)
if _path:
    try:
        _stack_file = open(_path, "a")  # kept open for the life of the process: faulthandler writes to its fd
        _stack_file.write(f"torchring-stacks pid={os.getpid()}\n")
        _stack_file.flush()
        faulthandler.register(_signal.SIGUSR2, file=_stack_file, all_threads=True)
    except (OSError, ValueError, RuntimeError):
        pass

_here = os.path.dirname(os.path.abspath(__file__))
_spec = PathFinder.find_spec("sitecustomize", [entry for entry in sys.path
                                               if os.path.abspath(entry or os.curdir) != _here])
if _spec is not None and _spec.loader is not None:
    # the import system keeps whatever sys.modules holds once this module has run: the next one
    from importlib.util import module_from_spec

    _next = module_from_spec(_spec)
    sys.modules[__name__] = _next
    _spec.loader.exec_module(_next)
