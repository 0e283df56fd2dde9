#!/usr/bin/env bash
# Installs what tessera needs to build and test, once; a second run only checks and returns.
#
#   Debian packages: compiler and LLVM's linker, CMake, ninja, ccache, toml++, CLI11, nlohmann-json, GoogleTest,
#   Gloo headers (c10d's Gloo backend is compiled into libtorch; its header needs them), OpenDHT
#   and OpenSSL (the ATOM swarm's DHT and its key's HMAC), protobuf (TensorBoard's event files).
#   PCRE2 and utf8proc (Hugging Face tokenizers: pre-tokenizer patterns, NFC), pkgconf (CMake finds
#   OpenDHT, PCRE2 and utf8proc through pkg-config). clang and its runtime libraries
#   (libclang-rt-dev, only a Recommends of clang, which --no-install-recommends leaves out):
#   `make test` builds the fuzz targets with libFuzzer and the sanitizers (tests/fuzz/run.sh).
#   A truly bare Debian 12 (debootstrap's minbase) lacks pkgconf and the runtime: docs/build.md.
#   libtorch:        the pinned `torch` wheel from PyPI, in a virtual environment outside the
#                    clone ($TESSERA_DEPS, default ~/.cache/tessera) so that every clone and
#                    every CI run on this machine reuses it. The same environment gives the
#                    Python `torch` that computes golden tensors and runs the benchmark peer.
#   transformers:    pinned, in the same environment: the reference the Hugging Face import and
#                    export tests compare with (tests/hf/).
#   tensorboard:     pinned, in the same environment: its reader is the reference the event-file
#                    test reads tessera's files back with (tests/tensorboard/test_tensorboard.py).
#   sentencepiece:   pinned, in the same environment: the reference tessera's SentencePiece reader
#                    is compared with (tests/hf/make_tokenizer_references.py).
#
# On a bare machine the Debian packages and the venv are installed at the same time (one waits on
# dpkg, the other on the torch wheel's download and unpacking): that overlap is most of what
# keeps `make train` from a bare machine under its 10 minutes (docs/build.md).
#
# Prints the environment's location on its last line as TESSERA_VENV=<path>.
set -euo pipefail

TORCH_VERSION="2.11.0"
TRANSFORMERS_VERSION="5.23.0"
TENSORBOARD_VERSION="2.21.0"
DEPS="${TESSERA_DEPS:-$HOME/.cache/tessera}"
VENV="$DEPS/venv-torch-$TORCH_VERSION"
STAMP="$VENV/.tessera-installed"
TRANSFORMERS_STAMP="$VENV/.tessera-transformers-$TRANSFORMERS_VERSION"
TENSORBOARD_STAMP="$VENV/.tessera-tensorboard-$TENSORBOARD_VERSION"
SENTENCEPIECE_VERSION="0.2.3"
SENTENCEPIECE_STAMP="$VENV/.tessera-sentencepiece-$SENTENCEPIECE_VERSION"

SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing() { local out=(); for pkg in "$@"; do have_pkg "$pkg" || out+=("$pkg"); done; echo "${out[@]:-}"; }
apt_updated=0
apt_install() {
  [ -n "$*" ] || return 0
  echo "[install] Debian packages: $*"
  [ "$apt_updated" = 1 ] || $SUDO apt-get update -qq
  apt_updated=1
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# The venv needs Python first; the build's packages can come while the wheel downloads.
apt_install $(missing python3 python3-venv python3-pip)
build_pkgs=$(missing g++ lld clang libclang-rt-dev cmake ninja-build ccache make pkgconf libtomlplusplus-dev libcli11-dev \
                     nlohmann-json3-dev \
                     libgtest-dev libgmock-dev libgloo-dev libopendht-dev libssl-dev libprotobuf-dev protobuf-compiler \
                     libpcre2-dev libutf8proc-dev)
apt_pid=""
if [ -n "$build_pkgs" ]; then
  apt_install $build_pkgs &
  apt_pid=$!
fi

pip_install() { "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@"; }
if [ ! -f "$STAMP" ]; then
  echo "[install] torch==$TORCH_VERSION, transformers, tensorboard into $VENV (first time only; about 5 GB)"
  mkdir -p "$DEPS"
  rm -rf "$VENV"
  # Debian's python3 is the reference interpreter; any python3 >= 3.10 with venv works.
  python3 -m venv "$VENV"
  pip_install "torch==$TORCH_VERSION" numpy "transformers==$TRANSFORMERS_VERSION" "tensorboard==$TENSORBOARD_VERSION" \
              "sentencepiece==$SENTENCEPIECE_VERSION"
  "$VENV/bin/python" -c "import torch; assert torch.__version__.startswith('$TORCH_VERSION'), torch.__version__"
  touch "$STAMP" "$TRANSFORMERS_STAMP" "$TENSORBOARD_STAMP" "$SENTENCEPIECE_STAMP"
fi
# Added after the environment first existed: each checked on its own so that an old venv gains it.
if [ ! -f "$TRANSFORMERS_STAMP" ]; then
  echo "[install] transformers==$TRANSFORMERS_VERSION into $VENV (first time only)"
  pip_install "transformers==$TRANSFORMERS_VERSION"
  "$VENV/bin/python" -c "import transformers; assert transformers.__version__ == '$TRANSFORMERS_VERSION'"
  touch "$TRANSFORMERS_STAMP"
fi
if [ ! -f "$TENSORBOARD_STAMP" ]; then
  echo "[install] tensorboard==$TENSORBOARD_VERSION into $VENV (first time only)"
  pip_install "tensorboard==$TENSORBOARD_VERSION"
  touch "$TENSORBOARD_STAMP"
fi
if [ ! -f "$SENTENCEPIECE_STAMP" ]; then
  echo "[install] sentencepiece==$SENTENCEPIECE_VERSION into $VENV (first time only)"
  pip_install "sentencepiece==$SENTENCEPIECE_VERSION"
  touch "$SENTENCEPIECE_STAMP"
fi
if [ -n "$apt_pid" ]; then
  wait "$apt_pid" || { echo "[install] the Debian packages failed to install: $build_pkgs" >&2; exit 1; }
fi
echo "TESSERA_VENV=$VENV"
