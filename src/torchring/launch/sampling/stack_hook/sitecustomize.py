"""Put first on a rank's ``PYTHONPATH`` by ``torchring run``: the first Python process of the rank writes
every thread's stack to the file named by ``TORCHRING_STACK_FILE`` when asked, then the next
``sitecustomize`` on ``sys.path`` (the user's or the distribution's) is loaded as if this one were not
there. It also records the exception that ends the process, for the launcher's blame
(``torchring.rank_failure``, imported only then). Imports only builtin modules; the variable is removed
so that the rank's own child processes do not claim the file too.

How it is asked (``torchring.launch.sampling.stack_probe``): a byte written to the FIFO ``<stack file>.trigger``
wakes a thread of this process that blocks reading it; holding the GIL, that thread formats
``sys._current_frames()`` in ``faulthandler``'s format and appends it to the stack file in one write.
This is safe whatever the other threads do. Only when that thread cannot get the GIL (a thread stuck in
a C call that holds it, so no Python frame can change), the prober falls back to SIGUSR2, on which
``faulthandler`` dumps every thread from the signal handler. (A ``faulthandler`` dump while other
threads run Python code can crash the process, which is why it is only the fallback.)
"""

import _signal  # the builtin behind ``signal``, without its enum import
import _thread
import faulthandler
import os
import sys
from importlib.machinery import PathFinder

_MAIN_THREAD = _thread.get_ident()
#: Innermost frames written per thread (faulthandler writes at most 100 too).
_MAX_FRAMES = 100


def _format_stacks(skip: int) -> str:
    lines = []
    for ident, frame in sys._current_frames().items():
        if ident == skip:
            continue
        label = "Current thread" if ident == _MAIN_THREAD else "Thread"
        lines.append(f"{label} 0x{ident:016x} (most recent call first):")
        depth = 0
        while frame is not None and depth < _MAX_FRAMES:
            code = frame.f_code
            lines.append(f'  File "{code.co_filename}", line {frame.f_lineno} in {code.co_name}')
            frame, depth = frame.f_back, depth + 1
        lines.append("")
    return "\n".join(lines) + "\n"


def _serve_dumps(trigger_fd: int, stack_fd: int) -> None:
    me = _thread.get_ident()
    while True:
        try:
            if not os.read(trigger_fd, 64):
                return
            os.write(stack_fd, _format_stacks(me).encode(errors="replace"))
        except OSError:
            return


def _record_failures() -> None:
    """Before the interpreter prints the exception that ends this process, let ``torchring.rank_failure``
    tell the launcher about it (imported only then; nothing happens where torchring is not importable)."""
    previous = sys.excepthook
    pid = os.getpid()

    def hook(kind, error, tb):
        if os.getpid() == pid:
            try:
                from torchring.rank_failure import record_uncaught

                record_uncaught(error, tb)
            except Exception:
                pass
        previous(kind, error, tb)

    sys.excepthook = hook


_path = os.environ.pop("TORCHRING_STACK_FILE", None)
if _path:
    _record_failures()
    try:
        _stack_file = open(_path, "a")  # kept open for the life of the process
        _stack_file.write(f"torchring-stacks pid={os.getpid()}\n")
        _stack_file.flush()
        faulthandler.register(_signal.SIGUSR2, file=_stack_file, all_threads=True)
        # read-write, so that the read blocks (instead of seeing EOF) between the prober's writes
        _trigger = os.open(_path + ".trigger", os.O_RDWR)
        _thread.start_new_thread(_serve_dumps, (_trigger, _stack_file.fileno()))
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
