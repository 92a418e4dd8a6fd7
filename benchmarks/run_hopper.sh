#!/usr/bin/env bash
# The measured runs of this repository, as steps for any machine with a Hopper GPU (sm90: H100, H200).
#
#   bash benchmarks/run_hopper.sh OUTDIR STEP...
#
# Needs: a CUDA build of torch and Triton 3.6 (`make setup TORCH=cuda`, or your own with TORCH=system), and, for
# the steps that time DeepGEMM beside our kernels, DeepGEMM importable as `deep_gemm`. DeepGEMM compiles its kernels
# at first use, so its machine needs nvcc (CUDA 12.8 or newer). To build it in place:
#   git clone --recursive https://github.com/deepseek-ai/DeepGEMM && cd DeepGEMM
#   git checkout 54e2261            # main, version 2.6.1; or a6b593d on branch nv_dev, the line vLLM runs on Hopper
#   ./develop.sh                     # builds the extension in place; then put the checkout on PYTHONPATH
# Both builds are the module `deep_gemm`, so each is timed in its own process: run the `bench` step once with each
# on PYTHONPATH, writing to different files (DEEPGEMM_RESULTS names the file, default h200.json), with
# PRESHUFFLE_DEEPGEMM_BRANCH (main or nv_dev) and PRESHUFFLE_DEEPGEMM_COMMIT naming the build (the results record it;
# nv_dev runs next_n = 4 natively); `python -m preshuffle results --file A B` reads the two files together.
#
# STEP: bench (every kernel and cache beside DeepGEMM: the run the chapters read), deepgemm-test (DeepGEMM's own
# test pointed at preshuffle.deepgemm_compat, then the module timed beside DeepGEMM: benchmarks/deepgemm_test_gpu.py),
# tests (every test, the compiled kernels' among them), nbval (every notebook), sweep (the Hopper kernel's launch
# sweep the launch rule came from), page-read (the page-read floor beside the kernel), host-time (an unchecked call's
# host time), ncu (where the Hopper kernel's warps wait, per SASS instruction, at next_n = 2 and 1; needs Nsight
# Compute), topk (the indexer's top-k beside vLLM's kernels and the whole step beside DeepGEMM + vLLM's,
# benchmarks/topk_gpu.py; VLLM_TOPK names a standalone build of vLLM's top-k kernels, a folder with build.py).
set -uo pipefail
out=${1:?usage: run_hopper.sh OUTDIR STEP...}
shift
mkdir -p "$out"
python=${PYTHON:-python3}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
# pytest writes its root directory into the log: name it relative to the checkout.
relative() { sed "s|$PWD|.|g"; }
# What a log of the tests ran on, first in it: the commit (PRESHUFFLE_GIT_COMMIT where the copy has no git
# metadata of its own), the GPU and the versions.
log_header() {
  echo "# commit ${PRESHUFFLE_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
  echo "# gpu $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  $python -c 'import platform, torch, triton
print(f"# torch {torch.__version__}\n# triton {triton.__version__}\n# python {platform.python_version()}")'
}
# Every test, one line each (a log that names each test's outcome), in parallel where pytest-xdist is installed;
# hypothesis's "gpu" profile (tests/conftest.py) draws fewer examples than CI's.
parallel() { $python -c "import xdist" 2>/dev/null && echo "-n ${PYTEST_WORKERS:-16}"; }
# Notebooks in parallel too, each whole on one worker (its cells share one kernel, in order).
notebooks_parallel() { $python -c "import xdist" 2>/dev/null && echo "-n ${NOTEBOOK_WORKERS:-6} --dist loadfile"; }
for step; do
  echo "== $step $(date -u +%T)"
  case $step in
    bench) $python -m preshuffle bench --against deepgemm --out "$out/${DEEPGEMM_RESULTS:-h200.json}" 2>&1 | tail -45 ;;
    deepgemm-test) $python benchmarks/deepgemm_test_gpu.py "$out" 2>&1 | tail -16 ;;
    # The test of the committed logs reads the logs this step writes: it is left to the next run.
    tests) { log_header; PRESHUFFLE_HYPOTHESIS_PROFILE=gpu $python -m pytest -p no:cacheprovider -v $(parallel) \
               tests --deselect tests/test_project.py::test_h200_logs_ran_every_notebook_and_every_test_whole 2>&1; } \
             | relative | tee "$out/h200-pytest.log" | tail -6 ;;
    nbval) { log_header; $python -m pytest -p no:cacheprovider -v $(notebooks_parallel) notebooks --nbval \
               --nbval-current-env 2>&1; } \
             | relative | tee "$out/h200-nbval.log" | tail -6 ;;
    sweep) $python benchmarks/tune.py --kernel hopper --out "$out/h200-hopper-sweep.json" --shapes 1 7 \
             --shape 64 3 8192 --shape 256 3 8192 --programs-per-sm 1 2 4 8 16 --configs '{}' \
             '{"row_warpgroups": true}' '{"row_warpgroups": true, "maxnreg": 64}' \
             '{"row_warpgroups": true, "stages": 6}' '{"precision": "exact"}' \
             '{"precision": "exact", "row_warpgroups": true}' 2>&1 | tail -24 ;;
    page-read) $python benchmarks/page_read.py "$out/h200-page-read.json" 2>&1 | tail -30 ;;
    host-time) $python benchmarks/host_time.py "$out/h200-host-time.json" 2>&1 | tail -3 ;;
    topk) $python benchmarks/topk_gpu.py "$out/h200-topk.json" ${VLLM_TOPK:+--vllm-topk "$VLLM_TOPK"} 2>&1 \
            | tail -14 ;;
    ncu) for shape in "256 2 65536" "256 1 8192"; do
           tag=${shape// /-}
           ncu --clock-control none --launch-skip 1 --launch-count 1 -k regex:_hopper_kernel --set full \
             --import-source no -f -o "$out/ncu-$tag" $python benchmarks/ncu_hopper.py $shape > /dev/null 2>&1
           ncu --import "$out/ncu-$tag.ncu-rep" --page source --print-source sass --csv > "$out/ncu-source-$tag.csv"
           $python benchmarks/ncu_stalls.py "$out/ncu-source-$tag.csv"
         done ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
