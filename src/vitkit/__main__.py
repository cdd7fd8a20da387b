"""``python -m vitkit`` (and ``torchrun -m vitkit``) runs the CLI."""

import sys

from vitkit.cli import main

sys.exit(main())
