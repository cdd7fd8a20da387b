"""``python -m vitkit.cli`` runs the CLI (as ``python -m vitkit`` does)."""

import sys

from vitkit.cli import main

sys.exit(main())
