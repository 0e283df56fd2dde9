"""Starting `tessera peer` processes and reading their metrics, for the ATOM benchmarks
(atom_swarm.py, atom_slow_links.py, atom_churn.py, swarm_poison.py)."""
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def prepared_corpus(build):
    """The bundled corpus as byte tokens under BUILD/data/kjv (prepared once)."""
    data = os.path.join(build, "data", "kjv")
    if not os.path.exists(os.path.join(data, "train.bin")):
        subprocess.run([os.path.join(build, "tessera"), "prepare", "--input",
                        os.path.join(ROOT, "data/kjv/genesis_to_ruth.txt"), "--out", data, "--tokenizer", "byte"],
                       check=True, stdout=subprocess.DEVNULL)
    return data


def keygen(build, path):
    subprocess.run([os.path.join(build, "tessera"), "swarm", "keygen", "--out", path], check=True,
                   stdout=subprocess.DEVNULL)
    return path


def start_peer(command, out_dir, wait=True, env=None):
    """Starts one peer (`command`: its whole command line; `env`: added to its environment)
    writing to OUT_DIR.log (appended: a restarted peer keeps its earlier output); with `wait`,
    returns once it listens. Returns (process, its HOST:PORT or None)."""
    log_path = out_dir + ".log"
    start = os.path.getsize(log_path) if os.path.exists(log_path) else 0
    proc = subprocess.Popen(command, stdout=open(log_path, "a"), stderr=subprocess.STDOUT,
                            env=dict(os.environ, **(env or {})))
    if not wait:
        return proc, None
    for _ in range(1200):
        with open(log_path) as f:
            f.seek(start)
            found = re.search(r"listening on ([0-9.]+:[0-9]+)", f.read())
        if found:
            return proc, found.group(1)
        if proc.poll() is not None:
            sys.exit("peer %s exited with %d before it listened; see %s" % (out_dir, proc.returncode, log_path))
        time.sleep(0.1)
    sys.exit("peer %s did not listen within 120 s; see %s" % (out_dir, log_path))


def metrics(run_dir):
    """The lines of RUN_DIR/metrics.jsonl ([] before the first)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip().endswith("}")]


def last(run_dir, key):
    """The newest value of `key` in RUN_DIR/metrics.jsonl (None if none)."""
    value = None
    for row in metrics(run_dir):
        if key in row:
            value = row[key]
    return value


def run_swarm(build, work, name, peers, settings, envs=None, may_fail=False):
    """Runs `peers` peers of tiny_gpt with `settings` (--set arguments) on loopback until they
    finish, peer i with envs[i] added to its environment. Exits naming the folder if one fails,
    unless `may_fail` (a run expected to diverge). Returns (their run directories, the wall seconds)."""
    d = os.path.join(work, name)
    os.makedirs(d)
    key = keygen(build, os.path.join(d, "swarm.key"))
    procs, dirs, first = [], [], None
    start = time.time()
    for i in range(peers):
        out = os.path.join(d, "peer%d" % i)
        args = [os.path.join(build, "tessera"), "peer", "--config", "tiny_gpt", "--swarm", name,
                "--listen", "127.0.0.1:0", "--out", out, "--set", "swarm.key_file=" + key,
                "--set", "swarm.min_peers=%d" % peers] + settings + (["--initial-peer", first] if first else [])
        proc, address = start_peer(args, out, wait=first is None, env=(envs or {}).get(i))
        procs.append(proc)
        dirs.append(out)
        first = first or address
    for p in procs:
        if p.wait() != 0 and not may_fail:
            sys.exit("%s: a peer failed; see %s" % (name, d))
    return dirs, time.time() - start
