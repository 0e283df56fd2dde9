"""Reference outputs of the Llama-family models by transformers, for tests/hf/test_hf_families.cpp.

For each family, a small model with random weights (every block kind of the family switched on:
grouped-query attention, Llama 3.1's rope scaling, an untied head; Qwen 3's q/k norms, a head width
of its own and a tied head; Qwen 2's q, k, v biases; Mistral's sliding window wider than the test's
tokens; Qwen 3 MoE's dense first block and top-2 of 4 experts with renormalized gates; Qwen2-MoE's
q, k, v biases, raw top-2 gates and a shared expert twice an expert's width behind its sigmoid gate; Mixtral's top-2 of 4 SwiGLU experts, its balance loss left out as transformers leaves it out
without output_router_logits) is saved by save_pretrained into WORK/<family>/, and on fixed tokens transformers' float32
logits, loss and every parameter's gradient are written:
  WORK/<family>/reference.safetensors   tokens, targets [B, T] int64, logits [B, T, V], loss []
  WORK/<family>/grads/                  config.json and model.safetensors holding each parameter's
                                        gradient under its transformers name (read by tessera's
                                        own importer, so the names map as the weights do)
  WORK/mixtral/stacked/                 the same weights under transformers 5's in-memory names
                                        (experts stacked: mlp.experts.gate_up_proj, down_proj)
  WORK/deepseek_v3_router/reference.safetensors
                                        DeepSeek-V3's router alone (its attention, multi-head latent,
                                        is not built in tessera): 16 experts in 4 groups, top 4 from
                                        the best 2 groups, sigmoid scores plus the correction bias,
                                        renormalized and scaled by 2.5; its weight, bias, 64 hidden
                                        states and the experts and weights it chose
Exits 77 (CTest's skip) with a message when transformers cannot be imported.

usage: make_family_references.py WORK_DIR
"""
import os
import shutil
import sys

try:
    import torch
    import transformers
    from safetensors.torch import save_file
except ImportError as e:
    print(f"SKIP: transformers is not installed in this Python ({e}); scripts/install.sh installs it")
    sys.exit(77)

WORK = sys.argv[1]
COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=256, initializer_range=0.1)
FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
              dict(num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
                   rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
              dict(num_key_value_heads=2, head_dim=24, rms_norm_eps=1e-6, rope_theta=1000000.0,
                   tie_word_embeddings=True)),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              dict(num_key_value_heads=1, rms_norm_eps=1e-6, tie_word_embeddings=False)),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM,
                dict(num_key_value_heads=4, sliding_window=128, tie_word_embeddings=False)),
    "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
                  dict(num_key_value_heads=2, head_dim=24, rms_norm_eps=1e-6, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[0], tie_word_embeddings=False,
                       output_router_logits=False)),
    "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM,
                  dict(num_key_value_heads=2, rms_norm_eps=1e-6, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=64, norm_topk_prob=False,
                       mlp_only_layers=[0], tie_word_embeddings=False, output_router_logits=False)),
    "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM,
                dict(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False,
                     output_router_logits=False)),
}

shutil.rmtree(WORK, ignore_errors=True)
for family, (config_class, model_class, extra) in FAMILIES.items():
    torch.manual_seed(5)
    config = config_class(**COMMON, **extra, attn_implementation="eager")
    model = model_class(config).float()
    with torch.no_grad():  # norm weights away from 1 and biases away from 0, so that each is tested
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.2 * torch.randn_like(p))
    folder = os.path.join(WORK, family)
    model.save_pretrained(folder)
    tokens = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(7))
    targets = torch.roll(tokens, -1, dims=1)
    targets[:, -1] = -100  # ignored, as tessera's -1
    out = model(input_ids=tokens)
    loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, 256), targets.reshape(-1), ignore_index=-100)
    loss.backward()
    targets[:, -1] = -1
    save_file({"tokens": tokens, "targets": targets, "logits": out.logits.detach().contiguous(),
               "loss": loss.detach()}, os.path.join(folder, "reference.safetensors"))
    grads = os.path.join(folder, "grads")
    os.makedirs(grads)
    shutil.copy(os.path.join(folder, "config.json"), grads)
    save_file({name: p.grad.contiguous() for name, p in model.named_parameters()},
              os.path.join(grads, "model.safetensors"))
    if family == "mixtral":  # the experts stacked, as transformers 5 holds them in memory
        stacked = os.path.join(folder, "stacked")
        os.makedirs(stacked)
        shutil.copy(os.path.join(folder, "config.json"), stacked)
        save_file({name: t.contiguous() for name, t in model.state_dict().items()},
                  os.path.join(stacked, "model.safetensors"))
    print(f"{family}: {sum(p.numel() for p in model.parameters())} parameters, loss {loss.item():.6f}")

# DeepSeek-V3's group-limited router, by transformers' own module.
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter  # noqa: E402

router_config = transformers.DeepseekV3Config(hidden_size=64, n_routed_experts=16, num_experts_per_tok=4, n_group=4,
                                              topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5)
router = DeepseekV3TopkRouter(router_config)
torch.manual_seed(3)
with torch.no_grad():
    router.weight.normal_(0, 0.5)
    router.e_score_correction_bias.normal_(0, 0.2)
hidden = torch.randn(64, 64)
_, weights, experts = router(hidden)
folder = os.path.join(WORK, "deepseek_v3_router")
os.makedirs(folder)
save_file({"weight": router.weight.detach().contiguous(), "bias": router.e_score_correction_bias.contiguous(),
           "hidden": hidden, "experts": experts.contiguous(), "weights": weights.detach().contiguous()},
          os.path.join(folder, "reference.safetensors"))
print("deepseek_v3_router: 64 tokens, top 4 of 16 experts in the best 2 of 4 groups")
