#!/usr/bin/env bash
# The GPU job of a lease that calibrates the step-time model and validates memory, in one call:
#     bash benchmarks/cuda_calibrate_run.sh OUT_DIR [MEMORY_SECONDS] [CALIBRATE_SECONDS] [PARTS] [SECTIONS]
# Phase 1 (side by side: each process has its own caching allocator, so bytes are as run alone):
# cuda_validation.py's SECTIONS (default hf_memory: transformers' own models), each split over PARTS processes
# (default 3) and merged into OUT_DIR/validation.  Phase 2, alone (a speed): cuda_calibrate.py.  Everything
# lands in OUT_DIR/results.tar.gz (the device tool returns at most 8 files) and the logs' ends are printed.
# Optional: MODELS=a,b (hf_memory's --models), CHECKPOINTS=op (the sections' --checkpoints) and CALIBRATE="--only steps --step-models x" (cuda_calibrate.py's).
set -u
out=$(realpath -m "${1:?usage: cuda_calibrate_run.sh OUT_DIR [MEMORY_SECONDS] [CALIBRATE_SECONDS] [PARTS] [SECTIONS]}")
mem=${2:-150}
cal=${3:-220}
parts=${4:-3}
sections=${5:-hf_memory}
work=$(mktemp -d)
cd "$(dirname "$0")/.." || exit 2
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
dirs=()
for section in ${sections//,/ }; do
  for ((k = 0; k < parts; k++)); do
    dirs+=("$work/$section$k")
    timeout "$mem" python3 benchmarks/cuda_validation.py --out "$work/$section$k" --only "$section" --part "$k/$parts" ${MODELS:+--models "$MODELS"} \
      ${CHECKPOINTS:+--checkpoints "$CHECKPOINTS"} \
      >"$work/$section$k.log" 2>&1 &
  done
done
wait
python3 benchmarks/cuda_validation.py --merge "${dirs[@]}" --out "$work/validation" >"$work/merge.log" 2>&1
echo "phase 1 done after $SECONDS s"
timeout $((cal + 40)) python3 benchmarks/cuda_calibrate.py --out "$work/calibration" --budget "$cal" ${CALIBRATE:-} >"$work/calibration.log" 2>&1
echo "phase 2 done after $SECONDS s"
mkdir -p "$out"
tar -czf "$out/results.tar.gz" -C "$work" .
for f in "$work"/*.log; do echo "=== $f"; grep -v "^[a-z_]* [0-9]" "$f" | tail -n 8 | cut -c1-300; done
cat "$work/validation/README.md" 2>/dev/null | head -40
