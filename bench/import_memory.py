"""Peak host memory of `tessera import --hf` and `tessera export --hf` on a Llama folder, by build.

A LlamaForCausalLM with random weights (bf16, as the Hub's models are saved) is written by
transformers' save_pretrained in shards, then imported by each tessera binary given; each import's
peak resident memory is its process's maximum RSS (getrusage of the child), beside the size of
the checkpoint it wrote; then the same binary exports that checkpoint back to a Hugging Face folder
(`export --hf`), measured alike.

  python3 bench/import_memory.py --tessera build/tessera [--tessera OTHER ...] [--layers 16]
      [--label NAME ...] [--export-shard-mb MB ...] [--hidden 1024] [--ffn 2816] [--vocab 32000]
      [--out bench/results/import_memory_cpu]

Writes OUT.md and OUT.json. Uses the project's venv (scripts/install.sh) for torch and transformers.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def peak_rss_mib(command):
    """Runs `command` in a child of a fresh interpreter and returns (its max RSS in MiB, seconds)."""
    probe = ("import resource, subprocess, sys, time; t = time.time(); "
             "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, time.time() - t, r.returncode)")
    out = subprocess.run([sys.executable, "-c", probe] + command, check=True, capture_output=True, text=True)
    kib, seconds, rc = out.stdout.split()
    if rc != "0":
        sys.exit(f"{' '.join(command)} exited {rc}")
    return int(kib) / 1024, float(seconds)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tessera", action="append", required=True, help="a tessera binary (repeat to compare builds)")
    p.add_argument("--label", action="append", help="a name for each binary (default: its path)")
    p.add_argument("--export-shard-mb", action="append", type=float,
                   help="for each binary, its export's --max-shard-mb (0: not passed, as builds before it lack it)")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--ffn", type=int, default=2816)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--shard", default="200MB")
    p.add_argument("--out", default="bench/results/import_memory_cpu")
    args = p.parse_args()
    labels = args.label or args.tessera
    shard_mbs = args.export_shard_mb or [0] * len(args.tessera)
    import torch
    import transformers

    work = tempfile.mkdtemp(prefix="tessera-import-memory-")
    try:
        config = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.ffn,
                                          num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                                          num_key_value_heads=args.hidden // 256, max_position_embeddings=2048,
                                          tie_word_embeddings=False)
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
        params = sum(t.numel() for t in model.parameters())
        folder = os.path.join(work, "hf")
        model.save_pretrained(folder, max_shard_size=args.shard)
        del model
        files = [f for f in os.listdir(folder) if f.endswith(".safetensors")]
        folder_mib = sum(os.path.getsize(os.path.join(folder, f)) for f in files) / 2**20
        rows = []
        for binary, label, shard_mb in zip(args.tessera, labels, shard_mbs):
            out = os.path.join(work, "out")
            shutil.rmtree(out, ignore_errors=True)
            rss, seconds = peak_rss_mib([binary, "import", "--hf", folder, "--out", out])
            step = os.path.join(out, "step_0")
            written = sum(os.path.getsize(os.path.join(step, f)) for f in os.listdir(step)
                          if f.startswith("model")) / 2**20
            back = os.path.join(work, "back")
            shutil.rmtree(back, ignore_errors=True)
            export_rss, export_seconds = peak_rss_mib([binary, "export", "--checkpoint", out, "--hf", back] +
                                                      (["--max-shard-mb", str(shard_mb)] if shard_mb > 0 else []))
            rows.append({"build": label, "peak_rss_mib": round(rss, 1), "seconds": round(seconds, 1),
                         "checkpoint_model_mib": round(written, 1),
                         "model_files": len([f for f in os.listdir(step) if f.startswith("model")]),
                         "export_peak_rss_mib": round(export_rss, 1), "export_seconds": round(export_seconds, 1)})
            print(rows[-1], flush=True)
        result = {"parameters": params, "layers": args.layers, "hidden": args.hidden, "ffn": args.ffn,
                  "vocab": args.vocab, "folder_files": len(files), "folder_mib": round(folder_mib, 1),
                  "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": rows}
        with open(args.out + ".json", "w") as f:
            json.dump(result, f, indent=2)
        with open(args.out + ".md", "w") as f:
            f.write(f"# `tessera import --hf` and `export --hf`: peak host memory\n\n`python3 bench/import_memory.py "
                    f"{' '.join(sys.argv[1:])}` ({result['date']}): a LlamaForCausalLM of "
                    f"{params:,} parameters ({args.layers} blocks, width {args.hidden}, SwiGLU {args.ffn}, "
                    f"vocabulary {args.vocab}, untied head) saved in bf16 by save_pretrained as {len(files)} files, "
                    f"{folder_mib:.0f} MiB. The checkpoint tessera writes holds fp32.\n\n"
                    "| build | import: peak RSS (MiB) | seconds | checkpoint model files | their MiB | "
                    "export --hf: peak RSS (MiB) | seconds |\n|---|---|---|---|---|---|---|\n")
            for r in rows:
                f.write(f"| {r['build']} | {r['peak_rss_mib']} | {r['seconds']} | {r['model_files']} | "
                        f"{r['checkpoint_model_mib']} | {r['export_peak_rss_mib']} | {r['export_seconds']} |\n")
        print(f"wrote {args.out}.md and .json")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
