"""Issue 33: a GGUF's header alone (its metadata and tensor list, no tensor data), rebuilt from
the tensor list `h200.sh llama_runs` printed (llama-gguf-headers.txt: name, type, shape in
GGUF order, bytes) and the metadata `llama_gguf.py` writes: a sample small enough to keep,
which reads as the model's own header.

    python3 gguf_header_only.py LLAMA_CPP_DIR HEADERS.txt MODEL_NAME OUT.gguf [--file-type N] [--heads H]
"""

import argparse
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tree", type=Path)
    ap.add_argument("headers", type=Path)
    ap.add_argument("model", help="the '# …/NAME.gguf' section of HEADERS.txt to rebuild")
    ap.add_argument("out", type=Path)
    ap.add_argument("--file-type", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32, help="attention heads (llama_gguf.py --heads)")
    a = ap.parse_args()
    sys.path.insert(0, str(a.tree / "gguf-py"))
    import numpy as np
    import gguf
    from llama_gguf import copy_vocabulary

    rows, cur = [], None
    for line in a.headers.read_text().splitlines():
        if line.startswith("#"):
            cur = Path(line.split()[1]).name
            continue
        if cur == a.model:
            name, kind, rest = line.split(" ", 2)
            shape_text, nbytes = rest.rsplit(" ", 1)
            shape = [int(x) for x in shape_text.strip("[]").split(",")]
            rows.append((name, gguf.GGMLQuantizationType[kind], shape, int(nbytes)))
    if not rows:
        sys.exit(f"no tensors of {a.model} in {a.headers}")
    vocab = gguf.GGUFReader(str(a.tree / "models" / "ggml-vocab-llama-spm.gguf"))
    w = gguf.GGUFWriter(str(a.out), "llama")
    n_layers = 1 + max(int(r[0].split(".")[1]) for r in rows if r[0].startswith("blk."))
    dims = {r[0]: r[2] for r in rows}
    hidden = dims["token_embd.weight"][0]
    kv = dims["blk.0.attn_k.weight"][1]
    w.add_context_length(131072)
    w.add_embedding_length(hidden)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(dims["blk.0.ffn_gate.weight"][1])
    w.add_head_count(a.heads)
    w.add_head_count_kv(kv // (hidden // a.heads))
    w.add_rope_dimension_count(hidden // a.heads)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(a.file_type)
    copy_vocabulary(gguf, vocab, w)
    for name, kind, shape, nbytes in rows:
        # gguf-py takes the numpy order (outermost first) and the element dtype it stores.
        dtype = {gguf.GGMLQuantizationType.F32: np.float32,
                 gguf.GGMLQuantizationType.F16: np.float16}.get(kind, np.uint8)
        np_shape = list(reversed(shape))
        if dtype is np.uint8:
            # A quantized tensor goes in as bytes: its rows in blocks.
            blck, size = gguf.GGML_QUANT_SIZES[kind]
            np_shape[-1] = np_shape[-1] // blck * size
        w.add_tensor_info(name, np_shape, np.dtype(dtype), nbytes, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    print(f"wrote {a.out}: {len(rows)} tensors, header only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
