#!/usr/bin/env bash
# Issue 30's measurements in one call on the lent GPU machine (docs/gpu.md), with what
# scripts/gpu_prebuilt.sh packed here (carry .gpu_prebuilt). Run in the repository root there:
#
#   bash scripts/gpu_lease.sh $OUT [PARTS]      PARTS: comma-separated, default all, in this order:
#     correct   the gpu-labelled tests; `make train`'s run on CUDA against the CPU reference run
#               (final validation loss within 2%), resumed on CUDA from its step-300 checkpoint
#     calibrate `tessera plan calibrate --device cuda`: the card's cluster file and product grid (in logs.tgz)
#     speed     GPT-2 124M, bf16, sequence 1024: tessera bench against PyTorch eager and
#               torch.compile (bench/compare_pytorch.py) at each of COMPARE_BATCHES (default 16) over
#               COMPARE_ROUNDS rounds (default 1), and tessera alone at larger batches
#     trace     three traced steps of each of tessera and the PyTorch twin in each of TRACE_TWINS
#               (default eager; compile too) at TRACE_BATCH (default 16), summed per kernel class
#               and per kernel (the TRACE_TOP longest, default 15; bench/trace_summary.py)
#     swap      GPT-2 124M resident, swapped under a device budget, and under ZeRO-3 and ZeRO-2 with
#               offload, with and without clipping
#     pipeline  `tessera pipeline --model` on the device: per-stage F, I, W and a predicted pp 4 step,
#               cut by layers and by the profile
#     lasp      the linear-attention model against softmax attention (SDPA) at sequence 4K to 32K
#     llama     a Llama-family model of about 1B parameters (bench/compare_pytorch.py's llama_1b_2048, bf16,
#               sequence 2048) against PyTorch eager and torch.compile at each of LLAMA_BATCHES (default 4)
#     activations GPT-2 124M at ACTIVATION_BATCH (default 16): tessera bench resident, fully recomputed,
#               int8 and fp8 compressed, offloaded (12 and 6 blocks, and 12 with int8), then tessera
#               against the eager twin offloading by save_on_cpu and compressing int8 by saved-tensor hooks
#               (ACTIVATION_TWINS, default "offload int8"; empty for none)
#     ab        this build against an earlier one (every .gpu_baseline/prebuilt_<commit>.tgz carried,
#               as gpu_prebuilt.sh packed it): tessera bench of GPT-2 124M at batches 16 and 64,
#               the two binaries alternating over AB_ROUNDS rounds (default 3)
#
# Every step runs under a limit that the call's budget (LEASE_BUDGET seconds, default 520) caps;
# a step that no longer fits is skipped and says so. OUT receives SUMMARY.md, logs.tgz (every log
# and JSON, re-packed after each part, so a call stopped at its limit still returns them) and
# cuda_run.tgz (the CUDA run with its step-300 checkpoint, resumed on the CPU back home).
set -uo pipefail

OUT="${1:?usage: scripts/gpu_lease.sh OUT [PARTS]}"
PARTS=",${2:-correct,calibrate,speed,llama,activations,trace,swap,pipeline,lasp,ab},"
ROOT="$(pwd)"
DEADLINE=$((SECONDS + ${LEASE_BUDGET:-520}))
WORK=/tmp/lease
LOGS="$WORK/logs"
mkdir -p "$OUT" "$LOGS"
SUMMARY="$OUT/SUMMARY.md"
note() { echo "$*" | tee -a "$SUMMARY"; }
pack() { tar czf "$OUT/logs.tgz" -C "$WORK" logs 2>/dev/null; }
# step NAME LIMIT LOG COMMAND...: runs COMMAND into LOG under min(LIMIT, the time left)
step() {
  local name="$1" limit="$2" log="$LOGS/$3" start=$SECONDS left=$((DEADLINE - SECONDS))
  shift 3
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 15 ]; then note "- $name: SKIPPED (${left} s of the budget left)"; return 99; fi
  timeout -k 5 "$limit" "$@" >"$log" 2>&1
  local rc=$?
  note "- $name: $([ $rc = 0 ] && echo ok || echo "FAILED rc $rc")$([ $rc = 124 ] && echo " (limit $limit s)") in $((SECONDS - start)) s ($(basename "$log"))"
  return $rc
}
want() { [[ "$PARTS" == *",$1,"* ]]; }

# The prebuilt binaries at the path compiled into the test programs (the build folder of the
# checkout they were built in: that checkout's path leads to this repository).
BUILD="$(cat "$ROOT/.gpu_prebuilt/BUILD_PATH")"
SOURCE="$(dirname "$BUILD")"
[ -e "$SOURCE" ] || { mkdir -p "$(dirname "$SOURCE")" && ln -s "$ROOT" "$SOURCE"; }
mkdir -p "$BUILD" && tar xzf "$ROOT/.gpu_prebuilt/prebuilt.tgz" -C "$BUILD"
TORCH_DIR="$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
NVIDIA_LIBS="$(find "$(dirname "$TORCH_DIR")/nvidia" -name 'lib*.so*' -printf '%h\n' 2>/dev/null | sort -u | paste -sd:)"
export LD_LIBRARY_PATH="$TORCH_DIR/lib:$NVIDIA_LIBS"
BIN="$BUILD/tessera"

echo "# GPU lease: $(date -u +%FT%TZ), build of commit $(cat "$ROOT/.gpu_prebuilt/COMMIT" 2>/dev/null || echo unknown), parts ${PARTS//,/ }" >"$SUMMARY"
note "- device: $(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1)"
note "- torch: $(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>&1)"
if ! "$BIN" --help >"$LOGS/version.log" 2>&1; then
  note "- the prebuilt tessera does not start here:"; head -5 "$LOGS/version.log" | tee -a "$SUMMARY"; pack; exit 1
fi
note "- tessera starts: $(head -1 "$LOGS/version.log")"
DATA="$WORK/kjv"
"$BIN" prepare --input "$ROOT/data/kjv/genesis_to_ruth.txt" --out "$DATA" --tokenizer byte >"$LOGS/prepare.log" 2>&1

# GPT-2 124M as compare_pytorch.py's gpt2_124m_1024 case sets it, for tessera bench
gpt2() {
  echo --config tiny_gpt --set model.preset=gpt2_124m --set train.seq_len=1024 --set train.device=cuda \
       --set precision.dtype=bf16 --set optim.name=adamw --set optim.fused=true --set optim.grad_clip=1.0 \
       --set data.path=unused --set train.threads=16
}

if want correct; then
  note "## correct"
  tiny=(--config "$ROOT/configs/tiny_gpt.toml" --set data.path="$DATA" --set checkpoint.every=300 --set checkpoint.keep=4 --overwrite)
  ( step "train tiny_gpt on cuda" 150 train_cuda.log "$BIN" train "${tiny[@]}" --set train.device=cuda --out "$WORK/runs/cuda" &&
    step "resume it on cuda at 300" 100 train_cuda_resumed.log "$BIN" train "${tiny[@]}" --set train.device=cuda \
         --out "$WORK/runs/cuda_resumed" --resume "$WORK/runs/cuda/checkpoints/step_300" ) &
  step "test_gpu" 150 test_gpu.log "$BUILD/test_gpu" &
  step "DataParallelCuda" 120 test_dp_cuda.log "$BUILD/test_data_parallel" --gtest_filter='DataParallelCuda.*' &
  step "CompressionCuda" 120 test_compression_cuda.log "$BUILD/test_compression" --gtest_filter='CompressionCuda.*' &
  step "test_gpu_nccl (two GPUs; skips on one)" 60 test_gpu_nccl.log "$BUILD/test_gpu_nccl" &
  wait
  for log in test_gpu test_dp_cuda test_compression_cuda test_gpu_nccl; do
    note "  $log: $(grep -E '^\[ +(PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' "$LOGS/$log.log" | tr '\n' ' ')$(grep -E '^\[ +FAILED +\] [A-Z]' "$LOGS/$log.log" | tr '\n' ' ')"
  done
  if [ -f "$WORK/runs/cuda/metrics.jsonl" ]; then
    python3 - "$ROOT/.gpu_prebuilt/reference_cpu" "$WORK/runs/cuda" "$WORK/runs/cuda_resumed" <<'EOF' | tee -a "$SUMMARY"
import json, os, sys
def lines(run):
    path = run + "/metrics.jsonl"
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []
cpu, cuda, resumed = (lines(r) for r in sys.argv[1:])
val = lambda ls: [l["val_loss"] for l in ls if "val_loss" in l][-1]
gap = abs(val(cuda) - val(cpu)) / val(cpu)
print(f"  final val_loss: cpu {val(cpu):.4f}, cuda {val(cuda):.4f}, relative gap {gap:.4f} (floor 0.02: {'ok' if gap <= 0.02 else 'FAILED'})")
a = {l["step"]: l["loss"] for l in cuda if "loss" in l and l["step"] > 300}
b = {l["step"]: l["loss"] for l in resumed if "loss" in l and l["step"] > 300}
common = sorted(set(a) & set(b))
if common:
    worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in common)
    equal = sum(a[s] == b[s] for s in common)
    print(f"  cuda resumed at 300 vs uninterrupted: largest relative loss difference {worst:.3g}, {equal} of {len(common)} logged steps equal")
EOF
    tar czf "$OUT/cuda_run.tgz" -C "$WORK/runs" --exclude='step_600' --exclude='step_900' cuda 2>/dev/null
  fi
  pack
fi

if want speed; then
  note "## speed"
  for b in ${COMPARE_BATCHES:-16}; do
    mkdir -p "$LOGS/b$b"
    step "compare_pytorch gpt2_124m_1024 bf16 batch $b" 240 "compare_b$b.log" \
         python3 "$ROOT/bench/compare_pytorch.py" "$BUILD" --cases gpt2_124m_1024 --device cuda --dtype bf16 \
         --batch "$b" --rounds "${COMPARE_ROUNDS:-1}" --out "$LOGS/b$b"
    tail -8 "$LOGS/compare_b$b.log" | tee -a "$SUMMARY"
  done
  for b in 32 64; do
    step "tessera bench batch $b" 60 bench_b$b.log "$BIN" bench $(gpt2) --set train.batch_size=$b --steps 10 --warmup 3
    tail -3 "$LOGS/bench_b$b.log" | tee -a "$SUMMARY"
  done
  pack
fi

if want llama; then
  note "## llama (about 1B parameters of Llama blocks, bf16, sequence 2048; bench/compare_pytorch.py llama_1b_2048)"
  for b in ${LLAMA_BATCHES:-4}; do
    mkdir -p "$LOGS/llama_b$b"
    step "compare_pytorch llama_1b_2048 bf16 batch $b" 300 "llama_b$b.log" \
         python3 "$ROOT/bench/compare_pytorch.py" "$BUILD" --cases llama_1b_2048 --device cuda --dtype bf16 \
         --batch "$b" --rounds 1 --out "$LOGS/llama_b$b"
    tail -8 "$LOGS/llama_b$b.log" | tee -a "$SUMMARY"
  done
  pack
fi

if want activations; then
  ab=${ACTIVATION_BATCH:-16}
  note "## activations (GPT-2 124M, bf16, batch $ab x 1024: saved activations kept, recomputed, compressed, offloaded)"
  for run in "resident|" "full_recompute|--set memory.activation_checkpointing=full" \
             "int8|--set memory.activation_compression=int8" "fp8|--set memory.activation_compression=fp8" \
             "offload_12|--set memory.activation_offload=12" "offload_6|--set memory.activation_offload=6" \
             "offload_12_int8|--set memory.activation_offload=12 --set memory.activation_compression=int8"; do
    name="${run%%|*}"
    step "bench $name" 60 "act_$name.log" "$BIN" bench $(gpt2) --set train.batch_size=$ab ${run#*|} --steps 10 --warmup 3 --json
    tail -1 "$LOGS/act_$name.log" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print("  ", {k: d[k] for k in ("median_step_s", "mfu", "peak_bytes", "saved_activation_bytes", "activation_offload") if k in d})' 2>/dev/null | tee -a "$SUMMARY"
  done
  for peer in "offload|--activation-offload 12" "int8|--activation-compression int8"; do
    [[ " ${ACTIVATION_TWINS-offload int8} " == *" ${peer%%|*} "* ]] || continue
    mkdir -p "$LOGS/act_twin_${peer%%|*}"
    step "compare_pytorch ${peer%%|*} (eager twin)" 120 "act_twin_${peer%%|*}.log" python3 "$ROOT/bench/compare_pytorch.py" "$BUILD" \
         --cases gpt2_124m_1024 --device cuda --dtype bf16 --batch "$ab" --rounds 1 --peers eager ${peer#*|} \
         --out "$LOGS/act_twin_${peer%%|*}"
    tail -6 "$LOGS/act_twin_${peer%%|*}.log" | tee -a "$SUMMARY"
  done
  pack
fi

if want calibrate; then
  note "## calibrate (tessera plan calibrate --device cuda: the card's cluster file, brought back in logs.tgz)"
  step "plan calibrate --device cuda" 120 calibrate.log "$BIN" plan calibrate --device cuda --out "$LOGS/card_calibrated.toml"
  grep -E "^[a-z_]+ = " "$LOGS/card_calibrated.toml" | head -30 | sed 's/^/  /' | tee -a "$SUMMARY"
  pack
fi

if want trace; then
  tb=${TRACE_BATCH:-16}
  note "## trace (batch $tb)"
  step "tessera_profile_step --trace" 60 trace_tessera.log "$BUILD/tessera_profile_step" $(gpt2) --set train.batch_size=$tb \
       --steps 3 --warmup 3 --trace "$LOGS/trace_tessera.json" &&
    python3 "$ROOT/bench/trace_summary.py" "$LOGS/trace_tessera.json" --steps 3 --top "${TRACE_TOP:-15}" | tee -a "$SUMMARY"
  for mode in ${TRACE_TWINS:-eager}; do
    step "pytorch_twin $mode --trace" 120 "trace_$mode.log" python3 "$ROOT/bench/pytorch_twin.py" --mode "$mode" --device cuda \
         --dtype bf16 --vocab 50257 --block 1024 --layers 12 --heads 12 --embd 768 --batch "$tb" --seq 1024 --steps 3 --warmup 3 \
         --trace "$LOGS/trace_$mode.json" &&
      python3 "$ROOT/bench/trace_summary.py" "$LOGS/trace_$mode.json" --steps 3 --top "${TRACE_TOP:-15}" | tee -a "$SUMMARY"
  done
  gzip -f "$LOGS"/trace_*.json 2>/dev/null
  pack
fi

if want swap; then
  note "## swap and offload (GPT-2 124M, batch 8)"
  # With clipping, a swapped run updates after the whole backward (the norm needs every gradient);
  # without, each sub-model's update overlaps the backward of the ones before it.
  swap="--set memory.swap=true --set memory.device_budget_gb=${SWAP_BUDGET_GB:-3.5}"
  for run in "resident|" "swap|$swap" "swap_noclip|$swap --set optim.grad_clip=0" \
             "zero3_offload|--nproc 1 --set parallel.zero_stage=3 --set parallel.offload=true" \
             "zero3_offload_noclip|--nproc 1 --set parallel.zero_stage=3 --set parallel.offload=true --set optim.grad_clip=0" \
             "zero2_offload|--nproc 1 --set parallel.zero_stage=2 --set parallel.offload=true"; do
    name="${run%%|*}"
    step "bench $name" 75 "swap_$name.log" "$BIN" bench $(gpt2) --set train.batch_size=8 ${run#*|} --steps 5 --warmup 2 --json
    tail -1 "$LOGS/swap_$name.log" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print("  ", {k: d[k] for k in d if k not in ("step_s", "setup_by_rank")})' 2>/dev/null | tee -a "$SUMMARY"
  done
  pack
fi

if want pipeline; then
  note "## pipeline stage times (GPT-2 124M, micro-batch 8 x 1024)"
  for cut in layers profile; do
    for s in 1f1b zbh1; do
      step "pipeline --model $s pp 4, pp_cut $cut" 60 "pipeline_${s}_$cut.log" "$BIN" pipeline --model gpt2_124m \
           --set train.device=cuda --set precision.dtype=bf16 --set train.batch_size=8 --set train.seq_len=1024 \
           --set data.path=unused --set parallel.pp_cut=$cut --schedule $s --pp 4 --microbatches 8
      grep -iE "stage|predicted|bubble" "$LOGS/pipeline_${s}_$cut.log" | head -12 | tee -a "$SUMMARY"
    done
  done
  pack
fi

if want lasp; then
  note "## lasp (one process, batch 1, GPT-2 124M shape)"
  for t in ${LASP_SEQS:-4096 8192 16384 32768}; do
    for arch in linear gpt; do
      step "bench $arch seq $t" 60 "lasp_${arch}_$t.log" "$BIN" bench $(gpt2) --set model.arch=$arch --set model.block_size=$t \
           --set train.seq_len=$t --set train.batch_size=1 --steps 4 --warmup 2
      tail -3 "$LOGS/lasp_${arch}_$t.log" | head -2 | tee -a "$SUMMARY"
    done
  done
  pack
fi

if want ab; then
  note "## ab (GPT-2 124M, bf16, sequence 1024; tessera bench --steps 10 --warmup 3, alternating)"
  for archive in "$ROOT"/.gpu_baseline/prebuilt_*.tgz; do
    [ -f "$archive" ] || { note "- no .gpu_baseline/prebuilt_<commit>.tgz carried"; break; }
    base="${archive##*/prebuilt_}"; base="${base%.tgz}"
    mkdir -p "$WORK/base_$base" && tar xzf "$archive" -C "$WORK/base_$base"
    for r in $(seq "${AB_ROUNDS:-3}"); do
      for b in 16 64; do
        for who in "$base|$WORK/base_$base/tessera" "head|$BIN"; do
          TESSERA_CONFIG_DIR="$ROOT/configs" step "ab ${who%%|*} batch $b round $r" 40 "ab_${who%%|*}_b${b}_r$r.log" "${who#*|}" bench $(gpt2) \
               --set train.batch_size=$b --steps 10 --warmup 3
          tail -3 "$LOGS/ab_${who%%|*}_b${b}_r$r.log" | head -1 | tee -a "$SUMMARY"
        done
      done
    done
  done
  pack
fi

note "- done at $(date -u +%T), $SECONDS s"
pack
