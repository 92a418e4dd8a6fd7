#!/usr/bin/env bash
# The steps of the H200 runs in benchmarks/NOTES.md, as run on the lent GPU machine, whose image has torch and
# Triton: the notebook and test tools travel as wheels in .whl/, DeepGEMM's tarball and build script in .anchor/
# (../shared/tools/deepgemm/README.md).
#   bash benchmarks/run_h200.sh OUTDIR STEP...
# STEP: hopper-tests (the Hopper kernel's tests), sweep (benchmarks/tune.py over the Hopper kernel's launches),
# host-time (after deepgemm: benchmarks/host_time.py), page-read (benchmarks/page_read.py and its kernel's tests),
# sweep-gather (block 1, gathered, beside block 64), sweep-exact (the exact path at 80 registers, 3 programs an SM),
# sweep-decode (the portable exact path with e4m3 decoded by integer instructions, beside Triton's conversion),
# ncu-gather (DRAM bytes of the gather beside TMA's), ncu-source (where the warps wait, per SASS instruction:
# benchmarks/ncu_stalls.py),
# ncu-deepgemm (after deepgemm: both kernels under ncu's full set, same inputs: details, raw metrics and stalls),
# ncu (benchmarks/ncu_hopper.py under ncu), deepgemm (build it), bench (python -m preshuffle bench --against deepgemm), tests (every test), nbval.
set -uo pipefail
out=$1
shift
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
for step; do
  echo "== $step $(date -u +%T)"
  case $step in
    hopper-tests) python3 -m pytest -q -p no:cacheprovider tests/test_kernels_hopper.py 2>&1 \
                    | tee "$out/hopper-tests.log" | tail -4 ;;
    sweep) python3 benchmarks/tune.py --kernel hopper --out "$out/sweep-n1.json" --shapes 0 2 3 4 5 6 \
             --programs-per-sm 1 2 4 8 16 --configs '{}' '{"maxnreg": 64}' '{"maxnreg": 64, "stages": 6}' \
             '{"precision": "exact"}' > "$out/sweep-n1.log" 2>&1
           python3 benchmarks/tune.py --kernel hopper --out "$out/sweep-mtp.json" --shapes 1 7 \
             --shape 64 3 8192 --shape 256 3 8192 --programs-per-sm 1 2 4 8 16 --configs '{}' \
             '{"row_warpgroups": true}' '{"row_warpgroups": true, "maxnreg": 64}' \
             '{"row_warpgroups": true, "stages": 6}' '{"precision": "exact"}' \
             '{"precision": "exact", "row_warpgroups": true}' > "$out/sweep-mtp.log" 2>&1
           tail -24 "$out/sweep-n1.log"; tail -24 "$out/sweep-mtp.log" ;;
    page-read) python3 -m pytest -q -p no:cacheprovider tests/test_kernels_page_read.py 2>&1 | tail -2
               python3 benchmarks/page_read.py "$out/h200-page-read.json" 2>&1 | tail -30 ;;
    host-time) python3 benchmarks/host_time.py "$out/h200-host-time.json" 2>&1 | tail -3 ;;
    sweep-gather) python3 benchmarks/tune.py --kernel hopper --out "$out/sweep-gather.json" --shapes 0 1 3 4 \
                    --variants block1 block64-normal --programs-per-sm 1 2 3 4 8 --configs '{}' '{"stages": 6}' \
                    > "$out/sweep-gather.log" 2>&1; tail -17 "$out/sweep-gather.log" ;;
    sweep-exact) python3 benchmarks/tune.py --kernel hopper --out "$out/sweep-exact.json" --shapes 0 2 3 4 5 6 \
                   --programs-per-sm 2 3 4 6 8 --configs '{}' '{"precision": "exact"}' \
                   '{"precision": "exact", "maxnreg": 80}' > "$out/sweep-exact.log" 2>&1
                 tail -19 "$out/sweep-exact.log" ;;
    sweep-decode) python3 benchmarks/tune.py --kernel portable --out "$out/sweep-decode.json" --shapes 0 2 4 \
                    --variants block64-normal block16-shuffle --programs-per-sm 4 16 \
                    --configs '{"dot": "fp16"}' '{"dot": "fp16-decode"}' > "$out/sweep-decode.log" 2>&1
                  tail -13 "$out/sweep-decode.log" ;;
    ncu-source) for args in '256 2 65536 {}' '256 1 8192 {}'; do
                  set -- $args
                  tag=$1-$2-$3
                  ncu --clock-control none --launch-skip 1 --launch-count 1 -k regex:_hopper_kernel --set full \
                    --import-source no -f -o "/tmp/ncu-$tag" python3 benchmarks/ncu_hopper.py "$@" > /dev/null 2>&1
                  ncu --import "/tmp/ncu-$tag.ncu-rep" --page source --print-source sass --csv > "$out/ncu-source-$tag.csv" 2>&1
                  ncu --import "/tmp/ncu-$tag.ncu-rep" --page details > "$out/ncu-details-$tag.txt" 2>&1
                  grep -E "Duration|DRAM Throughput|Issued Warp|Eligible Warps" "$out/ncu-details-$tag.txt"
                  python3 benchmarks/ncu_stalls.py "$out/ncu-source-$tag.csv"
                done ;;
    ncu-deepgemm) for args in '64 2 8192' '256 2 65536' '256 1 8192'; do
                    set -- $args
                    for kernel in hopper deepgemm; do
                      tag=$kernel-$1-$2-$3
                      if [ $kernel = hopper ]; then name=regex:_hopper_kernel; else name=regex:sm90_fp8_paged_mqa_logits; fi
                      ncu --clock-control none --launch-skip 1 --launch-count 1 -k $name --set full --import-source no \
                        -f -o "/tmp/ncu-$tag" python3 benchmarks/ncu_hopper.py "$@" "{\"kernel\": \"$kernel\"}" \
                        > /dev/null 2>&1
                      ncu --import "/tmp/ncu-$tag.ncu-rep" --page details > "$out/ncu-details-$tag.txt" 2>&1
                      ncu --import "/tmp/ncu-$tag.ncu-rep" --page raw --csv > "$out/ncu-raw-$tag.csv" 2>&1
                      ncu --import "/tmp/ncu-$tag.ncu-rep" --page source --print-source sass --csv \
                        > "$out/ncu-source-$tag.csv" 2>&1
                      echo "-- $tag"; grep -E "Duration|DRAM Throughput|Issue Slots Busy" "$out/ncu-details-$tag.txt"
                    done
                  done
                  # one archive: the device returns a few files a run
                  (cd "$out" && tar czf ncu-deepgemm.tgz ncu-raw-*.csv ncu-source-*.csv && rm ncu-raw-*.csv ncu-source-*.csv) ;;
    ncu-gather) for args in '4096 1 8192 {"block_size":1}' '4096 1 8192 {}' '256 1 8192 {"block_size":1}'; do
                  ncu --clock-control none --launch-skip 1 --launch-count 1 -k regex:_hopper_kernel --metrics \
                    gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_op_read.sum,l1tex__t_bytes_pipe_lsu_mem_global_op_ldgsts.sum \
                    python3 benchmarks/ncu_hopper.py $args
                done > "$out/ncu-gather.txt" 2>&1; grep -E "done|duration|bytes|throughput|sectors" "$out/ncu-gather.txt" ;;
    ncu) for args in "64 1 8192 {}" "64 2 8192 {}" "64 2 8192 {\"row_warpgroups\":true}" \
                     "64 3 8192 {\"row_warpgroups\":true,\"maxnreg\":64}"; do
           set -- $args
           ncu --clock-control none --launch-skip 1 --launch-count 1 -k regex:_hopper_kernel \
             --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
             --section MemoryWorkloadAnalysis python3 benchmarks/ncu_hopper.py "$@"
         done > "$out/ncu.txt" 2>&1; grep -E "done|Duration|Throughput|Stall|Warp Cycles|Issued|Eligible|Active Warps|Theoretical Occ" "$out/ncu.txt" | head -80 ;;
    deepgemm) eval "$(bash .anchor/build.sh .anchor/deepgemm-54e2261.tar.gz)" || exit 1 ;;
    bench) python3 -m preshuffle bench --against deepgemm --out "$out/h200.json" 2>&1 | tail -45 ;;
    tests) python3 -m pytest -p no:cacheprovider tests 2>&1 | tee "$out/h200-pytest.log" | tail -6 ;;
    nbval) python3 -m pytest -p no:cacheprovider notebooks --nbval --nbval-current-env 2>&1 \
             | tee "$out/h200-nbval.log" | tail -6 ;;
  esac
done
