"""One `tessera bench --json` run, shared by the benchmark scripts in bench/."""
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
