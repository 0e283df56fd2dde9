#!/usr/bin/env python3
"""The source tree's rules (docs/architecture.md, "Layers"), checked by CTest as
SourceRules.LayersAndFileSizes:

1. Layers: every folder under src/ sits on one layer (LAYERS, lowest first) and includes only
   its own folder's headers and those of lower layers. A folder that includes one on its own
   layer or a higher one is a violation. KNOWN lists those that remain, each with its reason; the
   check fails on a violation not listed and on a listed one that is gone (remove it from KNOWN),
   so the list only shrinks.
2. No file under src/ is longer than MAX_LINES lines.

Usage: check_source_rules.py SOURCE_DIR. Prints every finding; exit 1 if any."""
import os
import re
import sys

MAX_LINES = 500

LAYERS = [
    ["core"],
    ["precision"],
    ["tensorboard", "checkpoint", "comm", "data", "memory"],
    ["optim", "model", "parallel/pipeline"],
    ["optim/compression", "memory/residency", "parallel/tensor", "parallel/sequence", "parallel/expert",
     "protocols", "config"],
    ["memory/offload", "memory/swap"],
    ["plan", "parallel/data"],
    ["parallel"],
    ["train"],
    ["atom"],
    ["cli"],
]

# (including folder, included folder): why it is still there. Issue 51 asks for each to go.
KNOWN = {
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_0-9/]+)/[A-Za-z_0-9.]+"', re.M)


def main(source_dir):
    src = os.path.join(source_dir, "src")
    layer_of = {folder: i for i, folders in enumerate(LAYERS) for folder in folders}
    findings, seen = [], set()
    for root, _, files in os.walk(src):
        folder = os.path.relpath(root, src)
        for name in sorted(files):
            if not name.endswith((".h", ".cpp", ".cu")):
                continue
            path = os.path.join(root, name)
            rel = os.path.relpath(path, source_dir)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            lines = text.count("\n")
            if lines > MAX_LINES:
                findings.append(f"{rel}: {lines} lines (at most {MAX_LINES}: split it by job)")
            if folder not in layer_of:
                findings.append(f"{rel}: folder src/{folder} is on no layer (add it to LAYERS in {sys.argv[0]})")
                continue
            for included in INCLUDE.findall(text):
                if included == folder or included not in layer_of:
                    continue
                if layer_of[included] >= layer_of[folder]:
                    seen.add((folder, included))
                    if (folder, included) not in KNOWN:
                        findings.append(f"{rel}: includes {included}/ (layer {layer_of[included]}) from {folder}/ "
                                        f"(layer {layer_of[folder]}): a lower folder may not include a higher one")
    for pair, reason in sorted(KNOWN.items()):
        if pair not in seen:
            findings.append(f"{pair[0]}/ no longer includes {pair[1]}/: remove it from KNOWN ({reason})")
    for finding in findings:
        print(finding)
    for pair in sorted(seen & set(KNOWN)):
        print(f"known: {pair[0]}/ includes {pair[1]}/: {KNOWN[pair]}")
    print(f"{'FAILED' if findings else 'passed'}: {len(findings)} finding(s)")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
