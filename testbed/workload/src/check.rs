//! `--check`: compare what the kernels computed (captured from the device)
//! with the CPU references, tensor by tensor.

use crate::dtype::DType;
use crate::fa::FaConfig;
use crate::fa::FaHostInputs;
use crate::fa_ref;
use crate::gdn::{GdnConfig, GdnHostInputs};
use crate::gdn_ref::{self, max_abs_diff};
use crate::tensor::Captured;
#[cfg(test)]
use crate::tensor::TensorSpec;

/// One tensor's agreement with its reference.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// The tensor.
    pub name: String,
    /// Largest |device - reference|.
    pub max_abs_err: f64,
    /// Largest |reference|.
    pub max_ref: f64,
    /// The allowed max_abs_err.
    pub tolerance: f64,
}

impl Comparison {
    fn new(name: &str, (max_abs_err, max_ref): (f64, f64), rel: f64) -> Self {
        Self {
            name: name.into(),
            max_abs_err,
            max_ref,
            tolerance: rel * max_ref.max(1.0),
        }
    }

    /// Whether the error is within tolerance.
    pub fn passed(&self) -> bool {
        self.max_abs_err <= self.tolerance
    }
}

/// Relative tolerance (of max(1, max|ref|)) for GDN tensors computed in `dtype`:
/// the device and the reference round at the same points, but FMA contraction
/// and exp2 differ in the last fp32 bits, which can flip a rounding of the
/// storage type and carry through the chunk recurrence.
pub fn gdn_tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 3e-2,
        DType::F16 => 5e-3,
        _ => 2e-4,
    }
}

fn decode(captured: &Captured, name: &str) -> Option<Vec<f32>> {
    captured
        .get(name)
        .map(|(spec, bytes)| spec.dtype.decode(bytes))
}

/// Compare every captured GDN intermediate and output with [`gdn_ref::chunked`],
/// and, for small problems, o and final_state with the exact recurrence.
pub fn gdn(cfg: &GdnConfig, host: &GdnHostInputs, captured: &Captured) -> Vec<Comparison> {
    let reference = gdn_ref::chunked(cfg, host);
    let tol = gdn_tolerance(cfg.dtype);
    let mut out = Vec::new();
    for name in [
        "q_l2norm",
        "k_l2norm",
        "g_cumsum",
        "A",
        "w",
        "u",
        "h",
        "v_new",
        "final_state",
        "o",
    ] {
        if let (Some(got), Some(want)) = (decode(captured, name), reference.by_name(name)) {
            out.push(Comparison::new(name, max_abs_diff(&got, want), tol));
        }
    }
    let work = cfg.tokens() * cfg.heads * cfg.key_dim * cfg.value_dim;
    if work <= 1 << 26 {
        let (o, fs) = gdn_ref::naive_recurrent(cfg, host);
        if let Some(got) = decode(captured, "o") {
            out.push(Comparison::new(
                "o vs exact recurrence",
                max_abs_diff(&got, &o),
                tol.max(2e-4),
            ));
        }
        if let Some(got) = decode(captured, "final_state") {
            out.push(Comparison::new(
                "final_state vs exact recurrence",
                max_abs_diff(&got, &fs),
                tol.max(2e-4),
            ));
        }
    }
    out
}

/// Compare FlashAttention's captured `out` and `softmax_lse` with [`fa_ref::online`].
pub fn fa(cfg: &FaConfig, host: &FaHostInputs, captured: &Captured) -> Vec<Comparison> {
    let reference = fa_ref::online(cfg, host);
    let mut out = Vec::new();
    let rel = match cfg.dtype {
        DType::F16 => 2e-3,
        _ => 1.6e-2,
    };
    if let Some(got) = decode(captured, "out") {
        out.push(Comparison::new(
            "out",
            max_abs_diff(&got, &reference.out),
            rel,
        ));
    }
    if let Some(got) = decode(captured, "softmax_lse") {
        let got = if cfg.padded_lse {
            fa_ref::unpad_lse(cfg, &got)
        } else {
            got
        };
        // Rows without keys hold +inf on both sides; compare the rest, and count
        // a mismatch in where the infinities are as an infinite error.
        let mut pairs = (Vec::new(), Vec::new());
        let mut inf_mismatch = false;
        for (&g, &w) in got.iter().zip(&reference.lse) {
            if w.is_finite() && g.is_finite() {
                pairs.0.push(g);
                pairs.1.push(w);
            } else if w.is_finite() != g.is_finite() {
                inf_mismatch = true;
            }
        }
        let (mut err, max) = max_abs_diff(&pairs.0, &pairs.1);
        if inf_mismatch {
            err = f64::INFINITY;
        }
        out.push(Comparison::new("softmax_lse", (err, max), 1e-4));
    }
    let work = cfg.total_q() * cfg.heads * cfg.total_k() * cfg.head_dim;
    if work <= 1 << 28
        && let Some(got) = decode(captured, "out")
    {
        let (o, _) = fa_ref::naive_softmax(cfg, host);
        out.push(Comparison::new(
            "out vs two-pass softmax",
            max_abs_diff(&got, &o),
            rel,
        ));
    }
    out
}

/// Format comparisons as a small table; true when all passed.
pub fn render(title: &str, rows: &[Comparison]) -> (String, bool) {
    let mut s = format!("{title}\n");
    s += &format!(
        "  {:<32} {:>12} {:>12} {:>12}  result\n",
        "tensor", "max abs err", "max |ref|", "tolerance"
    );
    let mut ok = true;
    for r in rows {
        ok &= r.passed();
        s += &format!(
            "  {:<32} {:>12.3e} {:>12.3e} {:>12.3e}  {}\n",
            r.name,
            r.max_abs_err,
            r.max_ref,
            r.tolerance,
            if r.passed() { "ok" } else { "FAIL" }
        );
    }
    (s, ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::encode_i64;
    use crate::fa::{FaApi, generate_inputs as fa_inputs};
    use crate::gdn::generate_inputs as gdn_inputs;

    fn gdn_cfg(dtype: DType) -> GdnConfig {
        GdnConfig {
            seqlens: vec![70, 3],
            varlen: true,
            heads: 2,
            key_heads: 1,
            key_dim: 16,
            value_dim: 8,
            dtype,
            scale: None,
            qk_l2norm: true,
            initial_state: true,
        }
    }

    /// A device whose tensors are the reference's, encoded as the device stores them.
    fn perfect_gdn(cfg: &GdnConfig, host: &GdnHostInputs) -> Captured {
        let r = gdn_ref::chunked(cfg, host);
        let mut cap = Captured::new();
        let t = cfg.tokens();
        let (h, hk, kd, vd) = (cfg.heads, cfg.key_heads, cfg.key_dim, cfg.value_dim);
        let (n, nt) = (cfg.sequences(), cfg.chunks());
        let dt = cfg.dtype;
        let specs = [
            ("q_l2norm", dt, vec![1, t, hk, kd]),
            ("k_l2norm", dt, vec![1, t, hk, kd]),
            ("g_cumsum", DType::F32, vec![1, t, h]),
            ("A", dt, vec![1, t, h, 64]),
            ("w", dt, vec![1, t, h, kd]),
            ("u", dt, vec![1, t, h, vd]),
            ("h", dt, vec![1, nt, h, kd, vd]),
            ("v_new", dt, vec![1, t, h, vd]),
            ("final_state", DType::F32, vec![n, h, kd, vd]),
            ("o", dt, vec![1, t, h, vd]),
        ];
        for (name, dtype, shape) in specs {
            let values = r.by_name(name).unwrap();
            let spec = TensorSpec::new(name, dtype, &shape);
            assert_eq!(spec.numel(), values.len(), "{name}");
            cap.insert(name.to_string(), (spec, dtype.encode(values)));
        }
        // Integer tensors are not compared.
        let idx = TensorSpec::new("chunk_indices", DType::I64, &[2]);
        cap.insert("chunk_indices".into(), (idx, encode_i64(&[0, 0])));
        cap
    }

    #[test]
    fn a_perfect_device_passes_and_a_corrupted_tensor_fails() {
        for dtype in [DType::BF16, DType::F32] {
            let cfg = gdn_cfg(dtype);
            let host = gdn_inputs(&cfg, 3);
            let mut cap = perfect_gdn(&cfg, &host);
            let rows = gdn(&cfg, &host, &cap);
            // 10 tensors plus o and final_state against the exact recurrence.
            assert_eq!(rows.len(), 12, "{rows:?}");
            for r in &rows {
                if r.name.contains("exact") {
                    assert!(r.passed(), "{r:?}");
                } else {
                    assert_eq!(r.max_abs_err, 0.0, "{r:?}");
                }
            }
            let (spec, bytes) = cap.get_mut("h").unwrap();
            let mut vals = spec.dtype.decode(bytes);
            vals[5] += 1.0;
            *bytes = spec.dtype.encode(&vals);
            let rows = gdn(&cfg, &host, &cap);
            let bad: Vec<&str> = rows
                .iter()
                .filter(|r| !r.passed())
                .map(|r| r.name.as_str())
                .collect();
            assert_eq!(bad, ["h"]);
            let (text, ok) = render("t", &rows);
            assert!(!ok && text.contains("FAIL"), "{text}");
        }
    }

    #[test]
    fn fa_check_unpads_the_padded_layout() {
        let cfg = FaConfig::new(&[3, 9], 4, 2, 16, DType::BF16)
            .with_padded_lse(true)
            .with_max_seqlen_q(Some(12))
            .with_api(FaApi::FlashAttn);
        let host = fa_inputs(&cfg, 1);
        let r = fa_ref::online(&cfg, &host);
        // Pad [H, total_q] into [B, H, 12], leaving the tail as garbage.
        let mut padded = vec![-7.0f32; 2 * 4 * 12];
        for hh in 0..4 {
            for i in 0..3 {
                padded[hh * 12 + i] = r.lse[hh * 12 + i];
            }
            for i in 0..9 {
                padded[(4 + hh) * 12 + i] = r.lse[hh * 12 + 3 + i];
            }
        }
        let mut cap = Captured::new();
        cap.insert(
            "out".into(),
            (
                TensorSpec::new("out", DType::BF16, &[12, 4, 16]),
                DType::BF16.encode(&r.out),
            ),
        );
        cap.insert(
            "softmax_lse".into(),
            (
                TensorSpec::new("softmax_lse", DType::F32, &[2, 4, 12]),
                DType::F32.encode(&padded),
            ),
        );
        let rows = fa(&cfg, &host, &cap);
        assert_eq!(rows.len(), 3);
        assert!(rows.iter().all(|r| r.passed()), "{rows:?}");
        assert_eq!(rows[1].max_abs_err, 0.0);
    }
}
