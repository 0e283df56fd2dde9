#!/usr/bin/env bash
# Pipeline bubble, measured against theory and the simulator (docs/pipeline.md): every built-in
# schedule at pp in {2, 4, 8} and m in {4, 8, 16} runs on pp local processes (Gloo on loopback)
# whose actions sleep their cost (F = I = W = UNIT ms, B = 2 UNIT; a chunk of interleaved, ZB-V
# and DualPipeV half that), so the bubble is the schedule's and the transport's, not the 2 cores'. Writes
# bench/results/pipeline_bubble_cpu.md.
#   usage: bench/pipeline_bubble.sh [BUILD_DIR] [UNIT_MS]
set -euo pipefail
build="${1:-build}"
unit="${2:-10}"
out=bench/results/pipeline_bubble_cpu.md
{
  echo "# Pipeline bubble: theory, simulator, measured (CPU, Gloo on loopback, sleeps of ${unit} ms per unit)"
  echo
  echo "Command: \`bench/pipeline_bubble.sh $build $unit\` on $(nproc) cores, $(date -u +%Y-%m-%d). Bubble = idle share of"
  echo "pp x step time. Theory: the schedule's formula for equal costs (interleaved, ZB-V and DualPipeV with 2 chunks per rank; DualPipeV has none)."
  echo "Simulated: the table replayed with those costs and no transfer time. Measured: the same table run by"
  echo "\`tessera pipeline --measure\`; its excess over the simulation is the transport (loopback Gloo sends and"
  echo "receives on the critical path) and timer overshoot."
  echo
  echo "| schedule | pp | m | theory | simulated | measured | measured - theory |"
  echo "|---|---|---|---|---|---|---|"
} > "$out"
for schedule in gpipe 1f1b interleaved zbh1 zbv dualpipev; do
  for pp in 2 4 8; do
    for m in 4 8 16; do
      costs=""
      case $schedule in interleaved|zbv|dualpipev) costs="--costs f=0.5,b=1,i=0.5,w=0.5" ;; esac
      if ! text=$("$build/tessera" pipeline --schedule $schedule --pp $pp --microbatches $m --measure "$unit" $costs 2>&1); then
        echo "| $schedule | $pp | $m | refused: $(echo "$text" | grep -m1 error: | sed 's/.*error: //; s/|/\\|/g') | | | |" >> "$out"
        continue
      fi
      simulated=$(echo "$text" | sed -n 's/.*step time .*; bubble \([0-9.]*\)%.*/\1/p' | head -1)
      measured=$(echo "$text" | sed -n 's/.*measured on .*bubble \([0-9.]*\)% (simulated.*/\1/p')
      theory=$(python3 -c "
p,m=$pp,$m
f={'gpipe':(p-1)/(m+p-1),'1f1b':(p-1)/(m+p-1),'interleaved':(p-1)/(2*m+p-1),
   'zbh1':(p-1)/(3*m+p-1) if m>=p else None,'zbv':(p-1)/(6*m+p-1) if m>=p else None,
   'dualpipev':None}['$schedule']
print('-' if f is None else '%.2f' % (100*f))")
      if [ "$theory" = "-" ]; then
        diff="-"; theory_cell="- (m < pp)"; [ "$schedule" = dualpipev ] && theory_cell="- (no formula)"
      else
        diff=$(python3 -c "print('%+.2f' % ($measured - $theory))"); theory_cell="$theory%"; fi
      echo "| $schedule | $pp | $m | $theory_cell | $simulated% | $measured% | $diff |" >> "$out"
      echo "$schedule pp=$pp m=$m: theory $theory simulated $simulated measured $measured"
    done
  done
done
echo "wrote $out"
