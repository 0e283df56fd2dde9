"""Golden file for the safetensors reader: written by Python, read by C++ (test_safetensors)."""
import torch

import st


def generate(out):
    st.save(out / "safetensors_roundtrip.safetensors", {
        "f32": torch.arange(6, dtype=torch.float32).reshape(2, 3) / 7,
        "bf16": torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16),
        "i64": torch.tensor([[1, -2], [3, 2**40]], dtype=torch.int64),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "empty": torch.zeros(0, 4),
    }, metadata={"format": "pt", "note": "from python"})
