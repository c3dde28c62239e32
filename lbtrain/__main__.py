"""`python -m lbtrain` runs the `lbtrain` command line."""

import sys

from lbtrain.cli.entry import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
