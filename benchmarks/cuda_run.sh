#!/usr/bin/env bash
# The GPU job behind reports/cuda, in one call of a few minutes:
#     [CUDA_TRACES=FILE] bash benchmarks/cuda_run.sh OUT_DIR [SECONDS_PER_PROCESS]
# The CUDA tests (pytest -m cuda) and benchmarks/cuda_validation.py's memory, parallel and inference
# sections run as parallel processes on the one GPU: each has its own caching allocator and peak
# counters, so the measured bytes are the same as run alone.  The FLOP cross-check (it needs the free
# memory) and the timing (a speed) then run alone.  Each process is stopped at the limit and keeps the
# rows it finished; --merge writes one set in OUT_DIR.
set -u
out=$(realpath -m "${1:?usage: cuda_run.sh OUT_DIR [SECONDS_PER_PROCESS]}")
limit=${2:-270}
work=$(mktemp -d)
cd "$(dirname "$0")/.." || exit 2
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # a checkout, no install
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

part() {  # part NAME ARGS...: one process of the validation, its rows in $work/NAME, its log in $work/NAME.log
  local name=$1
  shift
  timeout "$limit" python3 benchmarks/cuda_validation.py --out "$work/$name" "$@" >"$work/$name.log" 2>&1
  echo "$name: exit $? after $SECONDS s"
}
# Phase 1: the CUDA tests, memory, the parallel ranks and inference side by side (peaks far below the GPU's).
timeout "$limit" python3 -m pytest -q -m cuda -p no:cacheprovider tests >"$work/pytest.log" 2>&1 &
names=(memory parallel0 parallel1 inference flops kernels timing)
part memory --only memory &
part parallel0 --only parallel --part 0/2 &
part parallel1 --only parallel --part 1/2 &
part inference --only inference &
wait
# Phase 2: the FLOP cross-check (it checks the GPU's free memory before each model), beside the kernels'
# scratch and the traces asked for in the file $CUDA_TRACES (one line of benchmarks/cuda_trace.py
# arguments each); then timing.
if [ -n "${CUDA_TRACES:-}" ]; then
  while read -r line; do
    [ -n "$line" ] && eval "timeout $limit python3 benchmarks/cuda_trace.py $line"
  done <"$CUDA_TRACES" >"$work/traces.log" 2>&1 &
fi
part kernels --only kernels &
part flops --only flops
wait
limit=$((limit / 3)) part timing --only timing

mkdir -p "$out"
python3 benchmarks/cuda_validation.py --merge "${names[@]/#/$work/}" --out "$out"
for f in "$work"/*.log; do echo "=== $f"; cat "$f"; done >"$out/log.txt" 2>/dev/null
tail -n 3 "$work/pytest.log"
cat "$out/README.md"
