#!/usr/bin/env bash
# What was run on the lent GPU machine (issue 13), from the repository root. That machine has PyTorch,
# matplotlib, seaborn and pandas but no Jupyter: the execution stack (nbclient, nbformat, ipykernel and what
# they need, for Python 3.12) was carried as wheels in .whl/. Results go to $OUT (the device tool's folder).
#   docs/gpu/run_on_gpu.sh notebooks   every notebook through the executor `make run` used then (since replaced
#                                      by `jupyter execute`; the module it called is gone)
#   docs/gpu/run_on_gpu.sh tests       the unit tests that touch devices, the three CUDA-only ones included
#   docs/gpu/run_on_gpu.sh bench       the full benchmark sweep (bfloat16 first: it holds the headline)
#   docs/gpu/run_on_gpu.sh part2       (issue 24) each Part II notebook (10 on) executed there by nbclient,
#                                      timed; the executed copies come back as part2_notebooks.tgz
#   docs/gpu/run_on_gpu.sh flash       (issue 24) the tiled attention's tests on the GPU, then its benchmark
#                                      against SDPA's kernels, T = 1k ... 16k in bfloat16 (bench_flash)
set -u
if [ "${1:-notebooks}" = notebooks ] || [ "${1:-notebooks}" = part2 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
fi
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MPLBACKEND=Agg
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton, numpy; print('torch', torch.__version__, torch.cuda.get_device_name(), 'triton', triton.__version__, 'numpy', numpy.__version__)"
case "${1:-notebooks}" in
part2)
  mkdir -p /tmp/nb
  for nb in notebooks/1[0-9]_*.ipynb; do
    python3 - "$nb" <<'PY' 2>&1 | tee -a "$OUT/part2.log"
import sys, time
from pathlib import Path
import nbclient, nbformat
path = Path(sys.argv[1])
nb = nbformat.read(path, as_version=4)
start = time.perf_counter()
nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": "notebooks"}}).execute()
print(f"{path.name}: executed in {time.perf_counter() - start:.1f} s")
nbformat.write(nb, f"/tmp/nb/{path.name}")
PY
  done
  tar czf "$OUT/part2_notebooks.tgz" -C /tmp/nb .
  ;;
flash)
  # H100 SXM dense bfloat16 peak: 989 TFLOP/s (NVIDIA's data sheet), for the "% of peak" column.
  timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short tests/flash "tests/core/test_mha.py::test_cuda_matches_cpu_with_masks_made_on_the_cpu" 2>&1 | tee "$OUT/tests_flash.log"
  timeout 400 python3 -m mha_tutorial.bench flash --device cuda --peak-tflops 989 --out "$OUT" 2>&1 | tee "$OUT/bench_flash.log"
  ;;
notebooks)
  mkdir -p /tmp/nb
  cp notebooks/[0-9][0-9]*.ipynb /tmp/nb/  # executed in place there, with timings.json beside them
  python3 tools/run_notebooks.py /tmp/nb/*.ipynb 2>&1 | tail -n 60 | tee "$OUT/notebooks.log" || true
  tar czf "$OUT/gpu_notebooks.tgz" -C /tmp/nb .
  ;;
tests)
  # 5 workers of 3 threads: with 16 workers of 16 threads each sharing the GPU, slow tests hit the timeout.
  OMP_NUM_THREADS=3 python3 -m pytest -q -p no:cacheprovider -n 5 --timeout 200 -rfE --tb=short \
    tests/core/test_variants.py tests/core/test_mha.py tests/experiments/test_bench.py tests/checks/test_checks_nb05.py \
    tests/checks/test_checks_nb07.py tests/experiments/test_pruning.py tests/experiments/test_train.py
  ;;
bench)
  # A sweep stopped by the 10-minute limit of one command still leaves bench.partial.csv.
  python3 -m mha_tutorial.bench attention --dtypes bfloat16 float32 tf32 --min-run-time 0.2 --out "$OUT" 2>&1 | tee "$OUT/bench.log"
  ;;
esac
