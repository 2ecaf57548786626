"""Random-weight transformers models with a word-level tokenizer, for runs that must not reach a
hub: a dense Qwen3 (served by `transformers serve --continuous-batching`) and a hybrid Qwen3.5
text model (Gated DeltaNet + attention layers; fla's kernels run when fla is importable).

Usage: python3 hf_models.py OUT_DIR [dense|hybrid|hybrid12 ...]
Writes OUT_DIR/<kind>/ with config.json, safetensors weights and a tokenizer whose vocabulary is
"w0" .. "w{N-1}" (so a prompt of N tokens is N words, see prompt()).
"""
import json
import os
import sys

# torch, tokenizers and transformers are imported where a model is made: serve_load.py imports
# prompt() from here, and a client that spent seconds importing them would time itself.
WORDS = 4000
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)


def tokenizer(out):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "<|im_start|>": 1, "<|im_end|>": 2, "<|endoftext|>": 3}
    for i in range(WORDS):
        vocab[f"w{i}"] = len(vocab)
    for role in ("system", "user", "assistant"):
        vocab[role] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", eos_token="<|im_end|>", pad_token="<|endoftext|>",
        bos_token="<|im_start|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return len(vocab)


def prompt(n):
    """A prompt of exactly n word tokens."""
    return " ".join(f"w{(i * 7919) % WORDS}" for i in range(n))


DENSE = dict(
    model_type="qwen3", hidden_size=2048, intermediate_size=6144, num_hidden_layers=16,
    num_attention_heads=16, num_key_value_heads=4, head_dim=128, vocab_size=32768,
    max_position_embeddings=32768, tie_word_embeddings=False, rms_norm_eps=1e-6,
)
# Qwen3.5's text model, shrunk: 8 layers (6 Gated DeltaNet, 2 attention), Qwen3.5's head shapes.
HYBRID = dict(
    model_type="qwen3_5_text", hidden_size=2048, intermediate_size=6144, num_hidden_layers=8,
    num_attention_heads=16, num_key_value_heads=2, head_dim=256, vocab_size=32768,
    linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
    linear_value_head_dim=128, linear_conv_kernel_dim=4, max_position_embeddings=65536,
    tie_word_embeddings=False, rms_norm_eps=1e-6,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2,
)
# The planner's validation model (docs/validation.md, "transformers generate(prefill_chunk_size)"):
# made for it, 12 layers (9 Gated DeltaNet, 3 attention), 4 KV heads, a long position range so
# that the limit, not the model, ends a chunked prefill.
HYBRID12 = dict(
    model_type="qwen3_5_text", hidden_size=2048, intermediate_size=5632, num_hidden_layers=12,
    num_attention_heads=16, num_key_value_heads=4, head_dim=256, vocab_size=32768,
    linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
    linear_value_head_dim=128, linear_conv_kernel_dim=4, max_position_embeddings=262144,
    tie_word_embeddings=False, rms_norm_eps=1e-6,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 3,
)
KINDS = {"dense": DENSE, "hybrid": HYBRID, "hybrid12": HYBRID12}


def make(out, kind):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(KINDS[kind])
    model_type = spec.pop("model_type")
    os.makedirs(out, exist_ok=True)
    n_vocab = tokenizer(out)
    spec["eos_token_id"] = 2
    spec["pad_token_id"] = 3
    spec["bos_token_id"] = 1
    assert n_vocab <= spec["vocab_size"]
    cfg = AutoConfig.for_model(model_type, **spec)
    cfg.torch_dtype = "bfloat16"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 3
    model.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    print(f"{kind}: {type(model).__name__} {n / 1e6:.1f} M parameters -> {out}")
    with open(os.path.join(out, "config.json")) as f:
        print(json.dumps({k: v for k, v in json.load(f).items() if k != "layer_types"}))
    del model
    torch.cuda.empty_cache()


if __name__ == "__main__":
    root = sys.argv[1]
    for kind in sys.argv[2:] or ["dense", "hybrid"]:
        make(os.path.join(root, kind), kind)
