#!/usr/bin/env bash
# Builds a libFuzzer target of tests/fuzz/ with clang (-fsanitize=fuzzer,address,undefined) against
# the torch of tessera's venv and runs it from its seed corpus for RUNS executions (default 10^6),
# or for at most SECONDS when given (whichever comes first; `make test` gives 3).
# TESSERA_FUZZ_OPT is the optimisation level (default -O1). `make test` builds with -O0: its 3-second
# runs replay the seed corpus and explore briefly, and the 12 targets build in 70% of the -O1 time
# (a torch-heavy source in 40%), but run a fifth as many inputs a second (safetensors 16,037 inputs
# in 5 s against 88,501); the long runs of docs/reliability.md use -O1.
# Findings (crashing inputs) land in $TESSERA_FUZZ_DIR/<opt>/<target>/findings (default build/fuzz);
# the corpus it grows there is not kept. Exits 77 (CTest's skip) without clang++.
#   usage: tests/fuzz/run.sh TARGET [RUNS [SECONDS]]      e.g. tests/fuzz/run.sh safetensors 1000000
set -euo pipefail
cd "$(dirname "$0")/../.."
target=${1:?usage: tests/fuzz/run.sh TARGET [RUNS [SECONDS]]}
runs=${2:-1000000}
seconds=${3:-0}
command -v clang++ >/dev/null || { echo "no clang++: fuzz target $target not built" >&2; exit 77; }
opt=${TESSERA_FUZZ_OPT:--O1}
case $opt in -O0|-O1|-O2) ;; *) echo "TESSERA_FUZZ_OPT is -O0, -O1 or -O2, not '$opt'" >&2; exit 2 ;; esac
builds=${TESSERA_FUZZ_DIR:-build/fuzz}/${opt#-}
out=$builds/$target
mkdir -p "$out/findings" "$out/corpus"
sources=(tests/fuzz/fuzz_$target.cpp)
flags=()
libs=()
# Targets whose sources do not include torch (uses_torch=0) compile without torch's headers and
# link without libtorch: a source then compiles in 1-2 s less, and a run skips libtorch's start.
uses_torch=1
# Header folders whose changes rebuild the target (as do its sources and this script).
watched=(src/checkpoint src/config src/core src/parallel/pipeline src/atom src/data src/model)
case $target in
  safetensors) sources+=(src/checkpoint/safetensors.cpp src/core/fs.cpp) ;;
  schedule_csv) sources+=(src/parallel/pipeline/schedule.cpp src/parallel/pipeline/validate.cpp
                          src/parallel/pipeline/simulate.cpp src/core/fs.cpp)
                uses_torch=0 ;;
  region) sources+=(src/checkpoint/region.cpp) ;;
  checkpoint_dir) sources+=(src/checkpoint/checkpoint.cpp src/checkpoint/checkpoint_read.cpp
                            src/checkpoint/checkpoint_files.cpp src/checkpoint/safetensors.cpp src/checkpoint/region.cpp
                            src/core/fs.cpp src/core/fault_injection.cpp) ;;
  # toml++'s internal assertions are compiled out as in tessera's release build (GCC, NDEBUG: there
  # they check nothing and assume nothing); its unreachable points stay, and UBSan reports them.
  config) sources+=(src/config/config.cpp src/core/options.cpp src/core/parallel_dims.cpp src/data/data_options.cpp
                    src/optim/optim_options.cpp src/precision/precision_options.cpp src/core/fs.cpp src/model/model_options.cpp
                    src/core/resource_dir.cpp)
          flags+=("-DTOML_ASSERT(expr)=static_assert(true)") ;;
  cluster) sources+=(src/plan/cluster.cpp src/plan/matmul_table.cpp src/core/options.cpp src/core/fs.cpp src/core/resource_dir.cpp)
           flags+=("-DTOML_ASSERT(expr)=static_assert(true)")
           watched+=(src/plan)
           uses_torch=0 ;;
  token_files) sources+=(src/data/token_stream.cpp src/data/token_file.cpp src/core/fs.cpp) ;;
  tokenizer) sources+=(src/data/tokenizer.cpp src/data/byte_level_bpe.cpp src/data/gpt2_bpe.cpp src/data/hf_tokenizer.cpp
                       src/data/regex_split.cpp src/data/sentencepiece.cpp src/data/byte_tokenizer.cpp src/core/fs.cpp)
             flags+=(-DTESSERA_TOKENIZERS=1)
             libs+=(-lpcre2-8 -lutf8proc)
             uses_torch=0 ;;
  hf_folder) sources+=(src/model/hf_gpt2.cpp src/model/hf_llama.cpp src/model/hf_names.cpp src/model/model_options.cpp src/model/norm.cpp
                       src/model/fused_layer_norm.cpp src/model/linear.cpp src/checkpoint/region.cpp
                       src/checkpoint/safetensors.cpp src/core/fs.cpp src/core/options.cpp) ;;
  swarm_messages) sources+=(src/atom/messages.cpp src/atom/robust_aggregation.cpp src/atom/peer_record.cpp src/atom/swarm_key.cpp src/core/fs.cpp)
                  libs+=(-lcrypto) ;;
  swarm_wire) sources+=(src/atom/wire.cpp src/atom/swarm_key.cpp src/core/fs.cpp)
              libs+=(-lssl -lcrypto)
              uses_torch=0 ;;
  file_transfer) sources+=(src/comm/file_receiver.cpp)
                 watched+=(src/comm) ;;
  *) echo "unknown fuzz target '$target' (safetensors, schedule_csv, region, checkpoint_dir, config, cluster, tokenizer,
     token_files, hf_folder, swarm_messages, swarm_wire, file_transfer)" >&2
     exit 2 ;;
esac
# The torch package directory: TESSERA_TORCH_ROOT (CTest passes the build's), or asked of the venv's
# python (about 2 s: importing torch).
torch=${TESSERA_TORCH_ROOT:-}
if [ "$uses_torch" = 1 ] && [ -z "$torch" ]; then
  python=${TESSERA_PYTHON:-$(ls -d "$HOME"/.cache/tessera/venv-torch-* | tail -1)/bin/python}
  torch=$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
fi
if [ ! -x "$out/fuzz" ] || [ -n "$(find "${sources[@]}" "${watched[@]}" -name '*.h' -newer "$out/fuzz")" ] ||
   [ -n "$(find "${sources[@]}" tests/fuzz/run.sh -newer "$out/fuzz")" ]; then
  echo "building $out/fuzz (clang, libFuzzer + ASan + UBSan)"
  # One object per source, through ccache where there is one (with the build's settings, so that a
  # fresh clone hits this machine's entries and targets sharing a source compile it once). -g1:
  # line tables are all a finding's stack trace needs, and they compile about 20% faster than -g.
  # torch's headers come precompiled, with their templates instantiated once (one header for every
  # target at this level, built under a lock since CTest runs two targets at once): a torch-heavy
  # source then compiles in about 60% of the time (clang 14, this machine; a source without torch
  # loses a second). The header is rebuilt only for another torch, and has no timestamp, so that
  # ccache can hash it.
  compile=(-std=c++17 "$opt" -g1 -fdebug-prefix-map="$PWD"=. -fsanitize=fuzzer-no-link,address,undefined
           -fno-sanitize-recover=undefined -D_GLIBCXX_USE_CXX11_ABI=1 -Isrc)
  torch_compile=(-isystem "$torch/include" -isystem "$torch/include/torch/csrc/api/include")
  torch_link=(-L"$torch/lib" -Wl,-rpath,"$torch/lib" -ltorch_cpu -lc10)
  pch=$builds/pch
  [ "$uses_torch" = 1 ] || { torch_compile=(); torch_link=(); }
  if [ "$uses_torch" = 1 ]; then
    mkdir -p "$pch"
    (
      flock 9
      if [ ! -f "$pch/torch.h.pch" ] || [ "$(cat "$pch/torch_root" 2>/dev/null)" != "$torch" ]; then
        echo "building $pch/torch.h.pch (torch's headers for every fuzz target)"
        printf '#include <torch/torch.h>\n' >"$pch/torch.h"
        clang++ "${compile[@]}" "${torch_compile[@]}" -fpch-instantiate-templates -Xclang -fno-pch-timestamp -x c++-header \
          "$pch/torch.h" -o "$pch/torch.h.pch.tmp"
        mv "$pch/torch.h.pch.tmp" "$pch/torch.h.pch"
        echo "$torch" >"$pch/torch_root"
      fi
    ) 9>"$pch/lock"
  fi
  cc=(clang++)
  command -v ccache >/dev/null &&
    cc=(env CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1 CCACHE_SLOPPINESS=pch_defines,time_macros ccache clang++)
  objects=()
  mkdir -p "$out/obj"
  for source in "${sources[@]}"; do
    object=$out/obj/${source//\//_}.o
    if [ "$uses_torch" = 1 ]; then
      "${cc[@]}" "${compile[@]}" "${torch_compile[@]}" -include-pch "$pch/torch.h.pch" "${flags[@]}" -c "$source" -o "$object"
    else
      "${cc[@]}" "${compile[@]}" "${flags[@]}" -c "$source" -o "$object"
    fi
    objects+=("$object")
  done
  linker=()
  command -v ld.lld >/dev/null && linker=(-fuse-ld=lld)  # 0.4 s a link against GNU ld's 1.9
  clang++ "${linker[@]}" -fsanitize=fuzzer,address,undefined "${objects[@]}" "${torch_link[@]}" "${libs[@]}" -o "$out/fuzz"
fi
cp -n tests/fuzz/corpus/$target/* "$out/corpus/" 2>/dev/null || true
ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 \
  "$out/fuzz" -runs="$runs" -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=4096 -artifact_prefix="$out/findings/" \
  -print_final_stats=1 "$out/corpus"
