"""Issue 33: a random-weight GGUF at a real architecture's exact shapes, for llama.cpp runs on the
GPU machine (memory does not depend on the weights' values).

    python3 llama_gguf.py LLAMA_CPP_DIR OUT.gguf [--layers 16 --hidden 2048 --ffn 8192
        --heads 32 --kv-heads 8 --context 131072]

The llama architecture (Llama-3.2-1B's shapes by default), every matrix f16 and every norm f32,
the vocabulary copied from the tree's own vocab-only GGUF (models/ggml-vocab-llama-spm.gguf),
written with the tree's gguf-py. Quantized variants come from llama-quantize.
"""

import argparse
import sys
from pathlib import Path


def copy_vocabulary(gguf, vocab, w, n_vocab: int | None = None) -> int:
    """Copies every `tokenizer.*` key of the reader `vocab` into the writer `w`; with `n_vocab`,
    pads the token list to it with `[PAD{i}]` tokens of type UNUSED, as convert_hf_to_gguf.py
    pads a checkpoint's. Returns the number of tokens the file had."""
    had = 0
    for name, field in vocab.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            if field.types[-1] == gguf.GGUFValueType.STRING:
                vals = [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
            else:
                vals = [field.parts[i][0].item() for i in field.data]
            if name == "tokenizer.ggml.tokens":
                had = len(vals)
                if n_vocab is not None:
                    vals += [f"[PAD{i}]" for i in range(len(vals), n_vocab)]
            elif name == "tokenizer.ggml.token_type" and n_vocab is not None:
                vals += [int(gguf.TokenType.UNUSED)] * (n_vocab - len(vals))
            w.add_array(name, vals)
        elif vtype == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(field.parts[field.data[0]]).decode("utf-8", "replace"))
        else:
            w.add_key_value(name, field.parts[field.data[0]][0].item(), vtype)
    if n_vocab is not None and had > n_vocab:
        raise SystemExit(f"the vocabulary has {had} tokens, more than vocab_size {n_vocab}")
    return had


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tree", type=Path, help="the llama.cpp source tree (its gguf-py and models/)")
    ap.add_argument("out", type=Path, help="the GGUF to write")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--context", type=int, default=131072)
    a = ap.parse_args()
    sys.path.insert(0, str(a.tree / "gguf-py"))
    import numpy as np
    import gguf

    vocab = gguf.GGUFReader(str(a.tree / "models" / "ggml-vocab-llama-spm.gguf"))
    w = gguf.GGUFWriter(str(a.out), "llama")
    head_dim = a.hidden // a.heads
    w.add_context_length(a.context)
    w.add_embedding_length(a.hidden)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(a.ffn)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    n_vocab = copy_vocabulary(gguf, vocab, w)
    w.add_vocab_size(n_vocab)
    rng = np.random.default_rng(0)

    def mat(rows: int, cols: int):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    kv = a.kv_heads * head_dim
    w.add_tensor("token_embd.weight", mat(n_vocab, a.hidden))
    for i in range(a.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(a.hidden, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", mat(a.hidden, a.hidden))
        w.add_tensor(p + "attn_k.weight", mat(kv, a.hidden))
        w.add_tensor(p + "attn_v.weight", mat(kv, a.hidden))
        w.add_tensor(p + "attn_output.weight", mat(a.hidden, a.hidden))
        w.add_tensor(p + "ffn_norm.weight", np.ones(a.hidden, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", mat(a.ffn, a.hidden))
        w.add_tensor(p + "ffn_up.weight", mat(a.ffn, a.hidden))
        w.add_tensor(p + "ffn_down.weight", mat(a.hidden, a.ffn))
    w.add_tensor("output_norm.weight", np.ones(a.hidden, dtype=np.float32))
    w.add_tensor("output.weight", mat(n_vocab, a.hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.out}: llama, {a.layers} layers, hidden {a.hidden}, vocab {n_vocab}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
