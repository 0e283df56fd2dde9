#!/usr/bin/env bash
# Gathers what a CMake configure and build of tessera needs besides libtorch into one folder, for
# a machine that has torch, a compiler, CMake and ninja but no Debian packages and no network (the
# lent GPU machine: docs/gpu.md).
#
#   scripts/gpu_bundle.sh [DIR]        (default DIR: .gpu_bundle in the repository root, git-ignored)
#
# The folder is a small install prefix copied from this machine's Debian packages: the headers of
# toml++, CLI11, nlohmann-json, GoogleTest/GoogleMock and Gloo (c10d's ProcessGroupGloo.hpp includes
# Gloo's; the wheel has none), their CMake package files (relocatable: each finds its prefix from
# its own location), GoogleTest's static libraries and toml++'s shared library. Point a configure
# at it with -DTESSERA_BUNDLE=DIR (CMakeLists.txt): it is searched ahead of the system, and the
# check below proves it is enough on its own.
#
#   scripts/gpu_bundle.sh --check [DIR]
#
# then proves the folder is enough: in a private mount namespace (unshare; needs root) where this
# machine's own copies of those packages are hidden, it configures a TESSERA_CUDA=ON build from DIR
# alone and builds the `tessera` binary and the gpu-labelled test programs in build-gpu-check/. A
# header or package the bundle lacks fails here instead of on the GPU machine.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CHECK=0
if [ "${1:-}" = "--check" ]; then CHECK=1; shift; fi
DIR="$(realpath -m "${1:-$ROOT/.gpu_bundle}")"

# The packages copied below come from it; its venv configures the check.
VENV="$(bash "$ROOT/scripts/install.sh" | sed -n 's/^TESSERA_VENV=//p')"
ARCH="$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)"

# Each package's files under these folders are copied to DIR with /usr stripped; libraries are
# copied as files (links dereferenced) so the folder survives a transfer that keeps no links.
PACKAGES=(libtomlplusplus-dev libtomlplusplus3 libcli11-dev nlohmann-json3-dev libgtest-dev libgmock-dev libgloo-dev)
KEEP="^/usr/(include/|share/cmake/(CLI11|nlohmann_json)/|lib/$ARCH/(cmake/|libtomlplusplus\.so|libg(test|mock)))"

rm -rf "$DIR"
mkdir -p "$DIR"
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Package} ${Version}\n' "$pkg" >>"$DIR/MANIFEST"
  while IFS= read -r path; do
    [[ "$path" =~ $KEEP ]] || continue
    [ -d "$path" ] && [ ! -L "$path" ] && continue
    dest="$DIR/${path#/usr/}"
    mkdir -p "$(dirname "$dest")"
    cp -L "$path" "$dest"
  done < <(dpkg -L "$pkg")
done
echo "$(find "$DIR" -type f | wc -l) files, $(du -sh "$DIR" | cut -f1) in $DIR (packages: $DIR/MANIFEST)"

[ "$CHECK" = 1 ] || exit 0

# Every system copy of a bundled package: a folder is hidden under an empty one, a file under
# /dev/null, for the check's processes only.
HIDE=(/usr/include/{toml++,CLI,nlohmann,gtest,gmock,gloo} /usr/share/cmake/{CLI11,nlohmann_json,Gloo}
      /usr/lib/"$ARCH"/cmake/{GTest,tomlplusplus} /usr/lib/"$ARCH"/lib{tomlplusplus.so.3.3.0,gtest.a,gtest_main.a,gmock.a,gmock_main.a})
CHECK_BUILD="$ROOT/build-gpu-check"
EMPTY="$(mktemp -d)"
export ROOT DIR VENV CHECK_BUILD EMPTY
unshare -m bash -euo pipefail -c '
  for p in '"${HIDE[*]}"'; do
    if [ -d "$p" ]; then mount --bind "$EMPTY" "$p"; elif [ -e "$p" ]; then mount --bind /dev/null "$p"; fi
  done
  cmake -S "$ROOT" -B "$CHECK_BUILD" -G Ninja -DTESSERA_PYTHON="$VENV/bin/python" -DTESSERA_CUDA=ON -DTESSERA_BUNDLE="$DIR"
  cmake --build "$CHECK_BUILD" --target tessera test_gpu test_gpu_nccl
' || { echo "gpu_bundle: building from $DIR alone FAILED (above)"; exit 1; }
rmdir "$EMPTY"
echo "gpu_bundle: configured and built tessera, test_gpu and test_gpu_nccl (TESSERA_CUDA=ON) from $DIR alone in $CHECK_BUILD"
