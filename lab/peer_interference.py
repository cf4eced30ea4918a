"""Do the peers disturb each other when timed interleaved in one process?

Why: ``bench_corpus.py`` samples PyTorch and ONNX Runtime in alternation with our builds. A
pool that is still spinning when the next column starts would tax that column. This times ORT
alone, right after PyTorch and after PyTorch plus a 0.5 s pause, and PyTorch alone and right
after ORT, at 1 and 2 threads (full size, 5 samples each, medians in ms)::

    python lab/peer_interference.py efficientnet_b0 squeezenet1_1 gpt_neox
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
import bench_corpus

from tvm_costfuse.measurement.timing import call_sampler
from tvm_costfuse.models import corpus


def probe(name: str, samples: int = 5) -> None:
    _, inputs, module = corpus.load(name, small=False)
    args = corpus.torch_inputs(inputs)
    tmp = tempfile.mkdtemp()
    for t in (1, 2):
        sess = bench_corpus._ort_session(module, args, list(inputs), t, f"{tmp}/model.onnx")
        feed = {i.name: a for i, a in zip(sess.get_inputs(), inputs.values(), strict=True)}
        ort = call_sampler(lambda sess=sess, feed=feed: sess.run(None, feed), 50)
        torch_ = bench_corpus._torch_sampler(module, args, t)
        ort(), torch_()
        cols = {"ORT alone": [ort() for _ in range(samples)],
                "torch alone": [torch_() for _ in range(samples)],
                "ORT after torch": [], "torch after ORT": [], "ORT after torch + 0.5 s": []}
        for _ in range(samples):
            cols["torch after ORT"].append(torch_())
            cols["ORT after torch"].append(ort())
        for _ in range(samples):
            torch_()
            time.sleep(0.5)
            cols["ORT after torch + 0.5 s"].append(ort())
        print(f"{name}, {t} thread(s): " + ", ".join(
            f"{k} {1e3 * np.median(v):.2f}" for k, v in cols.items()), flush=True)


if __name__ == "__main__":
    for model in sys.argv[1:] or ["efficientnet_b0"]:
        probe(model)
