#!/usr/bin/env bash
# Old checkpoints keep working: a checkpoint written by an older build (default 806357a, issue 51's
# base) at tp 2 x pp 2 x dp 2 with ZeRO-3, 8 ranks, resumed at step 3 by this tree's build/tessera
# on one process and at the same 3D layout, each against this build's uninterrupted one-process run
# of the same global batch: losses and gradient norms of steps 4-6.
#
#   bash bench/old_checkpoint_resume.sh [REV] [WORK]     (defaults: 806357a, /tmp/old_checkpoint)
#
# Builds REV's `tessera` in a git worktree (WORK/tree; minutes), then trains tiny models. Prints the
# comparison; the runs stay in WORK.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REV="${1:-806357a}"
W="$(realpath -m "${2:-/tmp/old_checkpoint}")"
V="$(bash "$REPO/scripts/install.sh" | sed -n 's/^TESSERA_VENV=//p')"
NEW="$REPO/build/tessera"
[ -x "$NEW" ] || { echo "old_checkpoint_resume: build this tree first (make build)" >&2; exit 1; }
if [ ! -d "$W/tree" ]; then
  mkdir -p "$W"
  git -C "$REPO" worktree add -f "$W/tree" "$REV" -q
fi
OLD="$W/tree/build/tessera"
[ -f "$W/tree/build/build.ninja" ] || cmake -S "$W/tree" -B "$W/tree/build" -G Ninja -DTESSERA_PYTHON="$V/bin/python" > "$W/configure.log" 2>&1
ninja -C "$W/tree/build" tessera > "$W/build.log" 2>&1
rm -rf "$W/data" "$W/three_d_old" "$W/full" "$W/one" "$W/again3d"
$NEW prepare --input "$REPO/data/kjv/genesis_to_ruth.txt" --out $W/data > /dev/null
M="--set data.path=$W/data --set model.n_layer=4 --set model.n_embd=32 --set model.n_head=2 --set model.block_size=32 --set train.batch_size=2 --set train.seq_len=32 --set train.log_every=1 --set train.threads=1 --set eval.batches=2 --set optim.warmup_steps=2 --set model.dropout=0 --set train.steps=6 --set eval.every=0"
$OLD train --config tiny_gpt --nproc 8 --set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2 --set parallel.zero_stage=3 $M --set train.grad_accum=2 --set checkpoint.every=3 --set checkpoint.keep=0 --out $W/three_d_old > $W/old.log 2>&1
$NEW train --config tiny_gpt $M --set train.grad_accum=4 --out $W/full > $W/full.log 2>&1
$NEW train --resume $W/three_d_old/checkpoints/step_3 --set parallel.tp=1 --set parallel.pp=1 --set parallel.dp=0 --set parallel.zero_stage=0 --set train.grad_accum=4 --out $W/one > $W/one.log 2>&1
$NEW train --resume $W/three_d_old/checkpoints/step_3 --nproc 8 --out $W/again3d > $W/again3d.log 2>&1
W="$W" REV="$REV" python3 - <<'PY'
import json, os
W = os.environ["W"]
def read(d):
    out={}
    for l in open(f"{W}/{d}/metrics.jsonl"):
        j=json.loads(l)
        if "loss" in j: out[j["step"]]=(j["loss"],j["grad_norm"])
    return out
full=read("full")
print(f"tp2 x pp2 x dp2 ZeRO-3 run by {os.environ['REV']}:", {k:round(v[0],6) for k,v in read("three_d_old").items()})
for d in ("one","again3d"):
    r=read(d)
    print(d, "steps", sorted(r))
    for s in sorted(r):
        print(f"  step {s}: loss {r[s][0]:.6f} vs uninterrupted {full[s][0]:.6f} (diff {abs(r[s][0]-full[s][0]):.1e}); grad_norm {r[s][1]:.6f} vs {full[s][1]:.6f} (diff {abs(r[s][1]-full[s][1]):.1e})")
PY
echo "the worktree stays registered: git worktree remove --force $W/tree when done"
