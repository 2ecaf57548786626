"""Issue 33: a GGUF of llama.cpp's `qwen35` architecture (Qwen3.5/3.6: Gated DeltaNet layers, a
full-attention layer every `full_attention_interval`) at a Hugging Face config's exact shapes,
f16 matrices and f32 norms, every value zero, written sparse: the header and the tensor infos,
then the file extended to its size without writing the data. Memory does not depend on the
weights' values, and a sparse file costs no disk; llama-quantize reads the zeros fast for the
quantized variants.

    python3 qwen35_gguf.py LLAMA_CPP_DIR CONFIG.json OUT.gguf [--layers N] [--context N]
        [--types TENSORS.txt [--header-only]] [--file-type N]

CONFIG.json: the model's config (its `text_config` when it has one), e.g.
samples/models/Qwen3.6-27B/config.json. The tensors are the ones `llama_model_qwen35::
load_arch_tensors` creates (src/models/qwen35.cpp:36-110 of the tree), without the MTP layer.
The vocabulary is the tree's Qwen2 one (models/ggml-vocab-qwen2.gguf), padded with unused
tokens to the config's vocab_size, as convert_hf_to_gguf.py pads a checkpoint's.

`--types TENSORS.txt` takes each tensor's type and bytes from a tensor list as the GPU machine
printed it (`name TYPE [shape] bytes`, e.g. a Q4_K_M file's); `--header-only` writes the header
alone, without the vocabulary or the data: a sample small enough to keep, which reads as the
model's own header to `vramtrace model`.
"""

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tree", type=Path, help="the llama.cpp source tree (its gguf-py and models/)")
    ap.add_argument("config", type=Path, help="the model's config.json")
    ap.add_argument("out", type=Path, help="the GGUF to write")
    ap.add_argument("--layers", type=int, help="fewer layers than the config's")
    ap.add_argument("--context", type=int, help="the training context (default the config's)")
    ap.add_argument("--types", type=Path, help="a tensor list giving each tensor's type and bytes")
    ap.add_argument("--file-type", type=int, default=1,
                    help="general.file_type (1 F16, 15 Q4_K_M); llama.cpp only prints it")
    ap.add_argument("--header-only", action="store_true",
                    help="no vocabulary and no data: the header alone")
    a = ap.parse_args()
    sys.path.insert(0, str(a.tree / "gguf-py"))
    import numpy as np
    import gguf
    from llama_gguf import copy_vocabulary

    c = json.loads(a.config.read_text())
    c = c.get("text_config", c)
    n_layer = a.layers or c["num_hidden_layers"]
    e, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    h, kvh, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    n_k, n_v = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
    if dk != dv:
        raise SystemExit("llama.cpp's qwen35 takes one GDN head dim (ssm.state_size) for keys and values")
    d_conv = c["linear_conv_kernel_dim"]
    interval = c.get("full_attention_interval", 4)
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    partial = c.get("partial_rotary_factor", rope.get("partial_rotary_factor", 0.25))
    sections = rope.get("mrope_section", [11, 11, 10])
    theta = c.get("rope_theta", rope.get("rope_theta", 10_000_000.0))
    key_dim, value_dim = dk * n_k, dv * n_v
    conv_dim = 2 * key_dim + value_dim

    w = gguf.GGUFWriter(str(a.out), "qwen35")
    w.add_context_length(a.context or c.get("max_position_embeddings", 262144))
    w.add_embedding_length(e)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(f)
    w.add_head_count(h)
    w.add_head_count_kv(kvh)
    w.add_key_length(d)
    w.add_value_length(d)
    w.add_rope_dimension_count(int(d * partial))
    w.add_rope_dimension_sections(list(sections) + [0] * (4 - len(sections)))
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(float(c.get("rms_norm_eps", 1e-6)))
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(value_dim)
    w.add_ssm_state_size(dk)
    w.add_ssm_time_step_rank(n_v)
    w.add_ssm_group_count(n_k)
    w.add_full_attention_interval(interval)
    w.add_file_type(a.file_type)
    had = 0
    if not a.header_only:
        vocab = gguf.GGUFReader(str(a.tree / "models" / "ggml-vocab-qwen2.gguf"))
        had = copy_vocabulary(gguf, vocab, w, v)
    w.add_vocab_size(v)
    types = {}
    if a.types:
        for line in a.types.read_text().splitlines():
            name, kind, rest = line.split(" ", 2)
            types[name] = (gguf.GGMLQuantizationType[kind], int(rest.rsplit(" ", 1)[1]))

    infos = []

    def tensor(name: str, ne: list, dtype) -> None:
        """A tensor of ggml shape `ne` (innermost first), in the type `--types` gives."""
        shape = tuple(reversed(ne))
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if name in types:
            kind, n = types.pop(name)
            w.add_tensor_info(name, shape, np.dtype(np.float32), n, raw_dtype=kind)
        else:
            w.add_tensor_info(name, shape, np.dtype(dtype), n)
        infos.append(n)

    f16, f32 = np.float16, np.float32
    tensor("token_embd.weight", [e, v], f16)
    tensor("output_norm.weight", [e], f32)
    if not c.get("tie_word_embeddings", False):
        tensor("output.weight", [e, v], f16)
    for i in range(n_layer):
        p = f"blk.{i}."
        tensor(p + "attn_norm.weight", [e], f32)
        tensor(p + "post_attention_norm.weight", [e], f32)
        if (i + 1) % interval == 0:
            # Full attention: Q and its gate in one projection (qwen35.cpp:64-70).
            tensor(p + "attn_q.weight", [e, 2 * h * d], f16)
            tensor(p + "attn_k.weight", [e, kvh * d], f16)
            tensor(p + "attn_v.weight", [e, kvh * d], f16)
            tensor(p + "attn_output.weight", [h * d, e], f16)
            tensor(p + "attn_q_norm.weight", [d], f32)
            tensor(p + "attn_k_norm.weight", [d], f32)
        else:
            # Gated DeltaNet (qwen35.cpp:71-83); the conv kernel stays f32 (ssm_conv wants it).
            tensor(p + "attn_qkv.weight", [e, conv_dim], f16)
            tensor(p + "attn_gate.weight", [e, value_dim], f16)
            tensor(p + "ssm_conv1d.weight", [d_conv, conv_dim], f32)
            tensor(p + "ssm_dt.bias", [n_v], f32)
            tensor(p + "ssm_a", [n_v], f32)
            tensor(p + "ssm_beta.weight", [e, n_v], f16)
            tensor(p + "ssm_alpha.weight", [e, n_v], f16)
            tensor(p + "ssm_norm.weight", [dv], f32)
            tensor(p + "ssm_out.weight", [value_dim, e], f16)
        tensor(p + "ffn_gate.weight", [e, f], f16)
        tensor(p + "ffn_down.weight", [f, e], f16)
        tensor(p + "ffn_up.weight", [e, f], f16)

    if types:
        raise SystemExit(f"{a.types} lists tensors this architecture does not make: {sorted(types)}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    if a.header_only:
        w.close()
        print(f"wrote {a.out}: the header of qwen35, {n_layer} layers")
        return 0
    fout = w.fout[0]
    start = gguf.GGUFWriter.ggml_pad(fout.tell(), w.data_alignment)
    size = start + sum(gguf.GGUFWriter.ggml_pad(n, w.data_alignment) for n in infos)
    fout.truncate(size)
    w.close()
    print(f"wrote {a.out}: qwen35, {n_layer} layers ({n_layer // interval} full attention), "
          f"hidden {e}, vocab {v} ({had} tokens of Qwen2's and {v - had} unused), "
          f"{size / 2**30:.2f} GiB sparse")
    return 0


if __name__ == "__main__":
    sys.exit(main())
