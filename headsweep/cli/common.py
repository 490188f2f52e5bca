"""What every command group of the CLI prints through: the consoles."""

from __future__ import annotations

import sys

from rich.console import Console

console = Console(stderr=True)
out = Console(width=None if sys.stdout.isatty() else 160)  # tables stay readable in logs and pipes
