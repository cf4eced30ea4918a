"""Tuning: the feedback loop that measures candidate groups into ``tuning_logs/`` (through
``records/``: the database and its integrity).

- ``feedback``     -- candidate groups of a model, measured and recorded;
- ``in_model``     -- a plan's final decisions, each timed fused and split inside the model;
- ``side_by_side`` -- candidate decisions, each decision's three kernels timed together;
- ``labels``       -- the three kinds above over model variants, as ``costfuse tune --labels``
  runs them, and the learned model's retraining;
- ``runners``      -- build and time one kernel (locally, over RPC, on a GPU), or several
  side by side;
- ``versions``     -- the digest of the code a row's kernel was formed, scheduled and timed with,
  and the hash of the kernel itself;
- ``recorded``     -- the models behind stored rows, rebuilt by name;
- ``restamp``      -- after an edit, the rows whose kernel it left unchanged keep their label;
- ``metaschedule`` -- meta-schedule tuning of fused kernels and the pipeline that applies it.
"""
