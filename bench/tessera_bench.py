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


# The layout keys `tessera plan` searches, held to one process without checkpointing, so that it
# predicts the one layout a `tessera bench` run of the config runs.
ONE_PROCESS_LAYOUT = {"parallel.tp": 1, "parallel.pp": 1, "parallel.sp": 1, "parallel.zero_stage": 0,
                      "parallel.megatron_sp": "false", "parallel.offload": "false",
                      "memory.activation_checkpointing": "none", "memory.swap": "false"}


def compression_settings(spec):
    """The memory.* settings of an activation-compression spec CODEC[:BITS][+CORE]: CODEC for
    memory.activation_compression (adaptive:BITS sets memory.activation_bits), CORE for
    memory.attention_compression (same when absent)."""
    codec, _, core = spec.partition("+")
    codec, _, bits = codec.partition(":")
    sets = {"memory.activation_compression": codec, "memory.attention_compression": core or "same"}
    if bits:
        sets["memory.activation_bits"] = float(bits)
    return sets


def device_model_state(build, config, sets, ranks=1):
    """The model's state on the device under `memory.activation_policy = auto` (bytes): a 1 GiB budget
    less the share it leaves the activations, from a one-step `tessera bench` of `sets`."""
    probe = tessera_bench(build, config, {**sets, "memory.activation_policy": "auto", "memory.device_budget_gb": 1},
                          ranks=ranks, steps=1, warmup=0)
    return 1024 ** 3 - probe["activation_policy"]["budget_bytes"]


def plan_step(build, config, cluster, sets):
    """`BUILD/tessera plan --config CONFIG --cluster CLUSTER --world 1 --json` with ONE_PROCESS_LAYOUT and
    `sets` held: the one layout's predicted step (s); raises with the output on failure."""
    cmd = [str(pathlib.Path(build) / "tessera"), "plan", "--config", config, "--cluster", cluster, "--world", "1",
           "--json"]
    for k, v in {**ONE_PROCESS_LAYOUT, **sets}.items():
        cmd += ["--set", f"{k}={v}"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    layouts = json.loads(result.stdout)["layouts"]
    if len(layouts) != 1:
        raise RuntimeError(f"{' '.join(cmd)}: {len(layouts)} layouts predicted, one expected")
    return layouts[0]["step_s"]


def calibration_text(tessera, path, ranks):
    """The cluster file at `path`, written first by `TESSERA plan calibrate --ranks RANKS` when absent."""
    if not pathlib.Path(path).exists():
        subprocess.run([str(tessera), "plan", "calibrate", "--ranks", str(ranks), "--out", str(path)], check=True)
    return pathlib.Path(path).read_text()


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
