#!/usr/bin/env bash
# The GPU levers of feta/dpdm and of the GS-WGAN family, each timed beside today's path in ONE call (about 8 minutes
# with the install): `make gpu-levers [GPU_OUT=dir]` on the GPU node, with wheelhouse/ and .data/ carried.
#   1. feta's DP-SGD micro-batch step (bench/feta_step.py): micro-batch 32 (today) and memory-sized, ghost_conv
#      auto (today) and patches, cuda_graph off (today) and on, fp32 and bf16; today's setting first and again last.
#   2. GS-WGAN's discriminator pre-training (bench/gpu_check.py's gswgan row, bf16 eager): today's layout, then
#      ensemble.conv=batched, ensemble.layout=channels_last, cudnn_benchmark=true and gswgan.pretrain_chunk=null.
#   3. feta's whole DP-SGD step (bench/gpu_check.py's feta row) with the fastest fp32 setting of part 1.
# Each part writes its table (and JSON) under GPU_OUT; the summary printed last lists them. Docs: docs/performance.md.
set -u
OUT=${GPU_OUT:-gpu_levers}
SITE=${GPU_SITE:-/tmp/site}
DATA=${DATA_DIR:-.data}
mkdir -p "$OUT"
python3 scripts/wheelhouse.py install --wheels "${WHEELS:-wheelhouse}" --target "$SITE" || exit 2
export PYTHONPATH="$SITE:$PWD"
T0=$(date +%s)
say() { echo "[gpu_levers $(( $(date +%s) - T0 )) s] $*" >&2; }

say "1. feta micro-batch step"
timeout 170 python3 bench/feta_step.py --micro 32,auto --conv auto,patches --graph off,on --precisions fp32,bf16 \
    --reps 5 --budget 140 --out "$OUT/feta_step" > "$OUT/feta_step.log" 2>&1 || say "feta_step: exit $?"

i=0
for SET in "" "--set ensemble.conv=batched" "--set ensemble.layout=channels_last" "--set cudnn_benchmark=true" \
           "--set gswgan.pretrain_chunk=null"; do
    i=$((i + 1))
    say "2.$i gswgan pre-training ${SET:-(today)}"
    # shellcheck disable=SC2086
    timeout 80 python3 bench/gpu_check.py --budget 1.0 --variants gswgan:bf16:false --data-root "$DATA" $SET \
        --out "$OUT/gswgan_$i" > "$OUT/gswgan_$i.log" 2>&1 || say "gswgan_$i: exit $?"
done

BEST=$(python3 - "$OUT/feta_step/feta_step.json" <<'EOF'
import json, sys
try:
    rows = [r for r in json.load(open(sys.argv[1])) if r.get("s/step") and r["precision"] == "fp32"]
except OSError:
    rows = []
if rows:
    r = min(rows, key=lambda r: r["s/step"])
    print(f"--set feta.micro_batch={r['micro']} --set feta.ghost_conv={r['conv']} "
          f"--set feta.cuda_graph={'true' if r['graph'] == 'on' else 'false'}")
EOF
)
say "3. feta whole step: ${BEST:-(today)}"
# shellcheck disable=SC2086
timeout 150 python3 bench/gpu_check.py --budget 2.3 --warmup 1 --steps 3 --variants feta:fp32:false --data-root "$DATA" \
    $BEST --out "$OUT/feta_best" > "$OUT/feta_best.log" 2>&1 || say "feta_best: exit $?"

say "done"
for f in "$OUT"/feta_step/feta_step.md "$OUT"/gswgan_*/gpu_check.md "$OUT"/feta_best/gpu_check.md; do
    [ -f "$f" ] && { echo; echo "== $f"; cat "$f"; }
done
