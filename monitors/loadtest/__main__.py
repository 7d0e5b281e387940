"""``python -m monitors.loadtest``: the same as ``nodewise loadtest``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m monitors.loadtest"))
