"""Writing a benchmark's result lines: the file (its folder made) and the same lines on stdout."""
import os


def write_results(path, lines):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
