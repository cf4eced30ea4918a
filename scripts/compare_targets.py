"""Cross-target comparison: models x fusion strategies x targets (thin wrapper).

Same as ``costfuse compare``; the logic lives in ``tvm_costfuse.report.compare``. Example::

    python scripts/compare_targets.py --models all --targets llvm,cuda --out compare_results
"""

from __future__ import annotations

import sys

from tvm_costfuse.cli import main

if __name__ == "__main__":
    sys.exit(main(["compare", *sys.argv[1:]]))
