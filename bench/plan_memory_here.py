#!/usr/bin/env python3
"""tessera plan's peak memory against measurement on this machine: for each layout of
bench/plan_runs_here.py, the plan's peak_memory_gib (the memory estimate of its largest rank) against
`tessera bench`'s peak_bytes: the most CPU tensor bytes live at once during its timed steps
(memory/host_memory_stats.h: every storage libtorch allocates, counted by the CPU allocator; the
baseline before the model is built subtracted), on rank 0, or the largest pipeline rank.

Tensor bytes are what the estimate models and what the CUDA caching allocator's peak counts on a GPU;
the process's resident set adds libtorch, the threads and glibc's heap on top, which
bench/plan_runs_here.py compares with a fixed overhead.

usage: bench/plan_memory_here.py [--tessera build/tessera] [--held-out 1|2|...|15] [--only NAME] [--out F.md]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plan_runs_here import LAYOUTS, MODEL, full_layout, run, sets  # noqa: E402

CLUSTER = "clusters/this_machine_2core.toml"
MiB = 1024.0 * 1024.0

# Held out, set 1: the terms of the estimate were found on the 22 layouts above and on one-process
# runs of tiny_gpt shapes; these rows checked them on another model (6 blocks of width 384, 6 heads, a
# vocabulary of 1000, sequences of 64, SwiGLU with RMSNorm and rotary positions in half of them) and
# on 4-rank compositions. Its first run found two terms (ZeRO shards over dp x sp; ZeRO-2/3's
# reduce-scatters in flight between micro-batches), so these rows are no longer held out: set 2 checks
# those two terms on rows looked at only after they were written.
HELD_OUT_MODEL = ["model.n_layer=6", "model.n_embd=384", "model.n_head=6", "model.vocab_size=1000",
                  "model.block_size=64", "train.seq_len=64", "train.global_batch_size=16", "train.threads=1",
                  "optim.name=adamw", "train.tensorboard=false"]
LLAMA_BLOCKS = ["model.norm=rmsnorm", "model.mlp=swiglu", "model.position=rope", "model.bias=false"]
HELD_OUT = [
    ("one process, 1 micro-batch", 1, ["train.batch_size=16"]),
    ("one process, SwiGLU blocks", 1, ["train.batch_size=8"] + LLAMA_BLOCKS),
    ("dp2 ZeRO-3", 2, ["parallel.zero_stage=3", "train.batch_size=4"]),
    ("tp2 Megatron-SP, SwiGLU", 2, ["parallel.tp=2", "parallel.megatron_sp=true", "train.batch_size=8"] + LLAMA_BLOCKS),
    ("pp2 zbh1", 2, ["parallel.pp=2", "parallel.pp_schedule=zbh1", "train.batch_size=2"]),
    ("pp2 zbv", 2, ["parallel.pp=2", "parallel.pp_schedule=zbv", "train.batch_size=2"]),
    ("pp2 interleaved, SwiGLU", 2, ["parallel.pp=2", "parallel.pp_schedule=interleaved", "parallel.pp_virtual=3",
                                    "train.batch_size=2"] + LLAMA_BLOCKS),
    ("tp2 x dp2 ZeRO-2", 4, ["parallel.tp=2", "parallel.zero_stage=2", "train.batch_size=4"]),
    ("pp2 x dp2 1f1b ZeRO-1", 4, ["parallel.pp=2", "parallel.zero_stage=1", "train.batch_size=2"]),
    ("pp2 x tp2 gpipe", 4, ["parallel.pp=2", "parallel.tp=2", "parallel.pp_schedule=gpipe", "train.batch_size=2"]),
    ("sp2 x dp2 Ulysses ZeRO-3", 4, ["parallel.sp=2", "parallel.sp_method=ulysses", "parallel.zero_stage=3",
                                     "train.batch_size=4"]),
    ("dp2 ZeRO-3 offload, full checkpointing", 2, ["parallel.zero_stage=3", "parallel.offload=true",
                                                   "memory.activation_checkpointing=full", "train.batch_size=8"]),
]


HELD_OUT_2_MODEL = ["model.n_layer=8", "model.n_embd=192", "model.n_head=4", "model.vocab_size=2000",
                    "model.block_size=96", "train.seq_len=96", "train.global_batch_size=32", "train.threads=1",
                    "optim.name=adamw", "train.tensorboard=false"]
HELD_OUT_2 = [
    ("sp2 x dp2 ring ZeRO-2", 4, ["parallel.sp=2", "parallel.sp_method=ring", "parallel.zero_stage=2",
                                 "train.batch_size=4"]),
    ("sp2 x dp2 Ulysses ZeRO-1", 4, ["parallel.sp=2", "parallel.sp_method=ulysses", "parallel.zero_stage=1",
                                     "train.batch_size=8"]),
    ("dp2 ZeRO-2, 4 micro-batches", 2, ["parallel.zero_stage=2", "train.batch_size=4"]),
    ("tp2 x dp2 ZeRO-3, 2 micro-batches", 4, ["parallel.tp=2", "parallel.zero_stage=3", "train.batch_size=8"]),
    ("ep2 MoE ZeRO-2, 2 micro-batches", 2, ["model.ffn=moe", "model.moe_experts=4", "model.moe_top_k=2",
                                            "parallel.ep=2", "parallel.zero_stage=2", "train.batch_size=8"]),
    ("dp4 ZeRO-3, 2 micro-batches", 4, ["parallel.zero_stage=3", "train.batch_size=4"]),
]
# Held out, set 3: bf16 (autocast on the CPU), whose two terms (the weights' bf16 copies, the float32
# residual stream) were found on tiny_gpt at 4 x 256, tp 1 and 2; these rows were run after.
HELD_OUT_3_MODEL = ["model.n_layer=6", "model.n_embd=320", "model.n_head=4", "model.vocab_size=1500",
                    "model.block_size=96", "train.seq_len=96", "train.global_batch_size=16", "train.threads=1",
                    "optim.name=adamw", "train.tensorboard=false", "precision.dtype=bf16"]
HELD_OUT_3 = [
    ("one process", 1, ["train.batch_size=8"]),
    ("one process, SwiGLU blocks", 1, ["train.batch_size=8"] + LLAMA_BLOCKS),
    ("dp2 ZeRO-1", 2, ["parallel.zero_stage=1", "train.batch_size=8"]),
    ("dp2 ZeRO-3", 2, ["parallel.zero_stage=3", "train.batch_size=8"]),
    ("tp2 Megatron-SP", 2, ["parallel.tp=2", "parallel.megatron_sp=true", "train.batch_size=8"]),
    ("pp2 1f1b", 2, ["parallel.pp=2", "train.batch_size=2"]),
    ("pp2 zbh1", 2, ["parallel.pp=2", "parallel.pp_schedule=zbh1", "train.batch_size=2"]),
]
# Held out, set 4: ZeRO-3's gathered units counted by the backward's phase (the head's: the ends
# alone) were found on set 2's dp4 row (2026-12-01); these rows were run after, on another model.
HELD_OUT_4_MODEL = ["model.n_layer=5", "model.n_embd=256", "model.n_head=4", "model.vocab_size=3000",
                    "model.block_size=80", "train.seq_len=80", "train.global_batch_size=24", "train.threads=1",
                    "optim.name=adamw", "train.tensorboard=false"]
HELD_OUT_4 = [
    ("dp2 ZeRO-3, 3 micro-batches", 2, ["parallel.zero_stage=3", "train.batch_size=4"]),
    ("dp2 ZeRO-3, 1 micro-batch", 2, ["parallel.zero_stage=3", "train.batch_size=12"]),
    ("dp2 ZeRO-3, SwiGLU blocks, 2 micro-batches", 2, ["parallel.zero_stage=3", "train.batch_size=6"] + LLAMA_BLOCKS),
    ("tp2 x dp2 ZeRO-3, 1 micro-batch", 4, ["parallel.tp=2", "parallel.zero_stage=3", "train.batch_size=12"]),
    ("dp2 ZeRO-2, 2 micro-batches", 2, ["parallel.zero_stage=2", "train.batch_size=6"]),
]
# Held out, set 5: the two terms sets 2 and 4 found (ZeRO-3's gathered units by phase; the
# vocabulary-parallel loss's working set under tp), checked on rows run once, after both.
HELD_OUT_5_MODEL = ["model.n_layer=6", "model.n_embd=224", "model.n_head=7", "model.vocab_size=2400",
                    "model.block_size=72", "train.seq_len=72", "train.global_batch_size=24", "train.threads=1",
                    "optim.name=adamw", "train.tensorboard=false"]
HELD_OUT_5 = [
    ("tp2 x dp2 ZeRO-3, 2 micro-batches, SwiGLU", 4, ["parallel.tp=2", "parallel.zero_stage=3", "train.batch_size=6",
                                                       "model.n_head=8"] + LLAMA_BLOCKS),
    ("tp2", 2, ["parallel.tp=2", "train.batch_size=12", "model.n_head=8"]),
    ("tp2 bf16", 2, ["parallel.tp=2", "train.batch_size=12", "model.n_head=8", "precision.dtype=bf16"]),
    ("dp2 ZeRO-3, 2 micro-batches, bf16", 2, ["parallel.zero_stage=3", "train.batch_size=6", "precision.dtype=bf16"]),
    ("dp4 ZeRO-3", 4, ["parallel.zero_stage=3", "train.batch_size=6"]),
]
# Held out, set 6: bf16's weight copies counted once per micro-batch a pipeline rank holds (found on
# set 3's pp2 1f1b row, 2026-12-01), checked on pipelines run once, after.
HELD_OUT_6_MODEL = ["model.n_layer=8", "model.n_embd=256", "model.n_head=4", "model.vocab_size=2200",
                    "model.block_size=64", "train.seq_len=64", "train.global_batch_size=16", "train.threads=1",
                    "optim.name=adamw", "train.tensorboard=false", "precision.dtype=bf16"]
HELD_OUT_6 = [
    ("pp2 gpipe", 2, ["parallel.pp=2", "parallel.pp_schedule=gpipe", "train.batch_size=4"]),
    ("pp2 1f1b, SwiGLU blocks", 2, ["parallel.pp=2", "train.batch_size=2"] + LLAMA_BLOCKS),
    ("pp2 interleaved", 2, ["parallel.pp=2", "parallel.pp_schedule=interleaved", "parallel.pp_virtual=2",
                            "train.batch_size=2"]),
    ("pp2 zbv", 2, ["parallel.pp=2", "parallel.pp_schedule=zbv", "train.batch_size=2"]),
    ("pp4 1f1b", 4, ["parallel.pp=4", "train.batch_size=2"]),
]
# Held out, set 7: the pipeline terms found on sets 3 and 6 (bf16 copies per micro-batch held; no
# gradients before a pipeline rank's first backward), checked on rows run once, after both.
HELD_OUT_7_MODEL = ["model.n_layer=6", "model.n_embd=288", "model.n_head=6", "model.vocab_size=1800",
                    "model.block_size=80", "train.seq_len=80", "train.global_batch_size=12", "train.threads=1",
                    "optim.name=adamw", "train.tensorboard=false"]
HELD_OUT_7 = [
    ("pp2 gpipe", 2, ["parallel.pp=2", "parallel.pp_schedule=gpipe", "train.batch_size=3"]),
    ("pp2 gpipe bf16", 2, ["parallel.pp=2", "parallel.pp_schedule=gpipe", "train.batch_size=3",
                           "precision.dtype=bf16"]),
    ("pp3 1f1b bf16", 3, ["parallel.pp=3", "train.batch_size=2", "precision.dtype=bf16"]),
    ("pp2 zbh1 bf16, SwiGLU blocks", 2, ["parallel.pp=2", "parallel.pp_schedule=zbh1", "train.batch_size=2",
                                         "precision.dtype=bf16"] + LLAMA_BLOCKS),
    ("pp2 x dp2 1f1b bf16", 4, ["parallel.pp=2", "train.batch_size=2", "precision.dtype=bf16"]),
]
# Held out, set 8: Llama blocks with grouped-query attention (2 key/value heads for 8 query heads)
# after RMSNorm became one function (model/rms_norm.h) and the estimate stopped counting k and v
# expanded to every head but under the ring and Ulysses kernels (2026-12-02, found tensor by tensor on
# tiny_llama in one process): rows written before they were run.
HELD_OUT_8_MODEL = ["model.n_layer=4", "model.n_embd=256", "model.n_head=8", "model.n_kv_head=2",
                    "model.vocab_size=1200", "model.block_size=64", "train.seq_len=64",
                    "train.global_batch_size=16", "train.threads=1", "optim.name=adamw",
                    "train.tensorboard=false"] + LLAMA_BLOCKS
HELD_OUT_8 = [
    ("one process", 1, ["train.batch_size=16"]),
    ("dp2 ZeRO-2", 2, ["parallel.zero_stage=2", "train.batch_size=8"]),
    ("tp2 (one kv head a rank)", 2, ["parallel.tp=2", "train.batch_size=16"]),
    ("sp2 Ulysses", 2, ["parallel.sp=2", "parallel.sp_method=ulysses", "train.batch_size=16"]),
    ("sp2 ring", 2, ["parallel.sp=2", "parallel.sp_method=ring", "train.batch_size=16"]),
    ("pp2 1f1b", 2, ["parallel.pp=2", "train.batch_size=4"]),
]
# Held out, set 9: bf16 pipelines after the estimate counted autocast's copies of the parameters
# products use only (not the first stage's token embedding, the norms, the router or the positions;
# found on sets 6 and 7's deep 1F1B rows, 2026-12-03): rows written before they were run.
HELD_OUT_9_MODEL = ["model.n_layer=6", "model.n_embd=320", "model.n_head=4", "model.vocab_size=3000",
                    "model.block_size=72", "train.seq_len=72", "train.global_batch_size=12", "train.threads=1",
                    "optim.name=adamw", "train.tensorboard=false", "precision.dtype=bf16"]
HELD_OUT_9 = [
    ("one process, 2 micro-batches", 1, ["train.batch_size=6"]),
    ("pp3 1f1b", 3, ["parallel.pp=3", "train.batch_size=2"]),
    ("pp2 gpipe, untied head", 2, ["parallel.pp=2", "parallel.pp_schedule=gpipe", "train.batch_size=3",
                                   "model.tie_embeddings=false"]),
    ("pp2 interleaved, SwiGLU blocks", 2, ["parallel.pp=2", "parallel.pp_schedule=interleaved",
                                           "parallel.pp_virtual=3", "train.batch_size=2"] + LLAMA_BLOCKS),
    ("tp2 x pp2 1f1b", 4, ["parallel.tp=2", "parallel.pp=2", "train.batch_size=2"]),
]
# Set 10, not held out: ZeRO at four replicas on set 1's model, the rows that isolate set 1's
# sp2 x dp2 Ulysses ZeRO-3 row (-6.5%): DDP and ZeRO-1 at dp4, ZeRO-2 and 3 at dp4 (3 with one
# micro-batch too), sp2 x dp2 without ZeRO, sp2 with ZeRO-3 (two replicas).
ZERO_AT_FOUR = [
    ("dp4 DDP", 4, ["parallel.zero_stage=0", "train.batch_size=2"]),
    ("dp4 ZeRO-1", 4, ["parallel.zero_stage=1", "train.batch_size=2"]),
    ("dp4 ZeRO-2", 4, ["parallel.zero_stage=2", "train.batch_size=2"]),
    ("dp4 ZeRO-3", 4, ["parallel.zero_stage=3", "train.batch_size=2"]),
    ("dp4 ZeRO-3, one micro-batch", 4, ["parallel.zero_stage=3", "train.batch_size=2", "train.global_batch_size=8"]),
    ("sp2 x dp2 Ulysses, no ZeRO", 4, ["parallel.sp=2", "parallel.sp_method=ulysses", "train.batch_size=4"]),
    ("sp2 Ulysses ZeRO-3", 2, ["parallel.sp=2", "parallel.sp_method=ulysses", "parallel.zero_stage=3",
                               "train.batch_size=8"]),
]
# Held out, set 11: bf16 pipelines after a step's micro-batches share one bf16 copy of each weight
# (precision/autocast.h, WeightCastCache; 2026-12-03), the joined query and key/value weights of GQA
# blocks still cast per forward, every copy per held micro-batch under ZeRO-3: rows written before
# they were run.
HELD_OUT_11_MODEL = ["model.n_layer=4", "model.n_embd=384", "model.n_head=6", "model.vocab_size=2500",
                     "model.block_size=64", "train.seq_len=64", "train.global_batch_size=16", "train.threads=1",
                     "optim.name=adamw", "train.tensorboard=false", "precision.dtype=bf16"]
HELD_OUT_11 = [
    ("pp2 gpipe, 8 micro-batches", 2, ["parallel.pp=2", "parallel.pp_schedule=gpipe", "train.batch_size=2"]),
    ("pp2 1f1b, GQA SwiGLU blocks", 2, ["parallel.pp=2", "train.batch_size=2", "model.n_kv_head=2"] + LLAMA_BLOCKS),
    ("pp2 zbh1", 2, ["parallel.pp=2", "parallel.pp_schedule=zbh1", "train.batch_size=2"]),
    ("pp2 x dp2 1f1b ZeRO-1", 4, ["parallel.pp=2", "parallel.zero_stage=1", "train.batch_size=2"]),
    ("pp2 x dp2 gpipe ZeRO-3", 4, ["parallel.pp=2", "parallel.pp_schedule=gpipe", "parallel.zero_stage=3",
                                   "train.batch_size=2"]),
]
# Held out, set 12: ZeRO-2 and 3 under a pipeline after the estimate counted their reduce-scatters at the
# end of a micro-batch's backward (found on set 11's pp2 x dp2 GPipe ZeRO-3 row, 2026-12-04): rows written
# before they were run.
HELD_OUT_12_MODEL = ["model.n_layer=6", "model.n_embd=256", "model.n_head=4", "model.vocab_size=2000",
                     "model.block_size=80", "train.seq_len=80", "train.global_batch_size=16", "train.threads=1",
                     "optim.name=adamw", "train.tensorboard=false"]
HELD_OUT_12 = [
    ("pp2 x dp2 1f1b ZeRO-2", 4, ["parallel.pp=2", "parallel.zero_stage=2", "train.batch_size=2"]),
    ("pp2 x dp2 1f1b ZeRO-3 bf16", 4, ["parallel.pp=2", "parallel.zero_stage=3", "train.batch_size=2",
                                       "precision.dtype=bf16"]),
    ("pp2 x dp2 gpipe ZeRO-2, untied head", 4, ["parallel.pp=2", "parallel.pp_schedule=gpipe", "parallel.zero_stage=2",
                                                "train.batch_size=4", "model.tie_embeddings=false"]),
    ("pp2 x dp2 interleaved ZeRO-3", 4, ["parallel.pp=2", "parallel.pp_schedule=interleaved", "parallel.pp_virtual=3",
                                         "parallel.zero_stage=3", "train.batch_size=2"]),
    ("pp2 x dp2 zbh1 ZeRO-2", 4, ["parallel.pp=2", "parallel.pp_schedule=zbh1", "parallel.zero_stage=2",
                                  "train.batch_size=2"]),
]
# Held out, set 13: ZeRO-2 and 3 under a pipeline after the estimate counted the three moments of a backward
# that reduce-scatters (its start with the backward before's last unit in flight, its first unit, its end;
# found on sets 11 and 12, 2026-12-04): rows written before they were run.
HELD_OUT_13_MODEL = ["model.n_layer=8", "model.n_embd=192", "model.n_head=4", "model.vocab_size=3000",
                     "model.block_size=96", "train.seq_len=96", "train.global_batch_size=16", "train.threads=1",
                     "optim.name=adamw", "train.tensorboard=false"]
HELD_OUT_13 = [
    ("pp2 x dp2 1f1b ZeRO-3", 4, ["parallel.pp=2", "parallel.zero_stage=3", "train.batch_size=2"]),
    ("pp2 x dp2 gpipe ZeRO-2 bf16", 4, ["parallel.pp=2", "parallel.pp_schedule=gpipe", "parallel.zero_stage=2",
                                        "train.batch_size=2", "precision.dtype=bf16"]),
    ("pp2 x dp2 interleaved ZeRO-2", 4, ["parallel.pp=2", "parallel.pp_schedule=interleaved", "parallel.pp_virtual=2",
                                         "parallel.zero_stage=2", "train.batch_size=2"]),
    ("pp2 x dp2 1f1b ZeRO-2, SwiGLU blocks", 4, ["parallel.pp=2", "parallel.zero_stage=2", "train.batch_size=4"]
     + LLAMA_BLOCKS),
    ("pp2 x dp2 zbh1 ZeRO-3 bf16", 4, ["parallel.pp=2", "parallel.pp_schedule=zbh1", "parallel.zero_stage=3",
                                       "train.batch_size=2", "precision.dtype=bf16"]),
]
# Held out, set 14: bf16 pipelines under Megatron-SP with tp 2 after its sequence-gathered products keep the
# float32 parameters, joined or not, and no bf16 copy of them (parallel/tensor/tp_comm.h; 2026-12-04): rows
# written before they were run.
HELD_OUT_14_MODEL = ["model.n_layer=4", "model.n_embd=256", "model.n_head=4", "model.vocab_size=2000",
                     "model.block_size=64", "train.seq_len=64", "train.global_batch_size=16", "train.threads=1",
                     "optim.name=adamw", "train.tensorboard=false", "precision.dtype=bf16", "parallel.tp=2",
                     "parallel.megatron_sp=true"]
HELD_OUT_14 = [
    ("tp2 Megatron-SP, GQA SwiGLU blocks", 2, ["train.batch_size=4", "model.n_kv_head=2"] + LLAMA_BLOCKS),
    ("pp2 x tp2 Megatron-SP 1f1b, GQA SwiGLU blocks", 4, ["parallel.pp=2", "train.batch_size=2", "model.n_kv_head=2"]
     + LLAMA_BLOCKS),
    ("pp2 x tp2 Megatron-SP gpipe", 4, ["parallel.pp=2", "parallel.pp_schedule=gpipe", "train.batch_size=2"]),
    ("pp2 x tp2 Megatron-SP zbh1, GQA", 4, ["parallel.pp=2", "parallel.pp_schedule=zbh1", "train.batch_size=2",
                                            "model.n_kv_head=2"]),
    ("pp2 x tp2 Megatron-SP interleaved, GQA", 4, ["parallel.pp=2", "parallel.pp_schedule=interleaved",
                                                   "parallel.pp_virtual=2", "train.batch_size=2", "model.n_kv_head=2"]),
]
# Held out, set 15: saved activations encoded with the attention core at its own codec
# (memory.attention_compression; 2026-12-04), under one process and three layouts: rows written before
# they were run.
HELD_OUT_15_MODEL = ["model.n_layer=4", "model.n_embd=256", "model.n_head=4", "model.vocab_size=2000",
                     "model.block_size=128", "train.seq_len=128", "train.global_batch_size=16", "train.threads=1",
                     "optim.name=adamw", "train.tensorboard=false", "memory.attention_compression=int8"]
HELD_OUT_15 = [
    ("one process, int4 with the core at int8, GQA rotary SwiGLU", 1,
     ["train.batch_size=8", "model.n_kv_head=2", "memory.activation_compression=int4"] + LLAMA_BLOCKS),
    ("one process, the core alone at int8", 1, ["train.batch_size=8"]),
    ("dp2 ZeRO-3, int4 with the core at int8", 2,
     ["parallel.zero_stage=3", "train.batch_size=8", "memory.activation_compression=int4"]),
    ("tp2 Megatron-SP, int4 with the core at int8, GQA rotary SwiGLU", 2,
     ["parallel.tp=2", "parallel.megatron_sp=true", "train.batch_size=8", "model.n_kv_head=2",
      "memory.activation_compression=int4"] + LLAMA_BLOCKS),
    ("pp2 1f1b, int4 with the core at int8", 2,
     ["parallel.pp=2", "train.batch_size=4", "memory.activation_compression=int4"]),
]
SETS = {"": (MODEL, LAYOUTS), "1": (HELD_OUT_MODEL, HELD_OUT), "2": (HELD_OUT_2_MODEL, HELD_OUT_2),
        "3": (HELD_OUT_3_MODEL, HELD_OUT_3), "4": (HELD_OUT_4_MODEL, HELD_OUT_4), "5": (HELD_OUT_5_MODEL, HELD_OUT_5),
        "6": (HELD_OUT_6_MODEL, HELD_OUT_6),
        "7": (HELD_OUT_7_MODEL, HELD_OUT_7), "8": (HELD_OUT_8_MODEL, HELD_OUT_8), "9": (HELD_OUT_9_MODEL, HELD_OUT_9),
        "10": (HELD_OUT_MODEL, ZERO_AT_FOUR), "11": (HELD_OUT_11_MODEL, HELD_OUT_11),
        "12": (HELD_OUT_12_MODEL, HELD_OUT_12), "13": (HELD_OUT_13_MODEL, HELD_OUT_13),
        "14": (HELD_OUT_14_MODEL, HELD_OUT_14), "15": (HELD_OUT_15_MODEL, HELD_OUT_15)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tessera", default="build/tessera")
    parser.add_argument("--out", default="", help="default bench/results/plan_memory_here_cpu.md, with --held-out "
                        "bench/results/plan_memory_held_out_cpu.md")
    parser.add_argument("--only", default="", help="run the layouts whose name contains this")
    parser.add_argument("--held-out", default="", choices=list(SETS), help="a held-out set instead")
    a = parser.parse_args()
    rows, errors = [], []
    model, layouts = SETS[a.held_out]
    out = a.out or f"bench/results/plan_memory_{'held_out_' + a.held_out if a.held_out else 'here'}_cpu.md"
    for name, world, keys in layouts:
        if a.only and a.only not in name:
            continue
        given = {k.split("=")[0] for k in keys}
        keys = keys + [k for k in ("parallel.tp=1", "parallel.pp=1", "parallel.zero_stage=0")
                       if k.split("=")[0] not in given]
        common = sets(model + full_layout(keys))
        plan = json.loads(run([a.tessera, "plan", "--config", "tiny_gpt", "--cluster", CLUSTER, "--world", str(world),
                               "--json", "--top", "1"] + common))["layouts"][0]
        bench = [a.tessera, "bench", "--config", "tiny_gpt", "--json", "--warmup", "2", "--steps", "2"] + common
        if world > 1:
            bench += ["--nproc", str(world), "--out", "/tmp/plan_memory_here"]
        measured = json.loads(run(bench).strip().splitlines()[-1])
        peak = max(measured.get("pp_peak_bytes") or [measured["peak_bytes"]])
        predicted = plan["peak_memory_gib"] * 1024 * MiB
        error = predicted / peak - 1
        errors.append(abs(error))
        rows.append(f"| {name} | {world} | {predicted / MiB:.1f} | {peak / MiB:.1f} | {100 * error:+.1f}% | "
                    f"{measured['model_state_bytes'] / MiB:.1f} |")
        print(rows[-1], flush=True)
    summary = (f"mean absolute error {100 * statistics.mean(errors):.1f}%, worst {100 * max(errors):.1f}%, "
               f"within 5%: {sum(e <= 0.05 for e in errors)} of {len(errors)}")
    print(summary)
    if not a.only:
        with open(out, "w") as f:
            f.write("# tessera plan's peak memory against tensor bytes measured on this machine\n\n"
                    f"`python3 bench/plan_memory_here.py{' --held-out ' + a.held_out if a.held_out else ''}` (its docstring says "
                    "what is compared). Model keys: " + ", ".join(model) + ".\n\n"
                    "| layout | ranks | predicted peak MiB | measured peak MiB | error | measured model state MiB |\n"
                    "|---|---|---|---|---|---|\n")
            f.write("\n".join(rows) + "\n\n" + summary + "\n")


if __name__ == "__main__":
    main()
