#!/usr/bin/env bash
# The front door timed on a bare Debian 12: a new root made by debootstrap (minbase, with only git,
# make and ca-certificates: what a user needs to clone and type `make`), this repository cloned
# into it, then `make train` and `make test` run in a chroot, each timed. Nothing of this machine's
# own installs (packages, the venv, ccache) is visible inside, so every dependency comes through
# scripts/install.sh as it would for a new user; only the network's settings are copied in (the
# package sources, DNS, and any CA certificates under /usr/local/share/ca-certificates that this
# machine's network needs).
#
#   sudo bash scripts/bare_machine.sh [ROOT] [REV]    (defaults: /work/bare, HEAD)
#
# Prints the phase times and the last lines of each log; the logs stay in ROOT/root/*.log, the
# clone in ROOT/root/tessera. Run it alone: it uses both cores for about 15 minutes. Needs root
# (debootstrap, chroot, bind mounts) and about 12 GB of disk. The mounts are undone at the end.
set -euo pipefail

ROOT="$(realpath -m "${1:-/work/bare}")"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REV="${2:-$(git -C "$REPO" rev-parse HEAD)}"
[ "$(id -u)" -eq 0 ] || { echo "bare_machine: needs root (debootstrap, chroot)" >&2; exit 1; }
command -v debootstrap >/dev/null || { apt-get update -qq; apt-get install -y -qq debootstrap >/dev/null; }

unmount() { for d in dev/pts dev sys proc; do mountpoint -q "$ROOT/$d" && umount "$ROOT/$d"; done; return 0; }
if [ -e "$ROOT" ]; then
  unmount
  rm -rf "$ROOT"
fi
trap unmount EXIT

start=$(date +%s)
mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
debootstrap --variant=minbase --include=git,make,ca-certificates bookworm "$ROOT" "${mirror:-http://deb.debian.org/debian}" \
  > "$ROOT.debootstrap.log" 2>&1 || { tail -5 "$ROOT.debootstrap.log" >&2; exit 1; }
cp /etc/resolv.conf "$ROOT/etc/"
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
  rm -f "$ROOT/etc/apt/sources.list"
  cp /etc/apt/sources.list.d/debian.sources "$ROOT/etc/apt/sources.list.d/"
fi
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$ROOT/usr/local/share/ca-certificates/"
  chroot "$ROOT" update-ca-certificates >/dev/null 2>&1
fi
for d in proc sys dev dev/pts; do mount --bind "/$d" "$ROOT/$d"; done
git clone -q "$REPO" "$ROOT/root/tessera"
git -C "$ROOT/root/tessera" checkout -q "$REV"
echo "bare_machine: Debian 12 minbase in $ROOT ($(( $(date +%s) - start )) s), tessera at $(git -C "$ROOT/root/tessera" log -1 --format='%h %s' | cut -c1-70)"

run() {  # a target in the chroot, with a user's environment: no variable of this session's
  chroot "$ROOT" env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin TERM=xterm \
    PIP_DEFAULT_TIMEOUT=180 bash -c "cd /root/tessera && make $1" > "$ROOT/root/$1.log" 2>&1
}
status=0
train_start=$(date +%s)
for target in train test; do
  t0=$(date +%s)
  rc=0
  run "$target" || rc=$?
  t=$(( $(date +%s) - t0 ))
  printf 'bare_machine: make %s: exit %d after %d min %d s\n' "$target" "$rc" $((t / 60)) $((t % 60))
  tail -4 "$ROOT/root/$target.log" | sed 's/^/    /'
  [ "$rc" -eq 0 ] || status=1
done
# make train's phases, from the files each one leaves.
since() { [ -e "$1" ] && echo "$(( $(stat -c %Y "$1") - train_start )) s" || echo "not reached"; }
echo "bare_machine: make train's phases from its start: packages and venv installed $(since "$ROOT/root/.cache/tessera/venv-torch-2.11.0/.tessera-installed"), configured $(since "$ROOT/root/tessera/build/CMakeCache.txt"), tessera built $(since "$ROOT/root/tessera/build/tessera"), loss curves written $(since "$ROOT/root/tessera/runs/tiny_gpt/loss.svg")"
exit $status
