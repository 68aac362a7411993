#!/usr/bin/env bash
# The GPU measurements the kernel and decode work waits for (docs/kernels.md, "What must be
# measured on a GPU"), the ones that decide a default first, all within one deadline.
#
#   bash scripts/gpu-measure.sh          # on a CUDA machine, the project installed
#
# GPU_MEASURE_S: the deadline in seconds (default 420): each step gets at most what is left,
# a step that would get under 20 s is skipped and says so. Results and a log under $OUT
# (default gpu-measure/): the one decode launch alone (failed or hung: three launches from then
# on), the kernels' GPU tests (in the log), bench.run's results files
# (tags p4, train, p8, band, 64k; the trainer's step against the bare one in the log), the
# inverted index's kernels against its torch ops, decoding at batch 1 and 64 with its kernels (and each launch against its
# bytes, bench.decode_roofline), tiles, the decode kernels' split sweeps, and a staggered
# batch-64 decode with each kind of step's kernels; last, every speed target against what the run
# measured (bench.targets).
# GPU_MEASURE_DRY=1: list the commands (one per line, shell-quoted) in $OUT/commands.txt, run none.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-measure}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
PY=${PYTHON:-python3}
END=$((SECONDS + ${GPU_MEASURE_S:-420}))
LOG=$OUT/log.txt
say() { echo "[$SECONDS s] $*" | tee -a "$LOG"; }
step() {  # step NAME MAX_SECONDS ARGS...: python -m ARGS, within MAX_SECONDS and the deadline
  local name=$1 max=$2; shift 2
  if [ -n "${GPU_MEASURE_DRY:-}" ]; then  # the step's own environment first (NSA_FLEX_WINDOW=0)
    [ -n "${NSA_FLEX_WINDOW:-}" ] && printf 'NSA_FLEX_WINDOW=%q ' "$NSA_FLEX_WINDOW" >>"$OUT/commands.txt"
    [ -n "${NSA_DECODE_ONE_LAUNCH:-}" ] && printf 'NSA_DECODE_ONE_LAUNCH=%q ' "$NSA_DECODE_ONE_LAUNCH" \
      >>"$OUT/commands.txt"
    printf '%q ' "$@" >>"$OUT/commands.txt"; echo >>"$OUT/commands.txt"; return 0; fi
  local left=$((END - SECONDS))
  [ "$left" -lt "$max" ] && max=$left
  if [ "$max" -lt 20 ]; then say "SKIP $name (no time left)"; return 0; fi
  say "BEGIN $name (limit ${max} s): python -m $*"
  timeout -k 5 "$max" "$PY" -m "$@" >>"$LOG" 2>&1
  RC=$?
  say "END $name rc=$RC"
}
RC=0  # the last step's exit status (124: it ran out of time)
[ -n "${GPU_MEASURE_DRY:-}" ] && : >"$OUT/commands.txt"
[ -z "${GPU_MEASURE_DRY:-}" ] && { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git log --oneline -1 2>/dev/null; } >>"$LOG" 2>&1
# 0. The one decode launch whose programs wait for each other (decode_fused.py) alone, in a short
#    limit: if the hardware does not run its programs together or order their cross-program
#    atomics as planned, it hangs, and a hang must not take the budget. Failed or hung: every
#    later step decodes in three launches a layer (NSA_DECODE_ONE_LAUNCH=0), the log says so.
DECODE_TESTS=tests/ops/test_triton_decode.py
ONE_LAUNCH_TEST=$DECODE_TESTS::test_one_launch_on_gpu_step_after_step_and_from_a_graph
step one-launch 90 pytest -q -p no:cacheprovider -m gpu "$ONE_LAUNCH_TEST"
OFF=()
if [ "$RC" != 0 ]; then
  say "the one decode launch failed or did not finish (rc=$RC): NSA_DECODE_ONE_LAUNCH=0 from here on"
  export NSA_DECODE_ONE_LAUNCH=0
  for split in one-launch one-launch-split one-launch-many; do
    OFF+=(--deselect "$DECODE_TESTS::test_bf16_on_gpu_with_each_split[$split]"); done
fi
# Then the compiled kernels against the reference: the decode launches that merge their own
# partials (cross-program atomics only the hardware can order wrongly), the selected dK/dV's
# GPU-sized chunks, the scores kernel's carried halo, phi's second matmul in the decode
# compression's last kernel, training's one pass of both phi maps (cuBLAS's batched GEMMs), and
# FlexAttention's backward taking the window's gradient without a copy.
step gpu-tests 180 pytest -q -p no:cacheprovider -m gpu "$DECODE_TESTS" --deselect "$ONE_LAUNCH_TEST" \
  ${OFF[@]+"${OFF[@]}"} \
  tests/ops/test_triton_decode_dense.py tests/ops/test_triton_selected.py tests/ops/test_triton_scores.py \
  tests/ops/test_triton_step_compress.py tests/model/test_decode.py tests/model/test_decode_syncs.py \
  tests/model/test_compress_pair.py tests/ops/test_flex_window.py::test_its_backward_copies_no_gradient_on_gpu
# 1. Decoding at batch 1 with each step's kernels, each layer's decode attention in one launch
#    (decode_fused.py), then in three: whichever is faster decodes a small batch.
step decode-b1 60 bench.decode --contexts 8192 65536 --kernels --json "$OUT/decode-b1.json"
if [ "${NSA_DECODE_ONE_LAUNCH:-1}" = 0 ]; then
  say "SKIP decode-b1-launches (decode-b1 ran in three launches a layer)"
else
  NSA_DECODE_ONE_LAUNCH=0 step decode-b1-launches 60 bench.decode --contexts 8192 65536 --kernels \
    --json "$OUT/decode-b1-launches.json"
fi
# 2. The default kernels at 2k and 16k with their per-kernel breakdown (the dK/dV chunks and the
#    scores kernel since 2026-11-28), then the decode steps' kernels at batch 64 (the merge
#    launches gone), then the selected forward/dQ at head dim 64 with 8 positions per
#    program (128 rows) against those 4 (docs/kernels.md, "Positions per selected program").
run=(bench.run --layouts nsa-125m --seqs 2048 16384 --no-reference --no-check --no-train --out-dir "$OUT")
step sel-p4 100 "${run[@]}" --tag p4
# The selected dK/dV's inverted index as kernels against the torch ops it was (kept if faster).
step index 40 bench.inverted_index --json "$OUT/inverted-index.json"
step decode-b64 60 bench.decode --contexts 8192 65536 --batch 64 --kernels --json "$OUT/decode-b64.json"
step decode-bounds 20 bench.decode_roofline --measured "$OUT/decode-b1.json" "$OUT/decode-b64.json" \
  --json "$OUT/decode-roofline.json"  # each launch against its bytes (no GPU work; the log has the table)
# The train step, nsa-125m and dense-125m at 2k and 16k, eager and replayed from a CUDA graph
# (the graph's proof against eager included): the targets' ratios, and whether the graph holds.
step train 100 bench.run --train-only --out-dir "$OUT" --tag train
step sel-p8 100 "${run[@]}" --sel-positions 8 --tag p8
# The window branch on the band kernel instead of FlexAttention (which runs at ~3x the band
# kernels' bound: bench.roofline --measured), same rows: whichever is faster trains it.
NSA_FLEX_WINDOW=0 step band-window 100 "${run[@]}" --tag band
# nsa-train's step against the bare one, with the graph (train.cuda_graph: replayed or why not).
step trainer-graph 90 bench.trainer_overhead --config nsa-125m --steps 12 --set train.cuda_graph=true \
  --json "$OUT/trainer-overhead.json"
# 3. Every tunable launch's configs, split launches compared by their sum (the compressed dK/dV).
step tiles 120 bench.tiles --layouts nsa-125m --seqs 16384 --json "$OUT/tiles.json"
# 4. The decode kernels' splits at both batches since the token-sum scores (plan_splits' constants).
step decode-sweep 60 bench.decode_kernel --contexts 8192 65536 --sweep --json "$OUT/decode-sweep-b1.json"
step decode-sweep-b64 60 bench.decode_kernel --contexts 65536 --batch 64 --sweep --json "$OUT/decode-sweep-b64.json"
# 5. Decoding where some sequence completes a compression block at every step, with its kernels.
step decode-stagger 80 bench.decode --contexts 65536 --batch 64 --stagger --kernels --json "$OUT/decode-stagger.json"
# 6. Both layouts at 64k, the length the training targets are set at.
step long 150 bench.run --layouts nsa-125m paper --seqs 65536 --no-reference --no-check --no-train --out-dir "$OUT" --tag 64k
# 7. Every speed target against what this run measured: it reads $OUT's files, no GPU work, so it
#    runs even past the deadline (20 s). The table ends the log; targets.json holds it.
[ "$END" -lt $((SECONDS + 20)) ] && END=$((SECONDS + 20))
step targets 20 bench.targets "$OUT" --json "$OUT/targets.json"
say done
