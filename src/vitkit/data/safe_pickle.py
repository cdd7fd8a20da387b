"""Reading pickles that should hold only data: numpy arrays, dicts, lists, strings, numbers.

Pickles can run arbitrary code when loaded. The standard MNIST and CIFAR downloads are pickles,
so vitkit reads them with an unpickler that rebuilds numpy arrays and plain containers and
refuses every other global (a class, a function) with an error naming the file.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import IO, Any

import numpy as np

from vitkit.errors import VitkitError


def _numpy_reconstruct() -> Any:
    core = getattr(np, "_core", None)  # numpy >= 2; `numpy.core` is a deprecated alias there
    if core is None:
        core = np.core
    return core.multiarray._reconstruct


class NumpyOnlyUnpickler(pickle.Unpickler):
    """Rebuilds numpy arrays and builtin containers and nothing else."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def __init__(self, file: IO[bytes], path: Path, what: str) -> None:
        super().__init__(file, encoding="latin1")
        self._path = path
        self._what = what

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise VitkitError(
                f"{self._path}: refusing to unpickle '{module}.{name}'; only numpy arrays and "
                f"plain containers are allowed in {self._what}"
            )
        if name == "_reconstruct":
            return _numpy_reconstruct()
        return getattr(np, name)


def load_data_pickle(file: IO[bytes], path: Path, what: str) -> Any:
    """Unpickle ``file`` (read from ``path``) allowing only data; any failure is a VitkitError."""
    try:
        return NumpyOnlyUnpickler(file, path, what).load()
    except VitkitError:
        raise
    except Exception as e:  # a damaged pickle can fail in many ways; all mean "bad file"
        raise VitkitError(f"{path}: cannot read {what} ({type(e).__name__}: {e})") from e
