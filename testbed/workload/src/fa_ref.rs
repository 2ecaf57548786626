//! CPU references for varlen attention: [`online`] mirrors the kernel (online
//! softmax in `f32`, output rounded to the dtype), [`naive_softmax`] is the
//! textbook two-pass softmax in `f64`.

use crate::fa::{FaConfig, FaHostInputs};

/// Output [total_q, H, D] and log-sum-exp [H, total_q] (unpadded layout).
#[derive(Clone, Debug, PartialEq)]
pub struct FaReference {
    /// The attention output.
    pub out: Vec<f32>,
    /// Natural-log softmax normaliser per query and head (+inf without keys).
    pub lse: Vec<f32>,
}

struct Row {
    i: usize,
    bq: usize,
    bk: usize,
    nkeys: usize,
}

fn rows(cfg: &FaConfig) -> Vec<Row> {
    let mut out = Vec::new();
    let (mut bq, mut bk) = (0, 0);
    for (&lq, &lk) in cfg.seqlens_q.iter().zip(&cfg.seqlens_k) {
        for i in 0..lq {
            // Bottom-right aligned causal mask (FlashAttention >= 2.1).
            let nkeys = if cfg.causal {
                (lk as i64 - lq as i64 + i as i64 + 1).clamp(0, lk as i64) as usize
            } else {
                lk
            };
            out.push(Row { i, bq, bk, nkeys });
        }
        bq += lq;
        bk += lk;
    }
    out
}

/// The kernel's algorithm on the CPU (heads in parallel).
pub fn online(cfg: &FaConfig, x: &FaHostInputs) -> FaReference {
    let (h, d, tq) = (cfg.heads, cfg.head_dim, cfg.total_q());
    let rows = rows(cfg);
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = h.div_ceil(workers);
    let mut heads: Vec<(Vec<f32>, Vec<f32>)> = vec![(Vec::new(), Vec::new()); h];
    std::thread::scope(|scope| {
        for (w, slot) in heads.chunks_mut(per).enumerate() {
            let rows = &rows;
            scope.spawn(move || {
                for (i, out) in slot.iter_mut().enumerate() {
                    *out = online_head(cfg, x, rows, w * per + i);
                }
            });
        }
    });
    let mut out = vec![0f32; tq * h * d];
    let mut lse = vec![0f32; h * tq];
    for (hh, (o, l)) in heads.into_iter().enumerate() {
        for row in 0..tq {
            out[(row * h + hh) * d..][..d].copy_from_slice(&o[row * d..][..d]);
        }
        lse[hh * tq..][..tq].copy_from_slice(&l);
    }
    FaReference { out, lse }
}

/// One head: (out [total_q][D], lse [total_q]).
fn online_head(cfg: &FaConfig, x: &FaHostInputs, rows: &[Row], hh: usize) -> (Vec<f32>, Vec<f32>) {
    let (h, hkv, d, tq) = (cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.total_q());
    let scale = cfg.scale();
    let hk = hh / (h / hkv);
    let mut out = vec![0f32; tq * d];
    let mut lse = vec![0f32; tq];
    let mut acc = vec![0f32; d];
    for r in rows {
        let row = r.bq + r.i;
        let q = &x.q[(row * h + hh) * d..][..d];
        let (mut mx, mut l) = (f32::NEG_INFINITY, 0f32);
        acc.fill(0.0);
        for j in 0..r.nkeys {
            let kv = ((r.bk + j) * hkv + hk) * d;
            let s: f32 = q
                .iter()
                .zip(&x.k[kv..kv + d])
                .map(|(&a, &b)| a * b)
                .sum::<f32>()
                * scale;
            let mnew = mx.max(s);
            let corr = (mx - mnew).exp();
            let p = (s - mnew).exp();
            l = l * corr + p;
            for (a, &vv) in acc.iter_mut().zip(&x.v[kv..kv + d]) {
                *a = *a * corr + p * vv;
            }
            mx = mnew;
        }
        for (o, a) in out[row * d..][..d].iter_mut().zip(&acc) {
            *o = cfg.dtype.round(if l > 0.0 { a / l } else { 0.0 });
        }
        lse[row] = if l > 0.0 { mx + l.ln() } else { f32::INFINITY };
    }
    (out, lse)
}

/// Two-pass softmax attention in `f64`: (out [total_q, H, D], lse [H, total_q]).
pub fn naive_softmax(cfg: &FaConfig, x: &FaHostInputs) -> (Vec<f64>, Vec<f64>) {
    let (h, hkv, d, tq) = (cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.total_q());
    let scale = cfg.scale() as f64;
    let mut out = vec![0f64; tq * h * d];
    let mut lse = vec![f64::INFINITY; h * tq];
    for r in rows(cfg) {
        let row = r.bq + r.i;
        for hh in 0..h {
            if r.nkeys == 0 {
                continue;
            }
            let hk = hh / (h / hkv);
            let q = &x.q[(row * h + hh) * d..][..d];
            let scores: Vec<f64> = (0..r.nkeys)
                .map(|j| {
                    let kv = ((r.bk + j) * hkv + hk) * d;
                    q.iter()
                        .zip(&x.k[kv..kv + d])
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
            for (j, s) in scores.iter().enumerate() {
                let p = (s - m).exp() / z;
                let kv = ((r.bk + j) * hkv + hk) * d;
                for (o, &vv) in out[(row * h + hh) * d..][..d]
                    .iter_mut()
                    .zip(&x.v[kv..kv + d])
                {
                    *o += p * vv as f64;
                }
            }
            lse[hh * tq + row] = m + z.ln();
        }
    }
    (out, lse)
}

/// Reorder a padded `[B, H, max_seqlen_q]` lse into `[H, total_q]`.
pub fn unpad_lse(cfg: &FaConfig, padded: &[f32]) -> Vec<f32> {
    let (h, tq, mq) = (cfg.heads, cfg.total_q(), cfg.max_seqlen_q());
    let mut out = vec![0f32; h * tq];
    let mut bq = 0;
    for (b, &lq) in cfg.seqlens_q.iter().enumerate() {
        for hh in 0..h {
            for i in 0..lq {
                out[hh * tq + bq + i] = padded[(b * h + hh) * mq + i];
            }
        }
        bq += lq;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::fa::generate_inputs;
    use crate::gdn_ref::max_abs_diff;

    fn cfg(q: &[usize], k: &[usize], causal: bool) -> FaConfig {
        FaConfig::new(q, 6, 2, 40, DType::F16)
            .with_kv_seqlens(k)
            .with_causal(causal)
    }

    fn check(c: &FaConfig) {
        let x = generate_inputs(c, 9);
        let r = online(c, &x);
        let (o, lse) = naive_softmax(c, &x);
        let (d_o, _) = max_abs_diff(&r.out, &o);
        // Rows without keys carry +inf in both.
        let finite: Vec<(f32, f64)> = r
            .lse
            .iter()
            .zip(&lse)
            .filter(|(a, _)| a.is_finite())
            .map(|(&a, &b)| (a, b))
            .collect();
        let (d_l, _) = max_abs_diff(
            &finite.iter().map(|p| p.0).collect::<Vec<_>>(),
            &finite.iter().map(|p| p.1).collect::<Vec<_>>(),
        );
        println!(
            "{:?}/{:?} causal={}: max |out - naive| = {d_o:.3e}, max |lse - naive| = {d_l:.3e}",
            c.seqlens_q, c.seqlens_k, c.causal
        );
        // Output is rounded to f16 (half an ulp of values below 4 is < 2e-3).
        assert!(d_o < 2e-3, "out differs by {d_o}");
        assert!(d_l < 1e-4, "lse differs by {d_l}");
        assert_eq!(
            r.lse.iter().filter(|v| v.is_infinite()).count(),
            lse.iter().filter(|v| v.is_infinite()).count()
        );
    }

    #[test]
    fn online_softmax_matches_naive_softmax_causal_varlen() {
        check(&cfg(&[1, 17, 130], &[1, 17, 130], true));
    }

    #[test]
    fn online_softmax_matches_naive_softmax_with_cached_keys() {
        // Chunked prefill: queries see a longer key run, bottom-right aligned.
        check(&cfg(&[5, 33], &[70, 33], true));
        check(&cfg(&[5, 33], &[70, 33], false));
    }

    #[test]
    fn queries_without_keys_get_infinite_lse_and_zero_output() {
        // More queries than keys: the first ones see nothing under a bottom-right mask.
        let c = cfg(&[8], &[3], true);
        let x = generate_inputs(&c, 1);
        let r = online(&c, &x);
        for hh in 0..6 {
            for i in 0..5 {
                assert!(r.lse[hh * 8 + i].is_infinite());
                assert!(r.out[(i * 6 + hh) * 40..][..40].iter().all(|&v| v == 0.0));
            }
            assert!(r.lse[hh * 8 + 5].is_finite());
        }
        check(&c);
    }

    #[test]
    fn unpad_reorders() {
        let mut c = cfg(&[2, 1], &[2, 1], true);
        c.heads = 2;
        c.kv_heads = 1;
        c.max_seqlen_q = Some(3);
        // [B=2, H=2, 3]
        let padded = [1., 2., -1., 3., 4., -1., 5., -1., -1., 6., -1., -1.];
        assert_eq!(unpad_lse(&c, &padded), vec![1., 2., 5., 3., 4., 6.]);
    }
}
