#!/usr/bin/env bash
# Issue 15's correctness pass in one call on the lent GPU machine (docs/gpu.md), writing every log
# and a summary into OUT:
#
#   scripts/gpu_session.sh OUT [DEVICE]     DEVICE: cuda (default), or cpu to rehearse the flow
#
#   1. build     configure (TESSERA_CUDA=ON for cuda; the .gpu_bundle folder when present, from
#                scripts/gpu_bundle.sh; TESSERA_BUNDLE overrides, empty for none) and build into
#                $TESSERA_BUILD (default build-gpu/; to rehearse on this machine,
#                TESSERA_BUILD=build TESSERA_BUNDLE= TESSERA_PYTHON=<the venv's python> reuse
#                `make`'s build as configured)
#   2. gpu tests ctest -L gpu (on a machine without CUDA they skip; the summary says so)
#   3. train     `make train`'s run (configs/tiny_gpt.toml, the bundled corpus) on the CPU and on
#                DEVICE; the final validation losses must agree within 2%
#   4. resume    the DEVICE run resumed on DEVICE from its step-300 checkpoint: the losses of steps
#                301-600 against the uninterrupted run's (largest relative difference; the CUDA
#                embedding backward accumulates with atomics, so equal is not assumed)
#   5. on CPU    the DEVICE run's checkpoint resumed on the CPU from step 300 (largest relative
#                loss difference against the DEVICE run), and sampled from with `generate`
#
# Exits non-zero when a step fails; SUMMARY.md in OUT says which and where its log is.
set -uo pipefail

OUT="${1:?usage: scripts/gpu_session.sh OUT [cuda|cpu]}"
DEVICE="${2:-cuda}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
SUMMARY="$OUT/SUMMARY.md"
PY="${TESSERA_PYTHON:-$(command -v python3)}"
CUDA=OFF
[ "$DEVICE" = cuda ] && CUDA=ON
BUILD="$(realpath -m "${TESSERA_BUILD:-$ROOT/build-gpu}")"
BIN="$BUILD/tessera"
RUNS="$OUT/runs"
DATA="$BUILD/data/kjv"

echo "# GPU session: device $DEVICE, $(date -u +%FT%TZ), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)" >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
failed=0
fail() { note "- FAILED: $*"; failed=1; }
timed() {  # timed NAME LOG COMMAND...: runs COMMAND into LOG, notes its seconds
  local name="$1" log="$2" start=$SECONDS; shift 2
  if "$@" >"$log" 2>&1; then note "- $name: ok ($((SECONDS - start)) s, $(basename "$log"))"; return 0; fi
  fail "$name ($((SECONDS - start)) s): see $(basename "$log")"; return 1
}
final_val() { "$PY" - "$1" <<'EOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
print([l["val_loss"] for l in lines if "val_loss" in l][-1])
EOF
}
loss_gap() {  # largest relative difference of the training losses two runs logged at steps > 300
  "$PY" - "$1" "$2" <<'EOF'
import json, sys
def losses(run):
    return {l["step"]: l["loss"] for l in map(json.loads, open(run + "/metrics.jsonl")) if "loss" in l and l["step"] > 300}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
common = sorted(set(a) & set(b))
print(f"{max(abs(a[s] - b[s]) / abs(a[s]) for s in common):.3g} over {len(common)} logged steps" if common else "no common steps")
EOF
}

# 1. build
bundle="${TESSERA_BUNDLE-$ROOT/.gpu_bundle}"  # set and empty: the system's packages
[ -f "$bundle/MANIFEST" ] || bundle=""
note "- nvidia-smi: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo none)"
note "- torch: $("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.cuda.is_available())' 2>&1)"
timed "configure" "$OUT/configure.log" cmake -S "$ROOT" -B "$BUILD" -G Ninja -DTESSERA_PYTHON="$PY" \
      -DTESSERA_CUDA=$CUDA -DTESSERA_BUNDLE="$bundle" || exit 1
timed "build" "$OUT/build.log" cmake --build "$BUILD" -j "$(nproc)" || exit 1

# 2. the gpu-labelled tests
if timed "ctest -L gpu" "$OUT/gpu_tests.log" bash -c "cd '$BUILD' && ctest -L gpu --output-on-failure"; then
  note "  $(grep -E 'tests passed' "$OUT/gpu_tests.log") ($(grep -c '(Skipped)' "$OUT/gpu_tests.log") skipped)"
fi

# 3. make train's run on the CPU and on DEVICE
[ -f "$DATA/train.bin" ] || "$BIN" prepare --input "$ROOT/data/kjv/genesis_to_ruth.txt" --out "$DATA" --tokenizer byte >/dev/null
train() {  # train NAME DEVICE [more --set/--resume arguments]
  local name="$1" device="$2"; shift 2
  timed "train $name" "$OUT/train_$name.log" "$BIN" train --config "$ROOT/configs/tiny_gpt.toml" \
        --set data.path="$DATA" --set train.device="$device" --set checkpoint.every=300 --set checkpoint.keep=4 \
        --out "$RUNS/$name" --overwrite "$@"
}
if train reference_cpu cpu && train "$DEVICE" "$DEVICE"; then
  cpu_val=$(final_val "$RUNS/reference_cpu"); dev_val=$(final_val "$RUNS/$DEVICE")
  gap=$("$PY" -c "print(abs($dev_val - $cpu_val) / $cpu_val)")
  note "  final val_loss: cpu $cpu_val, $DEVICE $dev_val, relative gap $gap (floor: 0.02)"
  "$PY" -c "import sys; sys.exit(0 if $gap <= 0.02 else 1)" || fail "val_loss gap above 2%"

  # 4. resumed on DEVICE, 5. resumed on the CPU and sampled there
  if train "${DEVICE}_resumed" "$DEVICE" --resume "$RUNS/$DEVICE/checkpoints/step_300"; then
    note "  $DEVICE resumed at 300 vs uninterrupted: largest relative loss difference $(loss_gap "$RUNS/$DEVICE" "$RUNS/${DEVICE}_resumed")"
  fi
  if train "${DEVICE}_on_cpu" cpu --resume "$RUNS/$DEVICE/checkpoints/step_300"; then
    note "  $DEVICE checkpoint resumed on cpu at 300 vs the $DEVICE run: largest relative loss difference $(loss_gap "$RUNS/$DEVICE" "$RUNS/${DEVICE}_on_cpu")"
  fi
  timed "generate on cpu from the $DEVICE run" "$OUT/generate.log" "$BIN" generate --checkpoint "$RUNS/$DEVICE" \
        --prompt "And God said" --max-tokens 200 --seed 1
fi
rm -rf "$RUNS"/*/checkpoints  # what comes back from the device machine is limited
note "- result: $([ $failed = 0 ] && echo 'every step passed' || echo 'FAILED (above)')"
exit $failed
