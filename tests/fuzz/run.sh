#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ with clang (-fsanitize=fuzzer,address,undefined) and
# runs one from its seed corpus for RUNS executions (default 10^6), or for at most SECONDS when given
# (whichever comes first; `make fuzz` gives FUZZ_SECONDS, 3 by default, to every target).
#   usage: tests/fuzz/run.sh TARGET [RUNS [SECONDS]]      e.g. tests/fuzz/run.sh safetensors 1000000
#          tests/fuzz/run.sh --build [TARGET ...]         builds them (all without a name)
#          tests/fuzz/run.sh --list                       names them
# `make test` does not run these: it replays every target's corpus with mutants in its own build
# (tests/fuzz/replay.cpp, CTest fuzz.<target>).
# Every target of one optimisation level is built by one ninja file (written here, under
# $TESSERA_FUZZ_DIR/<opt>/, default build/fuzz): every source is one object shared by the targets
# that link it, compiled with the same flags for all, rebuilt when it or a header it includes changes
# (clang's dependency files) or its command changes. A source that includes torch, directly or
# through tessera's headers, is compiled with torch's precompiled header; one that does not is
# compiled without torch (a precompiled header costs a torch-free source 1 s to load), and a
# target with no such source links without libtorch (a run then skips libtorch's start).
# TESSERA_FUZZ_OPT is the optimisation level (default -O1). `make fuzz` builds with -O0: its 3-second
# runs replay the seed corpus and explore briefly, and the targets build in 70% of the -O1 time
# (a torch-heavy source in 40%), but run a fifth as many inputs a second (safetensors 16,037 inputs
# in 5 s against 88,501); the long runs of docs/reliability.md use -O1.
# Findings (crashing inputs) land in $TESSERA_FUZZ_DIR/<opt>/<target>/findings; the corpus a run
# grows there is not kept. Exits 77 without clang++.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

# What each target links besides tests/fuzz/fuzz_<target>.cpp: its sources, then "--" and libraries.
declare -A target_inputs=(
  [safetensors]="src/checkpoint/safetensors.cpp src/core/fs.cpp"
  [schedule_csv]="src/parallel/pipeline/schedule.cpp src/parallel/pipeline/validate.cpp
                  src/parallel/pipeline/simulate.cpp src/core/fs.cpp"
  [region]="src/checkpoint/region.cpp"
  [checkpoint_dir]="src/checkpoint/checkpoint.cpp src/checkpoint/checkpoint_read.cpp src/checkpoint/checkpoint_files.cpp
                    src/checkpoint/safetensors.cpp src/checkpoint/region.cpp src/core/fs.cpp src/core/fault_injection.cpp
                    src/core/flat_tensors.cpp"
  [config]="src/config/config.cpp src/core/options.cpp src/core/parallel_dims.cpp src/data/data_options.cpp
            src/optim/optim_options.cpp src/precision/precision_options.cpp src/core/fs.cpp src/model/model_options.cpp
            src/core/resource_dir.cpp"
  [cluster]="src/plan/cluster.cpp src/plan/matmul_table.cpp src/core/options.cpp src/core/fs.cpp src/core/resource_dir.cpp"
  [token_files]="src/data/token_stream.cpp src/data/token_file.cpp src/core/fs.cpp"
  [tokenizer]="src/data/tokenizer.cpp src/data/byte_level_bpe.cpp src/data/gpt2_bpe.cpp src/data/hf_tokenizer.cpp
               src/data/regex_split.cpp src/data/sentencepiece.cpp src/data/byte_tokenizer.cpp src/core/fs.cpp
               -- -lpcre2-8 -lutf8proc"
  [hf_folder]="src/model/hf_gpt2.cpp src/model/hf_llama.cpp src/model/hf_names.cpp src/model/model_options.cpp
               src/model/norm.cpp src/model/rms_norm.cpp src/model/fused_layer_norm.cpp src/model/linear.cpp src/precision/autocast.cpp
               src/checkpoint/region.cpp src/checkpoint/safetensors.cpp src/core/fs.cpp src/core/options.cpp"
  [swarm_messages]="src/atom/messages.cpp src/atom/robust_aggregation.cpp src/atom/peer_record.cpp src/atom/swarm_key.cpp
                    src/core/fs.cpp src/core/flat_tensors.cpp -- -lcrypto"
  [swarm_wire]="src/atom/wire.cpp src/atom/swarm_key.cpp src/core/fs.cpp -- -lssl -lcrypto"
  [file_transfer]="src/comm/file_receiver.cpp"
)
all_targets=(safetensors schedule_csv region checkpoint_dir config cluster tokenizer token_files hf_folder
             swarm_messages swarm_wire file_transfer)

usage="usage: tests/fuzz/run.sh TARGET [RUNS [SECONDS]] | --build [TARGET ...] | --list"
if [ "${1:-}" = --list ]; then
  printf '%s\n' "${all_targets[@]}"
  exit 0
fi
build_only=0
if [ "${1:-}" = --build ]; then
  build_only=1
  shift
  targets=("$@")
  [ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")
else
  targets=("${1:?$usage}")
  runs=${2:-1000000}
  seconds=${3:-0}
fi
for target in "${targets[@]}"; do
  [ -n "${target_inputs[$target]+x}" ] || { echo "unknown fuzz target '$target' (${all_targets[*]})" >&2; exit 2; }
done
command -v clang++ >/dev/null || { echo "no clang++: fuzz targets ${targets[*]} not built" >&2; exit 77; }
opt=${TESSERA_FUZZ_OPT:--O1}
case $opt in -O0|-O1|-O2) ;; *) echo "TESSERA_FUZZ_OPT is -O0, -O1 or -O2, not '$opt'" >&2; exit 2 ;; esac
builds=${TESSERA_FUZZ_DIR:-$root/build/fuzz}/${opt#-}
mkdir -p "$builds"
builds=$(cd "$builds" && pwd)

# Whether a file includes torch's headers, itself or through the quoted includes it names (under
# src/ or beside it); conditional includes count.
declare -A includes_torch=()
uses_torch() {
  local file=$1 included
  if [ -z "${includes_torch[$file]+x}" ]; then
    includes_torch[$file]=1
    if grep -qE '^[[:space:]]*#[[:space:]]*include[[:space:]]*<(torch|ATen|c10)/' "$file"; then
      includes_torch[$file]=0
    else
      for included in $(sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1/p' "$file"); do
        local path=src/$included
        [ -f "$path" ] || path=$(dirname "$file")/$included
        if [ -f "$path" ] && uses_torch "$path"; then
          includes_torch[$file]=0
          break
        fi
      done
    fi
  fi
  return "${includes_torch[$file]}"
}

# The torch package directory: TESSERA_TORCH_ROOT where it is set, or asked of the venv's
# python (about 2 s: importing torch).
torch_root() {
  if [ -z "${TESSERA_TORCH_ROOT:-}" ]; then
    local python=${TESSERA_PYTHON:-$(ls -d "$HOME"/.cache/tessera/venv-torch-* | tail -1)/bin/python}
    TESSERA_TORCH_ROOT=$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
  fi
  echo "$TESSERA_TORCH_ROOT"
}

# The ninja file of every target (all of them, whichever are asked for: a source's object is the
# same for every target). -g1: line tables are all a finding's stack trace needs, and they compile
# about 20% faster than -g; at -O0 (make fuzz's 3-second runs) none, 9% less compile time (20.8 s
# against 18.9 of CPU for three sources, session 47): a finding there names its functions, and the
# -O1 build replaying it (tests/fuzz/run.sh TARGET 1, then build/fuzz/O1/TARGET/fuzz INPUT) its lines. Objects go through ccache where there is one, with the build's settings
# (a fresh clone hits this machine's entries). torch's headers come precompiled with their
# templates instantiated once, without a timestamp so that ccache can hash the header: a
# torch-heavy source then compiles in about 60% of the time (clang 14, this machine). toml++'s
# internal assertions are compiled out as in tessera's release build (GCC, NDEBUG: there they check
# nothing and assume nothing); its unreachable points stay, and UBSan reports them.
write_ninja() {
  local torch="" source object target objects libs with_torch
  local -a inputs
  local cxx=clang++
  command -v ccache >/dev/null &&
    cxx="env CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1 CCACHE_SLOPPINESS=pch_defines,time_macros ccache clang++"
  local debug=-g1
  [ "$opt" != -O0 ] || debug=-g0
  local linker=""
  command -v ld.lld >/dev/null && linker=-fuse-ld=lld  # 0.4 s a link against GNU ld's 1.9
  {
    echo "# Written by tests/fuzz/run.sh; run from the checkout's root (paths of sources relative to it)."
    echo "builddir = $builds"
    echo "cxx = $cxx"
    echo "cflags = -std=c++17 $opt $debug -fdebug-prefix-map=$root=. -fsanitize=fuzzer-no-link,address,undefined" \
         "-fno-sanitize-recover=undefined -D_GLIBCXX_USE_CXX11_ABI=1 -Isrc -DTESSERA_TOKENIZERS=1" \
         "'-DTOML_ASSERT(expr)=static_assert(true)'"
    echo "rule cxx"
    echo "  command = \$cxx \$cflags \$torch -MD -MF \$out.d -c \$in -o \$out"
    echo "  depfile = \$out.d"
    echo "  deps = gcc"
    echo "  description = clang++ \$in"
    echo "rule pch"
    echo "  command = \$cxx \$cflags \$torch -fpch-instantiate-templates -Xclang -fno-pch-timestamp -x c++-header" \
         "-MD -MF \$out.d \$in -o \$out"
    echo "  depfile = \$out.d"
    echo "  deps = gcc"
    echo "  description = torch's precompiled header"
    echo "rule link"
    echo "  command = clang++ $linker -fsanitize=fuzzer,address,undefined \$in \$libs -o \$out"
    echo "  description = link \$out"
    declare -A written=()
    for target in "${all_targets[@]}"; do
      read -r -d '' -a inputs <<<"${target_inputs[$target]}" || true
      objects=""
      libs=""
      with_torch=0
      local after_dashes=0
      for source in tests/fuzz/fuzz_$target.cpp "${inputs[@]}"; do
        if [ "$source" = -- ]; then after_dashes=1; continue; fi
        if [ $after_dashes = 1 ]; then libs+=" $source"; continue; fi
        object=$builds/obj/${source//\//_}.o
        objects+=" $object"
        if uses_torch "$source"; then
          with_torch=1
          if [ -z "$torch" ]; then
            torch=$(torch_root)
            printf '#include <torch/types.h>
#include <torch/utils.h>\n' >"$builds/torch.h"
            echo "build $builds/pch/torch.h.pch: pch $builds/torch.h"
            echo "  torch = -isystem $torch/include -isystem $torch/include/torch/csrc/api/include"
          fi
        fi
        [ -z "${written[$object]+x}" ] || continue
        written[$object]=1
        if uses_torch "$source"; then
          echo "build $object: cxx $source | $builds/pch/torch.h.pch"
          echo "  torch = -isystem $torch/include -isystem $torch/include/torch/csrc/api/include -include-pch $builds/pch/torch.h.pch"
        else
          echo "build $object: cxx $source"
        fi
      done
      [ $with_torch = 0 ] || libs="-L$torch/lib -Wl,-rpath,$torch/lib -ltorch_cpu -lc10$libs"
      echo "build $builds/$target/fuzz: link$objects"
      echo "  libs = $libs"
    done
  } >"$builds/build.ninja.new"
  if cmp -s "$builds/build.ninja.new" "$builds/build.ninja"; then
    rm "$builds/build.ninja.new"
  else
    mv "$builds/build.ninja.new" "$builds/build.ninja"
  fi
}

# One writer and one ninja at a time in a build folder (several runs of this script may build at once).
outputs=()
for target in "${targets[@]}"; do outputs+=("$builds/$target/fuzz"); done
(
  flock 9
  write_ninja
  ninja -f "$builds/build.ninja" -j "${TESSERA_FUZZ_JOBS:-$(nproc)}" "${outputs[@]}"
) 9>"$builds/lock"
[ $build_only = 0 ] || exit 0

out=$builds/$target
mkdir -p "$out/findings" "$out/corpus"
cp -n tests/fuzz/corpus/$target/* "$out/corpus/" 2>/dev/null || true
ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 \
  "$out/fuzz" -runs="$runs" -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=4096 -artifact_prefix="$out/findings/" \
  -print_final_stats=1 "$out/corpus"
