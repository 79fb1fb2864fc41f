"""``python -m labkit.drills``: parse and check the drills' page (notebooks/interview_drills.md) and say
what it holds; a malformed entry is refused with its line, field and what is allowed (exit status 1)."""
from __future__ import annotations

import sys

from ..base.runtime import ConfigError


def main() -> int:
    try:
        from . import bank  # deferred: importing the drills parses the page, which may be malformed
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"{bank.source_path()}: {len(bank.PAGE.cases)} cases, {len(bank.PAGE.signals)} signals, "
          f"{len(bank.PAGE.sentences)} sentences")
    return 0


if __name__ == "__main__":
    sys.exit(main())
