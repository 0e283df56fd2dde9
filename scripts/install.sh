#!/usr/bin/env bash
# Installs what tessera needs to build and test, once; a second run only checks and returns.
#
#   Debian packages: compiler, CMake, ninja, ccache, toml++, CLI11, nlohmann-json, GoogleTest,
#   Gloo headers (c10d's Gloo backend is compiled into libtorch; its header needs them), OpenDHT
#   and OpenSSL (the ATOM swarm's DHT and its key's HMAC).
#   libtorch:        the pinned `torch` wheel from PyPI, in a virtual environment outside the
#                    clone ($TESSERA_DEPS, default ~/.cache/tessera) so that every clone and
#                    every CI run on this machine reuses it. The same environment gives the
#                    Python `torch` that computes golden tensors and runs the benchmark peer.
#   transformers:    pinned, in the same environment: the reference the Hugging Face import and
#                    export tests compare with (tests/hf/).
#
# Prints the environment's location on its last line as TESSERA_VENV=<path>.
set -euo pipefail

TORCH_VERSION="2.11.0"
TRANSFORMERS_VERSION="5.23.0"
DEPS="${TESSERA_DEPS:-$HOME/.cache/tessera}"
VENV="$DEPS/venv-torch-$TORCH_VERSION"
STAMP="$VENV/.tessera-installed"

need_apt=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for pkg in g++ cmake ninja-build ccache make python3 python3-venv python3-pip \
           libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libgtest-dev libgmock-dev libgloo-dev libopendht-dev libssl-dev; do
  have_pkg "$pkg" || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "[install] Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if [ ! -f "$STAMP" ]; then
  echo "[install] torch==$TORCH_VERSION into $VENV (first time only; about 3 GB)"
  mkdir -p "$DEPS"
  rm -rf "$VENV"
  # Debian's python3 is the reference interpreter; any python3 >= 3.10 with venv works.
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "torch==$TORCH_VERSION" numpy
  "$VENV/bin/python" -c "import torch; assert torch.__version__.startswith('$TORCH_VERSION'), torch.__version__"
  touch "$STAMP"
fi
# Added after the environment first existed: checked on its own so that an old venv gains it.
TRANSFORMERS_STAMP="$VENV/.tessera-transformers-$TRANSFORMERS_VERSION"
if [ ! -f "$TRANSFORMERS_STAMP" ]; then
  echo "[install] transformers==$TRANSFORMERS_VERSION into $VENV (first time only)"
  "$VENV/bin/python" -m pip install -q "transformers==$TRANSFORMERS_VERSION"
  "$VENV/bin/python" -c "import transformers; assert transformers.__version__ == '$TRANSFORMERS_VERSION'"
  touch "$TRANSFORMERS_STAMP"
fi
echo "TESSERA_VENV=$VENV"
