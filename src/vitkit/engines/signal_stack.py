"""The thread's alternate signal stack, kept across OpenVINO's compilations.

OpenVINO's CPU plugin gives the thread that compiles a model an alternate signal stack of its
own (``sigaltstack``), remembers the one before, and puts that back when the compiled model is
destroyed. Two compiled models destroyed in another order than they were made (A, B, then A
freed first) leave the thread on B's remembered stack, which is A's, freed: the next signal a
handler takes on the alternate stack (CPython installs every Python signal handler with
``SA_ONSTACK``) cannot be delivered, and the kernel kills the process with SIGSEGV, no handler
run, no traceback. A test run died so (``SI_KERNEL``, the main thread in ``time.sleep``).
Around each compilation the thread's own stack is put back, so whatever OpenVINO later
restores is a live stack.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import Iterator


class _Stack(ctypes.Structure):
    _fields_ = [
        ("ss_sp", ctypes.c_void_p),
        ("ss_flags", ctypes.c_int),
        ("ss_size", ctypes.c_size_t),
    ]


@contextlib.contextmanager
def kept_signal_stack() -> Iterator[None]:
    """Run the block, then give the calling thread back the alternate signal stack it had
    (Linux and macOS; elsewhere nothing is done)."""
    if not sys.platform.startswith(("linux", "darwin")):
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    before = _Stack()
    if libc.sigaltstack(None, ctypes.byref(before)) != 0:
        yield
        return
    try:
        yield
    finally:
        if not before.ss_flags & 1:  # (SS_ONSTACK: never while running on it)
            libc.sigaltstack(ctypes.byref(before), None)


__all__ = ["kept_signal_stack"]
