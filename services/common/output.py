"""What every `egoline` command writes: progress and tables on stderr, one JSON line on stdout.

Scripts and tests read the JSON line; people read stderr. Keeping the two apart is why `--json`
needs no special case in the measuring commands."""

from __future__ import annotations

import json
import sys

from rich.console import Console

err = Console(stderr=True)


def print_json_line(payload: object) -> None:
    """The one JSON line every measuring command prints last."""
    sys.stdout.write(json.dumps(payload, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()
