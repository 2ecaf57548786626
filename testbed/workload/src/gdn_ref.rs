//! CPU references for the gated delta rule.
//!
//! [`chunked`] is the same chunked algorithm as the kernels, stage by stage,
//! accumulating in `f32` and rounding to the storage dtype exactly where the
//! kernels (and fla) do; with `DType::F32` it rounds nowhere. [`naive_recurrent`]
//! is fla's token-by-token reference (`fla/ops/gated_delta_rule/naive.py`,
//! `naive_recurrent_gated_delta_rule`) in `f64`:
//!
//! ```text
//! S_t = S_{t-1} * exp(g_t)
//! S_t = S_t + k_t ⊗ (beta_t * (v_t - S_tᵀ k_t))
//! o_t = S_tᵀ (q_t * scale)
//! ```
//!
//! with `S` [K, V] per sequence and value head, starting from the initial state.

use std::thread;

use crate::dtype::DType;
use crate::gdn::{CHUNK, GdnConfig, GdnHostInputs, L2NORM_EPS, RCP_LN2};

/// Every tensor the chunked forward produces, in the device layouts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GdnReference {
    /// q after l2norm [T, HK, K] (with `qk_l2norm`).
    pub q_l2norm: Option<Vec<f32>>,
    /// k after l2norm [T, HK, K] (with `qk_l2norm`).
    pub k_l2norm: Option<Vec<f32>>,
    /// g_cumsum [T, HV], log2 space.
    pub g_cumsum: Vec<f32>,
    /// A [T, HV, 64].
    pub a: Vec<f32>,
    /// w [T, HV, K].
    pub w: Vec<f32>,
    /// u [T, HV, V].
    pub u: Vec<f32>,
    /// h [NT, HV, K, V].
    pub h: Vec<f32>,
    /// v_new [T, HV, V].
    pub v_new: Vec<f32>,
    /// final_state [N, HV, K, V].
    pub final_state: Vec<f32>,
    /// o [T, HV, V].
    pub o: Vec<f32>,
}

impl GdnReference {
    /// The tensor a dump or capture names `name`, if this reference has it.
    pub fn by_name(&self, name: &str) -> Option<&[f32]> {
        Some(match name {
            "q_l2norm" => self.q_l2norm.as_deref()?,
            "k_l2norm" => self.k_l2norm.as_deref()?,
            "g_cumsum" => &self.g_cumsum,
            "A" => &self.a,
            "w" => &self.w,
            "u" => &self.u,
            "h" => &self.h,
            "v_new" => &self.v_new,
            "final_state" => &self.final_state,
            "o" => &self.o,
            _ => return None,
        })
    }
}

fn l2norm_rows(x: &[f32], d: usize, dt: DType) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(d) {
        let s: f32 = row.iter().map(|&v| v * v).sum();
        let r = 1.0 / (s + L2NORM_EPS).sqrt();
        out.extend(row.iter().map(|&v| dt.round(v * r)));
    }
    out
}

struct Seq {
    bos: usize,
    len: usize,
    first_chunk: usize,
}

fn sequences(cfg: &GdnConfig) -> Vec<Seq> {
    let mut out = Vec::new();
    let (mut bos, mut chunk) = (0, 0);
    for &len in &cfg.seqlens {
        out.push(Seq {
            bos,
            len,
            first_chunk: chunk,
        });
        bos += len;
        chunk += len.div_ceil(CHUNK);
    }
    out
}

/// Per-value-head results, in head-local layouts ([T][..] without the head axis).
struct HeadOut {
    a: Vec<f32>,
    w: Vec<f32>,
    u: Vec<f32>,
    h: Vec<f32>,
    v_new: Vec<f32>,
    final_state: Vec<f32>,
    o: Vec<f32>,
}

/// The chunked forward on the CPU, rounding like the kernels for `cfg.dtype`.
pub fn chunked(cfg: &GdnConfig, x: &GdnHostInputs) -> GdnReference {
    let dt = cfg.dtype;
    let (t, hv, hk, kd) = (cfg.tokens(), cfg.heads, cfg.key_heads, cfg.key_dim);
    let (q_l2, k_l2) = if cfg.qk_l2norm {
        (
            Some(l2norm_rows(&x.q, kd, dt)),
            Some(l2norm_rows(&x.k, kd, dt)),
        )
    } else {
        (None, None)
    };
    let q = q_l2.as_deref().unwrap_or(&x.q);
    let k = k_l2.as_deref().unwrap_or(&x.k);

    // chunk_local_cumsum, scaled to log2 space.
    let mut g_cumsum = vec![0f32; t * hv];
    for s in sequences(cfg) {
        for c0 in (0..s.len).step_by(CHUNK) {
            for h in 0..hv {
                let mut acc = 0f32;
                for tt in c0..(c0 + CHUNK).min(s.len) {
                    let idx = (s.bos + tt) * hv + h;
                    acc += x.g[idx];
                    g_cumsum[idx] = acc * RCP_LN2;
                }
            }
        }
    }

    // Heads are independent: one thread per head, up to the machine's cores.
    let workers = thread::available_parallelism().map_or(1, |n| n.get());
    let mut heads: Vec<Option<HeadOut>> = (0..hv).map(|_| None).collect();
    thread::scope(|scope| {
        for (w, slot) in heads.chunks_mut(hv.div_ceil(workers)).enumerate() {
            let base = w * hv.div_ceil(workers);
            let gc = &g_cumsum;
            scope.spawn(move || {
                for (i, out) in slot.iter_mut().enumerate() {
                    *out = Some(one_head(cfg, x, q, k, gc, base + i, hk));
                }
            });
        }
    });

    let (vd, n, nt) = (cfg.value_dim, cfg.sequences(), cfg.chunks());
    let mut r = GdnReference {
        q_l2norm: q_l2.clone(),
        k_l2norm: k_l2.clone(),
        g_cumsum,
        a: vec![0.0; t * hv * CHUNK],
        w: vec![0.0; t * hv * kd],
        u: vec![0.0; t * hv * vd],
        h: vec![0.0; nt * hv * kd * vd],
        v_new: vec![0.0; t * hv * vd],
        final_state: vec![0.0; n * hv * kd * vd],
        o: vec![0.0; t * hv * vd],
    };
    let scatter = |dst: &mut [f32], src: &[f32], rows: usize, width: usize, h: usize| {
        for row in 0..rows {
            dst[(row * hv + h) * width..][..width].copy_from_slice(&src[row * width..][..width]);
        }
    };
    for (h, out) in heads.into_iter().enumerate() {
        let o = out.expect("every head computed");
        scatter(&mut r.a, &o.a, t, CHUNK, h);
        scatter(&mut r.w, &o.w, t, kd, h);
        scatter(&mut r.u, &o.u, t, vd, h);
        scatter(&mut r.v_new, &o.v_new, t, vd, h);
        scatter(&mut r.o, &o.o, t, vd, h);
        scatter(&mut r.h, &o.h, nt, kd * vd, h);
        scatter(&mut r.final_state, &o.final_state, n, kd * vd, h);
    }
    r
}

fn one_head(
    cfg: &GdnConfig,
    x: &GdnHostInputs,
    q: &[f32],
    k: &[f32],
    gc: &[f32],
    h: usize,
    hk_count: usize,
) -> HeadOut {
    let dt = cfg.dtype;
    let rnd = |v: f32| dt.round(v);
    let (t, hv, kd, vd) = (cfg.tokens(), cfg.heads, cfg.key_dim, cfg.value_dim);
    let hk = h / (hv / hk_count);
    let kr = |tok: usize| &k[(tok * hk_count + hk) * kd..][..kd];
    let qr = |tok: usize| &q[(tok * hk_count + hk) * kd..][..kd];
    let g = |tok: usize| gc[tok * hv + h];
    let beta = |tok: usize| x.beta[tok * hv + h];
    let vrow = |tok: usize| &x.v[(tok * hv + h) * vd..][..vd];
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).fold(0f32, |s, (&p, &q)| s + p * q);

    let mut out = HeadOut {
        a: vec![0.0; t * CHUNK],
        w: vec![0.0; t * kd],
        u: vec![0.0; t * vd],
        h: vec![0.0; cfg.chunks() * kd * vd],
        v_new: vec![0.0; t * vd],
        final_state: vec![0.0; cfg.sequences() * kd * vd],
        o: vec![0.0; t * vd],
    };

    for (si, s) in sequences(cfg).iter().enumerate() {
        // State S [K][V] in fp32, from the initial state.
        let mut st = vec![0f32; kd * vd];
        if let Some(h0) = &x.h0 {
            st.copy_from_slice(&h0[(si * hv + h) * kd * vd..][..kd * vd]);
        }
        for (c, t0) in (0..s.len).step_by(CHUNK).enumerate() {
            let n = CHUNK.min(s.len - t0);
            let tok = |i: usize| s.bos + t0 + i;

            // kkt + solve_tril: A = (I + L)^-1.
            let mut l = vec![0f32; CHUNK * CHUNK];
            for i in 0..n {
                for j in 0..i {
                    let acc = dot(kr(tok(i)), kr(tok(j)));
                    l[i * CHUNK + j] = acc * (g(tok(i)) - g(tok(j))).exp2() * beta(tok(i));
                }
            }
            let mut ti = vec![0f32; CHUNK * CHUNK];
            for i in 0..n {
                for col in 0..CHUNK {
                    let mut acc = if i == col { 1f32 } else { 0f32 };
                    for j in 0..i {
                        acc -= l[i * CHUNK + j] * ti[j * CHUNK + col];
                    }
                    ti[i * CHUNK + col] = acc;
                }
            }
            let a: Vec<f32> = ti.iter().map(|&v| rnd(v)).collect();
            for i in 0..n {
                out.a[tok(i) * CHUNK..][..CHUNK].copy_from_slice(&a[i * CHUNK..][..CHUNK]);
            }

            // recompute_w_u: u = A @ round(v*beta), w = A @ round(round(k*beta) * exp2(g)).
            let vb: Vec<Vec<f32>> = (0..n)
                .map(|j| {
                    vrow(tok(j))
                        .iter()
                        .map(|&v| rnd(v * beta(tok(j))))
                        .collect()
                })
                .collect();
            let kb: Vec<Vec<f32>> = (0..n)
                .map(|j| {
                    let e = g(tok(j)).exp2();
                    kr(tok(j))
                        .iter()
                        .map(|&kv| rnd(rnd(kv * beta(tok(j))) * e))
                        .collect()
                })
                .collect();
            let mut u = vec![vec![0f32; vd]; n];
            let mut w = vec![vec![0f32; kd]; n];
            for i in 0..n {
                for col in 0..vd {
                    let mut acc = 0f32;
                    for (j, row) in vb.iter().enumerate() {
                        acc += a[i * CHUNK + j] * row[col];
                    }
                    u[i][col] = rnd(acc);
                }
                for col in 0..kd {
                    let mut acc = 0f32;
                    for (j, row) in kb.iter().enumerate() {
                        acc += a[i * CHUNK + j] * row[col];
                    }
                    w[i][col] = rnd(acc);
                }
                out.u[tok(i) * vd..][..vd].copy_from_slice(&u[i]);
                out.w[tok(i) * kd..][..kd].copy_from_slice(&w[i]);
            }

            // chunk_fwd_h: store the state, then v_new, then advance the state.
            let gci = s.first_chunk + c;
            let hs: Vec<f32> = st.iter().map(|&v| rnd(v)).collect();
            out.h[gci * kd * vd..][..kd * vd].copy_from_slice(&hs);
            let glast = g(tok(n - 1));
            let mut vg = vec![vec![0f32; vd]; n];
            let mut vnew = vec![vec![0f32; vd]; n];
            for tt in 0..n {
                for col in 0..vd {
                    let mut acc = 0f32;
                    for kk in 0..kd {
                        acc += w[tt][kk] * hs[kk * vd + col];
                    }
                    let vn = u[tt][col] - acc;
                    vnew[tt][col] = rnd(vn);
                    vg[tt][col] = rnd(vn * (glast - g(tok(tt))).exp2());
                }
                out.v_new[tok(tt) * vd..][..vd].copy_from_slice(&vnew[tt]);
            }
            let eg = glast.exp2();
            for kk in 0..kd {
                for col in 0..vd {
                    let mut acc = st[kk * vd + col] * eg;
                    for (tt, row) in vg.iter().enumerate() {
                        acc += kr(tok(tt))[kk] * row[col];
                    }
                    st[kk * vd + col] = acc;
                }
            }

            // chunk_fwd_o.
            let mut aq = vec![0f32; CHUNK * CHUNK];
            for i in 0..n {
                for j in 0..=i {
                    let acc = dot(qr(tok(i)), kr(tok(j)));
                    aq[i * CHUNK + j] = rnd(acc * (g(tok(i)) - g(tok(j))).exp2());
                }
            }
            let scale = cfg.scale();
            for i in 0..n {
                let qi = qr(tok(i));
                for col in 0..vd {
                    let mut a1 = 0f32;
                    for kk in 0..kd {
                        a1 += qi[kk] * hs[kk * vd + col];
                    }
                    let mut a2 = 0f32;
                    for (j, row) in vnew.iter().enumerate().take(i + 1) {
                        a2 += aq[i * CHUNK + j] * row[col];
                    }
                    out.o[tok(i) * vd + col] = rnd(a1 * g(tok(i)).exp2() * scale + a2 * scale);
                }
            }
        }
        out.final_state[si * kd * vd..][..kd * vd].copy_from_slice(&st);
    }
    out
}

/// fla's `naive_recurrent_gated_delta_rule` in `f64`, per sequence, on the
/// same inputs (l2-normalising q and k first when `qk_l2norm`). Returns
/// `(o [T, HV, V], final_state [N, HV, K, V])`.
pub fn naive_recurrent(cfg: &GdnConfig, x: &GdnHostInputs) -> (Vec<f64>, Vec<f64>) {
    let (t, hv, hkc, kd, vd, n) = (
        cfg.tokens(),
        cfg.heads,
        cfg.key_heads,
        cfg.key_dim,
        cfg.value_dim,
        cfg.sequences(),
    );
    let norm = |rows: &[f32]| -> Vec<f64> {
        let mut out: Vec<f64> = rows.iter().map(|&v| v as f64).collect();
        if cfg.qk_l2norm {
            for row in out.chunks_mut(kd) {
                let s: f64 = row.iter().map(|v| v * v).sum();
                let r = 1.0 / (s + L2NORM_EPS as f64).sqrt();
                row.iter_mut().for_each(|v| *v *= r);
            }
        }
        out
    };
    let (q, k) = (norm(&x.q), norm(&x.k));
    let scale = cfg.scale() as f64;
    let mut o = vec![0f64; t * hv * vd];
    let mut fs = vec![0f64; n * hv * kd * vd];
    for (si, s) in sequences(cfg).iter().enumerate() {
        for h in 0..hv {
            let hk = h / (hv / hkc);
            let mut st = vec![0f64; kd * vd];
            if let Some(h0) = &x.h0 {
                for (d, &v) in st.iter_mut().zip(&h0[(si * hv + h) * kd * vd..][..kd * vd]) {
                    *d = v as f64;
                }
            }
            for tok in s.bos..s.bos + s.len {
                let decay = (x.g[tok * hv + h] as f64).exp();
                st.iter_mut().for_each(|v| *v *= decay);
                let kt = &k[(tok * hkc + hk) * kd..][..kd];
                let qt = &q[(tok * hkc + hk) * kd..][..kd];
                let beta = x.beta[tok * hv + h] as f64;
                let vt = &x.v[(tok * hv + h) * vd..][..vd];
                for col in 0..vd {
                    let kv: f64 = (0..kd).map(|kk| st[kk * vd + col] * kt[kk]).sum();
                    let vp = beta * (vt[col] as f64 - kv);
                    for kk in 0..kd {
                        st[kk * vd + col] += kt[kk] * vp;
                    }
                }
                for col in 0..vd {
                    o[(tok * hv + h) * vd + col] =
                        (0..kd).map(|kk| qt[kk] * scale * st[kk * vd + col]).sum();
                }
            }
            fs[(si * hv + h) * kd * vd..][..kd * vd].copy_from_slice(&st);
        }
    }
    (o, fs)
}

/// Largest absolute difference, and the largest magnitude of `reference`.
pub fn max_abs_diff<A: Copy + Into<f64>, B: Copy + Into<f64>>(
    got: &[A],
    reference: &[B],
) -> (f64, f64) {
    assert_eq!(got.len(), reference.len());
    got.iter()
        .zip(reference)
        .fold((0f64, 0f64), |(d, m), (&a, &b)| {
            let (a, b) = (a.into(), b.into());
            let diff = if a.is_nan() || b.is_nan() {
                f64::INFINITY
            } else {
                (a - b).abs()
            };
            (d.max(diff), m.max(b.abs()))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gdn::generate_inputs;

    fn cfg(seqlens: &[usize], varlen: bool, dtype: DType) -> GdnConfig {
        GdnConfig {
            seqlens: seqlens.to_vec(),
            varlen,
            heads: 4,
            key_heads: 2,
            key_dim: 16,
            value_dim: 8,
            dtype,
            scale: None,
            qk_l2norm: false,
            initial_state: true,
        }
    }

    fn check(c: &GdnConfig, seed: u64, tol: f64) {
        let x = generate_inputs(c, seed);
        let r = chunked(c, &x);
        let (o, fs) = naive_recurrent(c, &x);
        let (d_o, m_o) = max_abs_diff(&r.o, &o);
        let (d_s, m_s) = max_abs_diff(&r.final_state, &fs);
        println!(
            "{:?} {} l2norm={}: max |o - naive| = {d_o:.3e} (|o| <= {m_o:.2}), max |S - naive| = {d_s:.3e} (|S| <= {m_s:.2})",
            c.seqlens, c.dtype, c.qk_l2norm
        );
        assert!(d_o <= tol * m_o.max(1.0), "o differs by {d_o}");
        assert!(d_s <= tol * m_s.max(1.0), "final state differs by {d_s}");
    }

    /// The f32 chunked algorithm equals the token-by-token recurrence.
    #[test]
    fn chunked_f32_matches_naive_recurrence() {
        check(&cfg(&[150], false, DType::F32), 1, 1e-5);
    }

    /// Varlen: chunks restart at every sequence boundary, states are per sequence.
    #[test]
    fn chunked_f32_matches_naive_recurrence_varlen() {
        check(&cfg(&[1, 63, 64, 65, 130], true, DType::F32), 2, 1e-5);
    }

    #[test]
    fn chunked_f32_matches_naive_recurrence_with_l2norm_and_no_initial_state() {
        let mut c = cfg(&[70, 5], true, DType::F32);
        c.qk_l2norm = true;
        c.initial_state = false;
        c.scale = Some(0.3);
        check(&c, 3, 1e-5);
    }

    /// With bf16 / f16 storage the rounding of the intermediates shows, but the
    /// result stays within the storage precision of the truth.
    #[test]
    fn chunked_rounded_stays_near_naive_recurrence() {
        check(&cfg(&[1, 63, 64, 65, 130], true, DType::BF16), 4, 3e-2);
        check(&cfg(&[1, 63, 64, 65, 130], true, DType::F16), 4, 4e-3);
    }

    #[test]
    fn a_is_the_inverse_of_i_plus_l() {
        // One chunk, f32: (I + L) A = I on the rows of the chunk.
        let c = cfg(&[64], false, DType::F32);
        let x = generate_inputs(&c, 5);
        let r = chunked(&c, &x);
        let h = 1;
        let hk = h / 2;
        let g = |t: usize| r.g_cumsum[t * 4 + h];
        for i in 0..64 {
            for col in 0..64 {
                let mut s = r.a[(i * 4 + h) * 64 + col] as f64;
                for j in 0..i {
                    let kk: f64 = (0..16)
                        .map(|d| (x.k[(i * 2 + hk) * 16 + d] * x.k[(j * 2 + hk) * 16 + d]) as f64)
                        .sum();
                    let l = kk * ((g(i) - g(j)) as f64).exp2() * x.beta[i * 4 + h] as f64;
                    s += l * r.a[(j * 4 + h) * 64 + col] as f64;
                }
                let want = if i == col { 1.0 } else { 0.0 };
                assert!((s - want).abs() < 1e-5, "({i},{col}): {s}");
            }
        }
    }

    #[test]
    fn g_cumsum_restarts_every_chunk_in_log2() {
        let c = cfg(&[65, 3], true, DType::F32);
        let x = generate_inputs(&c, 6);
        let r = chunked(&c, &x);
        let h = 2;
        // Token 64 starts the second chunk of sequence 0; token 65 starts sequence 1.
        assert_eq!(r.g_cumsum[64 * 4 + h], x.g[64 * 4 + h] * RCP_LN2);
        assert_eq!(r.g_cumsum[65 * 4 + h], x.g[65 * 4 + h] * RCP_LN2);
        let two = (x.g[65 * 4 + h] + x.g[66 * 4 + h]) * RCP_LN2;
        assert!((r.g_cumsum[66 * 4 + h] - two).abs() < 1e-6);
    }
}
