"""Reports: what a plan does and why (``explain``), and strategies x targets x models side by
side (``compare``: cells, then ``tables`` and ``plots`` of them)."""
