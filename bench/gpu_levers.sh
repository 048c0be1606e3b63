#!/usr/bin/env bash
# The GPU levers of feta/dpdm and of the GS-WGAN family, each timed beside today's path in ONE call of at most 9
# minutes with the install: `make gpu-levers [GPU_OUT=dir]` on the GPU node, with wheelhouse/ and .data/ carried.
#   1. feta's DP-SGD micro-batch step (bench/feta_step.py): 32 records (today), 64, 128 and memory-sized, ghost_conv
#      auto (today) and patches, cuda_graph off (today) and on, fp32 and bf16; today's setting first and again last.
#   2. GS-WGAN's discriminator pre-training (bench/gpu_check.py's gswgan rows, bf16 eager, one process): today's,
#      then the warm-up generators as a loop of dense nets (ensemble.generators=loop; they are 90 % of the FLOPs,
#      bench/flops.py), ensemble.conv=batched, memory-sized chunks (gswgan.pretrain_chunk=null) and
#      cudnn_benchmark=true, in that order (the check's budget skips the last rows first).
#   3. feta's whole DP-SGD step (bench/gpu_check.py's feta row) with part 1's fastest fp32 setting.
# Each part writes its table (and JSON) under GPU_OUT and the tables are printed last. Docs: docs/performance.md.
# LEVERS_TINY=1 (with PYTHON=.venv/bin/python and no WHEELS): a CPU dry run of the same three parts in about a
# minute, on the quick UNet and tests/tiny.py's configs (tests/test_feta_step_bench.py runs it).
set -u
OUT=${GPU_OUT:-gpu_levers}
SITE=${GPU_SITE:-/tmp/site}
DATA=${DATA_DIR:-.data}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
if [ -n "${WHEELS-wheelhouse}" ]; then
    $PY scripts/wheelhouse.py install --wheels "${WHEELS-wheelhouse}" --target "$SITE" || exit 2
fi
export PYTHONPATH="$SITE:$PWD"
T0=$(date +%s)
say() { echo "[gpu_levers $(( $(date +%s) - T0 )) s] $*" >&2; }
if [ -n "${LEVERS_TINY:-}" ]; then
    STEP_ARGS="--device cpu --unet quick --multiplicity 2 --batch 16 --micro 4,8 --graph off,on --precisions fp32 \
        --reps 1 --budget 20"
    CHECK_ARGS="--device cpu --tiny"; GS_MIN=0.4; FETA_MIN=0.3
else
    STEP_ARGS="--micro 32,64,128,auto --conv auto,patches --graph off,on --precisions fp32,bf16 --reps 5 --budget 100"
    CHECK_ARGS=""; GS_MIN=3.0; FETA_MIN=2.2
fi

say "1. feta micro-batch step"
# shellcheck disable=SC2086
timeout 140 $PY bench/feta_step.py $STEP_ARGS --out "$OUT/feta_step" > "$OUT/feta_step.log" 2>&1 \
    || say "feta_step: exit $?"

say "2. gswgan pre-training"
G=gswgan:bf16:false
[ -n "${LEVERS_TINY:-}" ] && G=gswgan:fp32:false
# shellcheck disable=SC2086
timeout 195 $PY bench/gpu_check.py $CHECK_ARGS --budget $GS_MIN --data-root "$DATA" --out "$OUT/gswgan" \
    --variants "$G,$G:ensemble.generators=loop,$G:ensemble.conv=batched,$G:gswgan.pretrain_chunk=null,$G:cudnn_benchmark=true" \
    > "$OUT/gswgan.log" 2>&1 || say "gswgan: exit $?"

# part 1's fastest fp32 setting as gpu_check overrides (none: today's)
BEST=$($PY bench/feta_step.py --best "$OUT/feta_step/feta_step.json")
say "3. feta whole step: ${BEST:-(today)}"
# shellcheck disable=SC2086
timeout 150 $PY bench/gpu_check.py $CHECK_ARGS --budget $FETA_MIN --warmup 1 --steps 3 --variants feta:fp32:false \
    --data-root "$DATA" $BEST --out "$OUT/feta_best" > "$OUT/feta_best.log" 2>&1 || say "feta_best: exit $?"

say "done"
for f in "$OUT"/feta_step/feta_step.md "$OUT"/gswgan/gpu_check.md "$OUT"/feta_best/gpu_check.md; do
    [ -f "$f" ] && { echo; echo "== $f"; cat "$f"; }
done
