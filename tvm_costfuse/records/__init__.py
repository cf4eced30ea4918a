"""Records: what measurements leave behind, below everything that reads them.

- ``database``  -- the meta-schedule ``JSONDatabase`` per target plus the group features log
  (``tuning_logs/``), where it lives for a checkout or an installed package;
- ``integrity`` -- one writer per folder (a file lock), repair of what a kill leaves;
- ``rows``      -- what a row says about its workload (architecture, random program).

The cost models read these records (``cost/learned.py``, ``cost/measured.py``) and the
feedback loop (``tuning/``) writes them; neither climbs into the other.
"""
