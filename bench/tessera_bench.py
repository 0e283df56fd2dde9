"""What the benchmark scripts in bench/ share: one `tessera bench --json` run, the bundled corpus
as `make train` prepares it, and the unigram baseline a training run prints."""
import json
import pathlib
import subprocess


def tessera_bench(build, config, sets, ranks=1, steps=1, warmup=1, flags=()):
    """Runs `BUILD/tessera bench --config CONFIG --json` with `--set k=v` for each of `sets` (and
    `--nproc RANKS` when RANKS > 1) and returns rank 0's JSON object; raises with the output on failure."""
    cmd = [str(pathlib.Path(build) / "tessera"), "bench", "--config", config, "--json", "--steps", str(steps),
           "--warmup", str(warmup), *flags]
    if ranks > 1:
        cmd += ["--nproc", str(ranks)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def bundled_corpus(build, data=None):
    """DATA, or BUILD/data/kjv (the corpus `make train` prepares); exits naming how to prepare it."""
    data = data or str(pathlib.Path(build) / "data" / "kjv")
    if not (pathlib.Path(data) / "train.bin").exists():
        raise SystemExit(f"{data}/train.bin: missing; prepare it with `make train` or "
                         f"`{build}/tessera prepare --input data/kjv/genesis_to_ruth.txt --out {data}`")
    return data


def unigram_baseline(lines):
    """The unigram baseline (nats) from the lines a `tessera train` run printed, or None."""
    return next((float(w.rstrip(";")) for line in lines if "unigram baseline" in line
                 for prev, w in zip(line.split(), line.split()[1:]) if prev == "baseline"), None)
