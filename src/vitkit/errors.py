"""The one exception type for problems a user can fix (bad names, bad files, bad input).

The CLI prints these as a single line and exits with a non-zero code; anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations


class VitkitError(Exception):
    """A user-facing error whose message names the thing at fault and the problem."""
