"""Rewrite the `lbtrain train` options in docs/cli.md from TrainConfig's settings.

Usage: python scripts/cli_docs.py [--check]
The part of docs/cli.md between the generated-options markers is made anew from the parser of
`lbtrain train`, itself built from each setting's help, default and bounds in
lbtrain/trainer/config.py. With --check, nothing is written: it exits 1 when the page is out
of date (tests/unit/test_settings_source.py checks the same).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lbtrain.cli.options_doc import with_options

PAGE = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether it is current")
    args = parser.parse_args()
    page = PAGE.read_text(encoding="utf-8")
    fresh = with_options(page)
    if fresh == page:
        print(f"{PAGE}: the options are current")
        return 0
    if args.check:
        print(f"{PAGE}: the options are out of date; run python scripts/cli_docs.py")
        return 1
    PAGE.write_text(fresh, encoding="utf-8")
    print(f"{PAGE}: options rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
