"""Tiny random checkpoints of the four architectures, written by transformers, and the greedy
tokens transformers' own `generate` produces from them (fp32, CPU)."""
from __future__ import annotations

import json
import os

import torch

# Small vocabulary (the stored files stay tiny); initializer_range 0.1 spreads the logits so greedy
# choices are decided by clear margins, not by rounding.
COMMON = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.1,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
MODELS = {
    "tiny-qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32, tie_word_embeddings=False)),
    "tiny-qwen3-tied": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16, tie_word_embeddings=True)),
    "tiny-llama": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=False, rope_theta=10000.0)),
    "tiny-qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=False)),  # q/k/v bias
}
# prompts of different lengths, seeded
PROMPTS = [[int(t) for t in torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(n))]
           for n in (1, 5, 17, 40, 64)]
MAX_NEW_TOKENS = 24


def build_model(name: str, out_dir: str):
    import transformers
    cfg_cls, model_cls, extra = MODELS[name]
    cfg = getattr(transformers, cfg_cls)(**COMMON, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg).float().eval()
    path = os.path.join(out_dir, name)
    model.save_pretrained(path)
    for fname in ("config.json", "generation_config.json"):  # keep the files independent of the version
        with open(os.path.join(path, fname)) as f:
            d = json.load(f)
        d.pop("transformers_version", None)
        with open(os.path.join(path, fname), "w") as f:
            json.dump(d, f, indent=2, sort_keys=True)
    return model


def hf_greedy(model, prompts, max_new_tokens: int) -> list[list[int]]:
    out = []
    for p in prompts:
        ids = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                             max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
        out.append(ids[0, len(p):].tolist())
    return out


def build(out_dir: str) -> None:
    tokens = {}
    for name in MODELS:
        model = build_model(name, out_dir)
        with torch.no_grad():
            tokens[name] = hf_greedy(model, PROMPTS, MAX_NEW_TOKENS)
    with open(os.path.join(out_dir, "greedy_tokens.json"), "w") as f:
        json.dump({"prompts": PROMPTS, "max_new_tokens": MAX_NEW_TOKENS, "tokens": tokens}, f, indent=1)
