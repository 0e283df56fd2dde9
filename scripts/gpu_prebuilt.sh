#!/usr/bin/env bash
# Builds, on this machine, what a lent GPU machine runs (docs/gpu.md), and packs it into one archive
# that a device call carries: the machine has no Debian packages, and a build there would cost
# minutes of a 15-minute lease.
#
#   scripts/gpu_prebuilt.sh [BUILD] [DIR]     (defaults: build-gpu, .gpu_prebuilt; both ignored)
#
# BUILD is configured with TESSERA_CUDA=ON (and the venv scripts/install.sh makes) unless it
# already is. The archive DIR/prebuilt.tgz holds, flat, the `tessera` binary, the gpu-labelled test
# programs and tessera_profile_step, stripped, and in lib/ every shared library they load that the
# GPU machine's image does not provide (OpenDHT and its dependencies, toml++): not glibc, libstdc++
# or libgcc_s, and not torch's or NVIDIA's libraries, which scripts/gpu_lease.sh finds in the
# machine's own torch. The binaries and the copied libraries look in $ORIGIN/lib and $ORIGIN
# (patchelf). DIR/COMMIT names the commit built. DIR/BUILD_PATH names BUILD: the test programs find `tessera` and the sources at the
# paths compiled into them, so gpu_lease.sh unpacks the archive there (linking this checkout's path
# to the repository on the GPU machine).
#
# Also trains `make train`'s run on this machine's CPU (configs/tiny_gpt.toml, 600 steps, with the
# CPU build in build/, or BUILD's tessera where build/ has none) into DIR/reference_cpu, the run a CUDA run's validation loss is held to.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
command -v patchelf >/dev/null || { echo "gpu_prebuilt: needs patchelf (apt-get install patchelf)" >&2; exit 1; }
BUILD="$(realpath -m "${1:-$ROOT/build-gpu}")"
DIR="$(realpath -m "${2:-$ROOT/.gpu_prebuilt}")"
TARGETS=(tessera test_gpu test_gpu_nccl test_data_parallel test_compression tessera_profile_step)

if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  VENV="$(bash "$ROOT/scripts/install.sh" | sed -n 's/^TESSERA_VENV=//p')"
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DTESSERA_PYTHON="$VENV/bin/python" -DTESSERA_CUDA=ON
fi
cmake --build "$BUILD" --target "${TARGETS[@]}"
STAGE="$(mktemp -d)"
mkdir -p "$STAGE/lib"
for t in "${TARGETS[@]}"; do
  f="$(find "$BUILD" -name "$t" -type f -perm -u+x | head -1)"
  [ -n "$f" ] || { echo "gpu_prebuilt: $t not found under $BUILD" >&2; exit 1; }
  cp "$f" "$STAGE/$t"
  strip --strip-unneeded "$STAGE/$t"
  patchelf --set-rpath '$ORIGIN/lib' "$STAGE/$t"
done

# Libraries to copy: resolved here, and neither the C/C++ runtime nor torch's or NVIDIA's own (tessera's
# kernels link the toolkit's libcudart here; there they load the one torch's nvidia-cuda-runtime carries).
SKIP='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libstdc\+\+|libgcc_s|libcudart)'
for t in "${TARGETS[@]}"; do ldd "$STAGE/$t"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    [[ "$name" =~ $SKIP ]] && continue
    [[ "$path" == */site-packages/torch/* || "$path" == */site-packages/nvidia/* ]] && continue
    cp -L "$path" "$STAGE/lib/$name"
    patchelf --set-rpath '$ORIGIN' "$STAGE/lib/$name"
  done

rm -rf "$DIR"
mkdir -p "$DIR"
tar czf "$DIR/prebuilt.tgz" -C "$STAGE" .
echo "$BUILD" >"$DIR/BUILD_PATH"
# The commit built ("-dirty" with uncommitted changes): the GPU machine's copy of the repository
# may carry another HEAD, so gpu_lease.sh names this one in its summary.
{ git -C "$ROOT" rev-parse --short HEAD; git -C "$ROOT" diff --quiet HEAD -- src tests || echo dirty; } |
  paste -sd- >"$DIR/COMMIT"
rm -rf "$STAGE"
echo "gpu_prebuilt: $(tar tzf "$DIR/prebuilt.tgz" | grep -c '^\./lib/.') libraries, $(du -h "$DIR/prebuilt.tgz" | cut -f1) in $DIR/prebuilt.tgz"

# The CPU reference run, with the CPU build `make` keeps in build/ (or, where there is none yet, this
# build's tessera on the CPU: the same code).
CPU_TESSERA="$ROOT/build/tessera"
[ -x "$CPU_TESSERA" ] || CPU_TESSERA="$BUILD/tessera"
"$CPU_TESSERA" prepare --input "$ROOT/data/kjv/genesis_to_ruth.txt" --out "$DIR/kjv" --tokenizer byte >/dev/null
"$CPU_TESSERA" train --config "$ROOT/configs/tiny_gpt.toml" --set data.path="$DIR/kjv" --set train.device=cpu \
  --set checkpoint.every=300 --set checkpoint.keep=4 --out "$DIR/reference_cpu" --overwrite >"$DIR/reference_cpu.log" 2>&1
rm -rf "$DIR/kjv" "$DIR/reference_cpu/checkpoints"
echo "gpu_prebuilt: CPU reference run in $DIR/reference_cpu ($(tail -1 "$DIR/reference_cpu.log"))"
