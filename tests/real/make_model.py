"""Build the real-engine tier's tiny model: a random-init Qwen3ForCausalLM with Qwen3's real tokenizer.

    python make_model.py TOKENIZER_DIR OUT_DIR MAX_MODEL_LEN     (run with the engine environment's python)

2 layers, hidden size 128, 2 heads of 64, 2 KV heads, Qwen3's vocabulary, bf16: about 20 M parameters,
40 MB, built in seconds with a fixed seed. No weights come from a hub.
"""
import os
import shutil
import sys

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

tokenizer, out, max_len = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.manual_seed(20260629)
config = Qwen3Config(vocab_size=151936, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=2, head_dim=64, max_position_embeddings=max_len,
                     tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645)
model = Qwen3ForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(out)
for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(tokenizer, name), out)
print(f"{sum(p.numel() for p in model.parameters())} parameters in {out}")
