"""Reports: what a plan does and why (``explain``), where it differs from FuseOps' partition
(``decided``: the demo's summary), strategies x targets x models side by side (``compare``:
cells, then ``tables`` and ``plots`` of them), the cost models scored on measured labels,
one family held out at a time (``evaluate``), our strategies beside the peers (``bench``), and
CostFuse's plan against the best plan measured around it (``regret``)."""
