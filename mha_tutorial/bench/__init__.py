"""The benchmarks: what attention costs in time and memory, measured side by side in one run.

One entry point, ``python -m mha_tutorial.bench COMMAND`` (see ``__main__``):

- ``attention`` (:mod:`.attention`, reports in :mod:`.report`): every multi-head attention implementation on the
  same weights, forward and backward, time and peak memory;
- ``decode`` (:mod:`.decode`): decoding with and without the KV cache, tokens/s and where the cache starts to pay;
- ``flash`` (:mod:`.flash`): the tiled attention of ``modern.flash`` against SDPA's kernels, time and peak memory
  against the sequence length.

``PeakMemory`` and ``run_benchmark`` (notebooks 04a and 10 use them) are re-exported here.
"""

from .attention import PeakMemory, peak_bytes, run_benchmark

__all__ = ["PeakMemory", "peak_bytes", "run_benchmark"]
