"""``make fixtures``: regenerate every committed golden file (review the diff before committing)."""

from __future__ import annotations

import sys

from tests.dashboards import engine_expositions
from tests.gpu import golden
from tests.loadgen import result_golden


def main() -> int:
    return golden.main() or engine_expositions.main() or result_golden.main()


if __name__ == "__main__":
    sys.exit(main())
