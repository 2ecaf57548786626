//! Every GDN variant's complete tensor list — names, shapes, dtypes, bytes, allocation order,
//! lifetimes and source lines — for a set of shapes that exercise each difference between the
//! variants (grouped value heads, `K != V` to catch layout swaps, varlen chunking, in-kernel
//! l2norm on and off, no final state), compared line by line with `tests/data/gdn_variants.txt`
//! (one tensor a line, as compact JSON).
//!
//! The file was written by the per-variant code before the variants became one table of
//! differences; it changes only when a model does. After a deliberate change, regenerate it with
//! `VRAMTRACE_BLESS=1 cargo test -p vramtrace-models --test gdn_variants_pinned` and review the diff.

use std::path::Path;

use vramtrace_models::{
    DType, GdnShape, ModelError, Tensor, gdn_fla_0_4_2, gdn_fla_0_6_0, gdn_vllm_0_10_2,
    gdn_vllm_0_20_1,
};

fn shape(seqlens: &[u64], hk: u64, hv: u64, k: u64, v: u64, dtype: DType) -> GdnShape {
    let mut s = GdnShape::new(seqlens, hk, k, v, dtype);
    s.num_v_heads = hv;
    s
}

fn cases() -> Vec<(&'static str, GdnShape)> {
    let mut gva_l2 = shape(&[4128], 16, 48, 128, 128, DType::BF16);
    gva_l2.l2norm_in_kernel = Some(true);
    let mut gva_no_l2 = shape(&[4128], 16, 48, 128, 128, DType::BF16);
    gva_no_l2.l2norm_in_kernel = Some(false);
    let mut varlen_no_state = shape(&[1000, 3000, 128], 8, 24, 128, 64, DType::F16);
    varlen_no_state.output_final_state = false;
    let mut tiny = shape(&[1, 65], 2, 4, 64, 32, DType::F32);
    tiny.l2norm_in_kernel = Some(true);
    vec![
        (
            "equal heads, defaults",
            shape(&[4128], 48, 48, 128, 128, DType::BF16),
        ),
        (
            "qwen3.6 layer, defaults",
            shape(&[4128], 16, 48, 128, 128, DType::BF16),
        ),
        ("qwen3.6 layer, l2norm in kernel", gva_l2),
        ("qwen3.6 layer, no l2norm", gva_no_l2),
        ("varlen, K != V, no final state", varlen_no_state),
        ("tiny, K != V, fp32, l2norm", tiny),
    ]
}

/// A variant's `tensors` function.
type TensorsFn = fn(&GdnShape) -> Result<Vec<Tensor>, ModelError>;

fn all_lines() -> Vec<String> {
    let variants: [(&str, TensorsFn); 4] = [
        (gdn_fla_0_6_0::NAME, gdn_fla_0_6_0::tensors),
        (gdn_fla_0_4_2::NAME, gdn_fla_0_4_2::tensors),
        (gdn_vllm_0_10_2::NAME, gdn_vllm_0_10_2::tensors),
        (gdn_vllm_0_20_1::NAME, gdn_vllm_0_20_1::tensors),
    ];
    let mut lines = Vec::new();
    for (name, tensors) in variants {
        for (case, s) in cases() {
            lines.push(format!("# {name}: {case}"));
            for t in tensors(&s).unwrap() {
                lines.push(serde_json::to_string(&t).unwrap());
            }
        }
    }
    lines
}

#[test]
fn every_variant_list_is_unchanged() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gdn_variants.txt");
    let got = all_lines();
    if std::env::var_os("VRAMTRACE_BLESS").is_some() {
        // Never under CI: a set variable would make the check pass by rewriting it.
        let ci = std::env::var("CI").unwrap_or_default();
        assert!(
            matches!(ci.as_str(), "" | "false" | "0"),
            "VRAMTRACE_BLESS is set, but CI is set: the pinned list is rewritten only by hand"
        );
        std::fs::write(&path, got.join("\n") + "\n").unwrap();
        return;
    }
    let text = std::fs::read_to_string(&path).unwrap();
    let want: Vec<&str> = text.lines().collect();
    let mut heading = "";
    for (got, want) in got.iter().zip(&want) {
        if want.starts_with('#') {
            heading = want;
        }
        assert_eq!(got, want, "{heading}: the tensor list changed");
    }
    assert_eq!(got.len(), want.len(), "the number of tensors changed");
}
