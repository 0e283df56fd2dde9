#!/usr/bin/env python3
"""Computes golden tensors with the pinned torch wheel for tessera's C++ tests (DESIGN.md, principle 9).

Usage: make_golden.py OUT_DIR. Runs generate(out_dir) of every tests/golden/golden_*.py module;
each writes safetensors files that a C++ test reads back by name. Everything is seeded, so the
files are the same on every run.
"""
import importlib
import pathlib
import sys

import torch


def main() -> None:
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    here = pathlib.Path(__file__).resolve().parent
    sys.path.insert(0, str(here))
    torch.set_num_threads(1)
    for path in sorted(here.glob("golden_*.py")):
        module = importlib.import_module(path.stem)
        torch.manual_seed(0)
        module.generate(out)
        print(f"golden: {path.stem} -> {out}")


if __name__ == "__main__":
    main()
