"""tessera's TensorBoard event files, read back by TensorBoard's own reader (EventAccumulator).

  TensorBoard.TwoRankMoeRunHasEveryScalarOfItsMetrics
      `tessera train --nproc 2` of tiny_moe (two data-parallel ranks, MoE statistics per layer):
      one event file, written by rank 0, and its scalars are exactly the numbers of metrics.jsonl,
      every tag at every step it has there (float32), and nothing else.
  TensorBoard.ResumedRunContinuesTheSameCurves
      A run resumed from an earlier checkpoint than its last metrics line: the lines after the
      checkpoint are dropped from metrics.jsonl and from the event file alike, so every tag has each
      step once and the file equals metrics.jsonl again; `train.tensorboard = false` writes none,
      and a bad value is refused naming the key.

Exits 77 (CTest's skip) with a message only when the tensorboard package cannot be imported.

usage: test_tensorboard.py TESSERA_BINARY WORK_DIR CASE SOURCE_DIR
"""
import json
import math
import os
import shutil
import subprocess
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator
except ImportError as e:  # the project's venv pins it (scripts/install.sh)
    print(f"SKIP: tensorboard is not installed in this Python ({e}); scripts/install.sh installs it")
    sys.exit(77)

BINARY, WORK, CASE, SOURCE = sys.argv[1:5]
EVENT_FILE = "events.out.tfevents.tessera"


def tessera(*args, expect_ok=True):
    result = subprocess.run([BINARY, *args], capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    output = result.stdout.decode(errors="replace") + result.stderr.decode(errors="replace")
    if expect_ok and result.returncode != 0:
        sys.exit(f"tessera {' '.join(args)} failed ({result.returncode}):\n{output}")
    return result.returncode, output


def prepare_data():
    data = os.path.join(WORK, "data")
    if not os.path.exists(os.path.join(data, "train.bin")):
        tessera("prepare", "--input", os.path.join(SOURCE, "data/kjv/genesis_to_ruth.txt"), "--out", data,
                "--tokenizer", "byte")
    return data


def flatten(tag, value, out):
    """The scalars tessera writes for one value of a metrics line (src/tensorboard/event_file.h)."""
    if isinstance(value, bool):
        out[tag] = 1.0 if value else 0.0
    elif isinstance(value, (int, float)):
        out[tag] = float(value)
    elif isinstance(value, dict):
        for key, inner in value.items():
            flatten(f"{tag}/{key}", inner, out)
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            if isinstance(inner, dict) and isinstance(inner.get("layer"), int):
                for key, field in inner.items():
                    if key != "layer":
                        flatten(f"{tag}/layer{inner['layer']}/{key}", field, out)
            else:
                flatten(f"{tag}/{i}", inner, out)


def expected_scalars(run_dir):
    """{tag: [(step, value), ...]} from metrics.jsonl, in file order."""
    expected = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            scalars = {}
            for key, value in record.items():
                if key != "step":
                    flatten(key, value, scalars)
            for tag, value in scalars.items():
                expected.setdefault(tag, []).append((record.get("step", 0), value))
    return expected


def read_scalars(run_dir):
    """{tag: [(step, value), ...]} as TensorBoard reads the run directory."""
    files = [f for f in os.listdir(run_dir) if "tfevents" in f]
    assert files == [EVENT_FILE], f"{run_dir}: event files {files}, expected exactly [{EVENT_FILE}]"
    accumulator = event_accumulator.EventAccumulator(run_dir, size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def check_equal(run_dir):
    expected, read = expected_scalars(run_dir), read_scalars(run_dir)
    assert set(read) == set(expected), \
        f"{run_dir}: tags only in the event file {sorted(set(read) - set(expected))}, " \
        f"only in metrics.jsonl {sorted(set(expected) - set(read))}"
    points = 0
    for tag, want in expected.items():
        got = read[tag]
        assert [s for s, _ in got] == [s for s, _ in want], f"{tag}: steps {[s for s, _ in got]} != {[s for s, _ in want]}"
        for (step, g), (_, w) in zip(got, want):
            # TensorBoard's simple values are float32.
            assert math.isclose(g, w, rel_tol=1e-6, abs_tol=1e-30) or (math.isinf(w) and g == w), \
                f"{tag} at step {step}: event file {g}, metrics.jsonl {w}"
            points += 1
    return expected, points


def two_rank_moe():
    data = prepare_data()
    run = os.path.join(WORK, "two_rank_moe")
    tessera("train", "--config", "tiny_moe", "--nproc", "2", "--set", f"data.path={data}", "--set", "train.steps=6",
            "--set", "train.log_every=2", "--set", "train.batch_size=4", "--set", "eval.every=3",
            "--set", "eval.batches=2", "--out", run, "--overwrite")
    expected, points = check_equal(run)
    for tag in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu", "val_loss", "aux_loss", "moe/layer0/load/0"):
        assert tag in expected, f"{tag} missing from {sorted(expected)}"
    assert [s for s, _ in expected["loss"]] == [2, 4, 6], expected["loss"]
    assert [s for s, _ in expected["val_loss"]] == [3, 6], expected["val_loss"]
    print(f"two ranks: {len(expected)} tags, {points} points, equal to metrics.jsonl")


def resumed():
    data = prepare_data()
    run = os.path.join(WORK, "resumed")
    common = ["--set", f"data.path={data}", "--set", "train.batch_size=4", "--set", "train.log_every=1",
              "--set", "eval.every=2", "--set", "eval.batches=2"]
    tessera("train", "--config", "tiny_gpt", *common, "--set", "train.steps=6", "--set", "checkpoint.every=3",
            "--set", "checkpoint.keep=0", "--out", run, "--overwrite")
    before = read_scalars(run)
    assert [s for s, _ in before["loss"]] == [1, 2, 3, 4, 5, 6], before["loss"]
    # Resume from step 3: the first run's lines for steps 4-6 go; the new run writes 4-8.
    tessera("train", "--resume", os.path.join(run, "checkpoints", "step_3"), *common, "--set", "train.steps=8")
    expected, points = check_equal(run)
    assert [s for s, _ in expected["loss"]] == list(range(1, 9)), expected["loss"]
    assert [s for s, _ in expected["val_loss"]] == [2, 4, 6, 8], expected["val_loss"]
    after = read_scalars(run)
    assert after["loss"][:3] == before["loss"][:3], "the kept steps' points changed"
    print(f"resumed: {len(expected)} tags, {points} points, steps 1-8 once each, equal to metrics.jsonl")

    off = os.path.join(WORK, "off")
    tessera("train", "--config", "tiny_gpt", *common, "--set", "train.steps=2", "--set", "train.tensorboard=false",
            "--out", off, "--overwrite")
    assert not os.path.exists(os.path.join(off, EVENT_FILE)), "train.tensorboard = false wrote an event file"
    code, output = tessera("train", "--config", "tiny_gpt", *common, "--set", "train.tensorboard=maybe",
                           "--out", os.path.join(WORK, "bad"), "--overwrite", expect_ok=False)
    assert code != 0 and "train.tensorboard" in output, f"a bad train.tensorboard was not refused by key:\n{output}"
    print("train.tensorboard = false writes no event file; 'maybe' refused:", output.strip().splitlines()[-1])


shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
{"two_rank_moe": two_rank_moe, "resumed": resumed}[CASE]()
