"""The exception type for problems a user can fix, and the warning for an assumed setting.

The CLI prints a :class:`VitkitError` as a single line and exits with a non-zero code; anything
else is a bug and keeps its traceback. An :class:`AssumptionWarning` is one line said aloud
when a checkpoint does not say a setting that changes the numbers (an epsilon, an activation,
the heads, the block order, ...) and vitkit assumed it: it names the field, the value assumed,
what else it could be and the override.
"""

from __future__ import annotations

# Under `vitkit train --nproc-per-node N`: the folder where each process writes its one error
# line for the launcher to print once.
RANK_ERRORS_ENV = "VITKIT_RANK_ERRORS"


class VitkitError(Exception):
    """A user-facing error whose message names the thing at fault and the problem."""


def why_unreadable(path: object, e: BaseException) -> str:
    """Why a reader failed on ``path``, in the system's words where the reader lost them:
    safetensors' reader says "No such file or directory" for a file this user may not read,
    and an engine's parser calls such a file damaged. Opening it again tells which it is."""
    import os

    try:
        with open(os.fspath(path), "rb"):  # type: ignore[call-overload]
            pass
    except PermissionError:
        return "permission denied: its owner and mode do not let this user read it"
    except OSError as err:
        return str(err.strerror or err).lower()
    return str(e)


class AssumptionWarning(UserWarning):
    """A loaded checkpoint's setting that its file does not say, assumed by vitkit."""
