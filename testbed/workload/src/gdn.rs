//! fla 0.6.0's chunked gated delta rule forward (`chunk_gated_delta_rule`),
//! tensor for tensor.
//!
//! [`forward`] allocates, launches and frees in the order fla does, and each
//! allocation and free cites the fla line responsible (fla-core 0.6.0 wheel,
//! `fla/ops/...`). Python frees a tensor when its last reference goes, so the
//! frees follow the reference holders:
//! - `w`, `u`, `h`, `v_new` are locals of `chunk_gated_delta_rule_fwd`
//!   (gated_delta_rule/chunk.py:33-123). None is returned, so all four go when
//!   that function returns (chunk.py:123) and its frame is cleared; CPython
//!   releases frame slots in `co_varnames` order: w, u, h, v_new.
//! - `g` (the cumsum, which rebinds the parameter `g` at chunk.py:63) and `A`
//!   are returned to `ChunkGatedDeltaRuleFunction.forward` and saved with
//!   `ctx.save_for_backward(q, q_rstd, k, k_rstd, v, g, beta_raw, beta, A, ...)`
//!   (chunk.py:310). With no input requiring grad, autograd releases that tuple
//!   when `apply` returns (chunk.py:571), last item first: A, then g, then the
//!   l2norm outputs k_rstd, k, q_rstd, q.
//! - `o` and `final_state` are the results; they live until the caller drops
//!   them.
//! - `chunk_indices` and `chunk_offsets` (varlen only) come from
//!   `prepare_chunk_indices` / `prepare_chunk_offsets`, which are memoised by
//!   `@tensor_cache` (fla/utils/decorators.py:33, four entries): they outlive
//!   the call. fla also builds small temporaries to compute them (and caches
//!   `prepare_lens`, an int64 `[N]`); those are not reproduced here.
//!
//! With chunk size 64 on NVIDIA, fla fuses `chunk_scaled_dot_kkt_fwd` and
//! `solve_tril` (chunk_fwd.py:381-399): A is allocated once, in the input dtype,
//! and there is no fp32 A.

use std::time::Instant;

use crate::backend::{Arg, Kernel, LaunchConfig};
use crate::dtype::{DType, encode_i64};
use crate::error::{Error, Result};
use crate::rng::{Rng, log_sigmoid, sigmoid};
use crate::tensor::{DeviceTensor, Session, TensorSpec, opt_arg};

/// fla's chunk size for the gated delta rule (BT).
pub const CHUNK: usize = 64;

/// `fla/ops/utils/constant.py` RCP_LN2 = 1.4426950216 as the fp32 Triton
/// receives, which is the fp32 nearest 1/ln 2: fla keeps gates in log2 space.
pub const RCP_LN2: f32 = std::f32::consts::LOG2_E;

/// fla's l2norm epsilon (`l2norm_fwd(x, eps=1e-6)`).
pub const L2NORM_EPS: f32 = 1e-6;

/// One `chunk_gated_delta_rule` problem.
#[derive(Clone, Debug, PartialEq)]
pub struct GdnConfig {
    /// Sequence lengths. With `varlen` false there is exactly one.
    pub seqlens: Vec<usize>,
    /// Pass `cu_seqlens` (as vLLM always does); false for a plain `[1, T]` batch.
    pub varlen: bool,
    /// Value heads (fla's HV; v, g, beta and every intermediate have these).
    pub heads: usize,
    /// Query/key heads (fla's H; `heads % key_heads == 0`).
    pub key_heads: usize,
    /// Key head dimension K.
    pub key_dim: usize,
    /// Value head dimension V.
    pub value_dim: usize,
    /// Input dtype (q, k, v, beta and the intermediates fla stores in it).
    pub dtype: DType,
    /// Output scale; fla's default is `K ** -0.5`.
    pub scale: Option<f32>,
    /// `use_qk_l2norm_in_kernel=True`.
    pub qk_l2norm: bool,
    /// Pass an fp32 `initial_state` [N, HV, K, V].
    pub initial_state: bool,
}

impl GdnConfig {
    /// Total tokens T.
    pub fn tokens(&self) -> usize {
        self.seqlens.iter().sum()
    }

    /// Number of sequences N.
    pub fn sequences(&self) -> usize {
        self.seqlens.len()
    }

    /// NT = Σ ceil(Tᵢ / 64): chunks never cross sequence boundaries.
    pub fn chunks(&self) -> usize {
        self.seqlens.iter().map(|&l| l.div_ceil(CHUNK)).sum()
    }

    /// The scale applied to q·k and q·h.
    pub fn scale(&self) -> f32 {
        self.scale
            .unwrap_or_else(|| (self.key_dim as f32).powf(-0.5))
    }

    /// Reject shapes fla (or these kernels) would not accept.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidShape(m));
        if self.seqlens.is_empty() {
            return bad("give --tokens T or --seqlens a,b,c (at least one sequence)".into());
        }
        if !self.varlen && self.seqlens.len() != 1 {
            return bad("without cu_seqlens there is exactly one sequence".into());
        }
        if let Some(i) = self.seqlens.iter().position(|&l| l == 0) {
            return bad(format!(
                "sequence {i} has length 0; every sequence needs at least one token"
            ));
        }
        if self.heads == 0 || self.key_heads == 0 {
            return bad("--heads and --key-heads must be at least 1".into());
        }
        if !self.heads.is_multiple_of(self.key_heads) {
            return bad(format!(
                "--heads {} is not a multiple of --key-heads {}: fla requires HV % H == 0 (grouped value attention)",
                self.heads, self.key_heads
            ));
        }
        if self.key_dim == 0 || self.key_dim > 256 {
            return bad(format!(
                "--key-dim {} is outside 1..=256 (fla's chunk_gated_delta_rule_fwd_h asserts K <= 256)",
                self.key_dim
            ));
        }
        if self.value_dim == 0 {
            return bad("--value-dim must be at least 1".into());
        }
        if !self.dtype.is_float() {
            return bad(format!("--dtype {} is not bf16, f16 or f32", self.dtype));
        }
        if self.heads > 65_535 || self.sequences() > 65_535 {
            return bad("at most 65535 heads and 65535 sequences (CUDA grid limits)".into());
        }
        Ok(())
    }

    fn host_index_tensors(&self) -> (Vec<i64>, Vec<i64>, Vec<i64>) {
        let mut cu = vec![0i64];
        let mut indices = Vec::with_capacity(self.chunks() * 2);
        let mut offsets = vec![0i64];
        for (n, &len) in self.seqlens.iter().enumerate() {
            cu.push(cu[n] + len as i64);
            let nc = len.div_ceil(CHUNK);
            for c in 0..nc {
                indices.push(n as i64);
                indices.push(c as i64);
            }
            offsets.push(offsets[n] + nc as i64);
        }
        (cu, indices, offsets)
    }
}

/// Host copies of the inputs, as `f32` values exactly representable in their
/// device dtype (so the CPU reference reads what the GPU reads).
#[derive(Clone, Debug, PartialEq)]
pub struct GdnHostInputs {
    /// [T, HK, K] in the input dtype.
    pub q: Vec<f32>,
    /// [T, HK, K] in the input dtype; l2-normalised rows unless `qk_l2norm`.
    pub k: Vec<f32>,
    /// [T, HV, V] in the input dtype.
    pub v: Vec<f32>,
    /// [T, HV] fp32, log-space decay `log(sigmoid(u))`, u uniform in [0, 1).
    pub g: Vec<f32>,
    /// [T, HV] in the input dtype, `sigmoid(u)`.
    pub beta: Vec<f32>,
    /// [N, HV, K, V] fp32 when `initial_state`.
    pub h0: Option<Vec<f32>>,
}

/// Inputs like fla's own tests: q, v ~ N(0, 1); k ~ N(0, 1) with unit rows
/// (unless the kernel normalises them); g = logsigmoid(U[0,1)); beta = sigmoid(U[0,1)).
pub fn generate_inputs(cfg: &GdnConfig, seed: u64) -> GdnHostInputs {
    let (t, h, hk, kd, vd) = (
        cfg.tokens(),
        cfg.heads,
        cfg.key_heads,
        cfg.key_dim,
        cfg.value_dim,
    );
    let dt = cfg.dtype;
    let round = |v: Vec<f32>| v.into_iter().map(|x| dt.round(x)).collect::<Vec<_>>();
    let q = round(Rng::new(seed, 1).normals(t * hk * kd));
    let mut k = Rng::new(seed, 2).normals(t * hk * kd);
    if !cfg.qk_l2norm {
        for row in k.chunks_mut(kd) {
            let n = row.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
            row.iter_mut().for_each(|x| *x = (*x as f64 / n) as f32);
        }
    }
    let k = round(k);
    let v = round(Rng::new(seed, 3).normals(t * h * vd));
    let mut rg = Rng::new(seed, 4);
    let g = (0..t * h).map(|_| log_sigmoid(rg.uniform())).collect();
    let mut rb = Rng::new(seed, 5);
    let beta = (0..t * h)
        .map(|_| dt.round(sigmoid(rb.uniform())))
        .collect();
    let h0 = cfg
        .initial_state
        .then(|| Rng::new(seed, 6).normals(cfg.sequences() * h * kd * vd));
    GdnHostInputs {
        q,
        k,
        v,
        g,
        beta,
        h0,
    }
}

/// The inputs on the device, allocated before the call as the caller's tensors.
pub struct GdnInputs<'s, 'b> {
    /// [T, HK, K].
    pub q: DeviceTensor<'s, 'b>,
    /// [T, HK, K].
    pub k: DeviceTensor<'s, 'b>,
    /// [T, HV, V].
    pub v: DeviceTensor<'s, 'b>,
    /// [T, HV] fp32.
    pub g: DeviceTensor<'s, 'b>,
    /// [T, HV].
    pub beta: DeviceTensor<'s, 'b>,
    /// [N, HV, K, V] fp32.
    pub initial_state: Option<DeviceTensor<'s, 'b>>,
    /// [N + 1] int64, varlen only.
    pub cu_seqlens: Option<DeviceTensor<'s, 'b>>,
}

/// What `chunk_gated_delta_rule` leaves alive when it returns.
pub struct GdnOutputs<'s, 'b> {
    /// o [T, HV, V] in the input dtype.
    pub o: DeviceTensor<'s, 'b>,
    /// final_state [N, HV, K, V] fp32.
    pub final_state: DeviceTensor<'s, 'b>,
    /// chunk_indices [NT, 2] int64, held by fla's tensor_cache (varlen only).
    pub chunk_indices: Option<DeviceTensor<'s, 'b>>,
    /// chunk_offsets [N + 1] int64, held by fla's tensor_cache (varlen only).
    pub chunk_offsets: Option<DeviceTensor<'s, 'b>>,
}

impl GdnInputs<'_, '_> {
    /// Free the inputs newest first, as the caller drops them.
    pub fn free(self) {
        let Self {
            q,
            k,
            v,
            g,
            beta,
            initial_state,
            cu_seqlens,
        } = self;
        drop(cu_seqlens);
        drop(initial_state);
        drop(beta);
        drop(g);
        drop(v);
        drop(k);
        drop(q);
    }
}

/// The inputs as the little-endian bytes the device takes, so that a caller
/// uploading the same inputs many times (`prefill`) encodes them once.
#[derive(Clone, Debug, PartialEq)]
pub struct GdnInputBytes {
    /// q in the input dtype.
    pub q: Vec<u8>,
    /// k in the input dtype.
    pub k: Vec<u8>,
    /// v in the input dtype.
    pub v: Vec<u8>,
    /// g, fp32.
    pub g: Vec<u8>,
    /// beta in the input dtype.
    pub beta: Vec<u8>,
    /// initial_state, fp32, when generated.
    pub h0: Option<Vec<u8>>,
}

impl GdnHostInputs {
    /// Encode for a device run in `dtype` (g and the state stay fp32).
    pub fn encode(&self, dtype: DType) -> GdnInputBytes {
        GdnInputBytes {
            q: dtype.encode(&self.q),
            k: dtype.encode(&self.k),
            v: dtype.encode(&self.v),
            g: DType::F32.encode(&self.g),
            beta: dtype.encode(&self.beta),
            h0: self.h0.as_ref().map(|h| DType::F32.encode(h)),
        }
    }
}

/// Allocate the inputs in the order q, k, v, g, beta, initial_state,
/// cu_seqlens, uploading `host` data when given (it is skipped when kernels do
/// not run).
pub fn allocate_inputs<'s, 'b>(
    s: &'s Session<'b>,
    cfg: &GdnConfig,
    host: Option<&GdnHostInputs>,
) -> Result<GdnInputs<'s, 'b>> {
    let bytes = host.map(|h| h.encode(cfg.dtype));
    allocate_inputs_encoded(s, cfg, bytes.as_ref())
}

/// [`allocate_inputs`] from inputs already encoded with [`GdnHostInputs::encode`].
/// A tensor whose bytes are absent (no `host`, or no `h0`) is left uninitialised.
pub fn allocate_inputs_encoded<'s, 'b>(
    s: &'s Session<'b>,
    cfg: &GdnConfig,
    host: Option<&GdnInputBytes>,
) -> Result<GdnInputs<'s, 'b>> {
    let (t, h, hk, kd, vd, n) = (
        cfg.tokens(),
        cfg.heads,
        cfg.key_heads,
        cfg.key_dim,
        cfg.value_dim,
        cfg.sequences(),
    );
    let dt = cfg.dtype;
    let _r = s.range("inputs");
    let q = s.input(
        TensorSpec::new("q", dt, &[1, t, hk, kd]),
        host.map_or(&[], |x| &x.q),
    )?;
    let k = s.input(
        TensorSpec::new("k", dt, &[1, t, hk, kd]),
        host.map_or(&[], |x| &x.k),
    )?;
    let v = s.input(
        TensorSpec::new("v", dt, &[1, t, h, vd]),
        host.map_or(&[], |x| &x.v),
    )?;
    let g = s.input(
        TensorSpec::new("g", DType::F32, &[1, t, h]),
        host.map_or(&[], |x| &x.g),
    )?;
    let beta = s.input(
        TensorSpec::new("beta", dt, &[1, t, h]),
        host.map_or(&[], |x| &x.beta),
    )?;
    let initial_state = if cfg.initial_state {
        Some(s.input(
            TensorSpec::new("initial_state", DType::F32, &[n, h, kd, vd]),
            host.and_then(|x| x.h0.as_deref()).unwrap_or_default(),
        )?)
    } else {
        None
    };
    let cu_seqlens = if cfg.varlen {
        let (cu, _, _) = cfg.host_index_tensors();
        Some(s.input(
            TensorSpec::new("cu_seqlens", DType::I64, &[n + 1]),
            &encode_i64(&cu),
        )?)
    } else {
        None
    };
    Ok(GdnInputs {
        q,
        k,
        v,
        g,
        beta,
        initial_state,
        cu_seqlens,
    })
}

/// A launch of `grid` blocks of `threads` threads (one-dimensional blocks).
fn launch_cfg((x, y, z): (usize, usize, usize), threads: usize) -> LaunchConfig {
    LaunchConfig {
        grid: (x as u32, y as u32, z as u32),
        block: (threads as u32, 1, 1),
    }
}

/// The sizes every stage of [`forward`] allocates with, and the scalar kernel
/// arguments they pass.
struct Dims {
    t: usize,
    h: usize,
    hk: usize,
    kd: usize,
    vd: usize,
    n: usize,
    nt: usize,
    dt: DType,
    /// T, HV, HK, K, V as the kernels take them.
    ti: Arg,
    hi: Arg,
    hki: Arg,
    kdi: Arg,
    vdi: Arg,
}

impl Dims {
    fn of(cfg: &GdnConfig) -> Self {
        let (t, h, hk, kd, vd) = (
            cfg.tokens(),
            cfg.heads,
            cfg.key_heads,
            cfg.key_dim,
            cfg.value_dim,
        );
        Dims {
            t,
            h,
            hk,
            kd,
            vd,
            n: cfg.sequences(),
            nt: cfg.chunks(),
            dt: cfg.dtype,
            ti: Arg::I64(t as i64),
            hi: Arg::I32(h as i32),
            hki: Arg::I32(hk as i32),
            kdi: Arg::I32(kd as i32),
            vdi: Arg::I32(vd as i32),
        }
    }
}

/// The varlen index arguments: `cu_seqlens` and `chunk_indices` (0 when absent).
#[derive(Clone, Copy)]
struct Index {
    cu: Arg,
    ci: Arg,
}

/// Two tensors one stage allocates: an l2norm output and its fp32 `rstd`, or w and u.
type Pair<'s, 'b> = (DeviceTensor<'s, 'b>, DeviceTensor<'s, 'b>);

/// `chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state,
/// output_final_state=True, use_qk_l2norm_in_kernel, cu_seqlens)` as fla 0.6.0
/// allocates, computes and frees it, stage by stage as fla's own functions:
/// `l2norm_qk`, `prepare_chunk_indices`, `chunk_local_cumsum` of g, the
/// intra-chunk `fwd_intra` (A by `kkt_solve`, then w and u by
/// `recompute_w_u`), the state recurrence `fwd_h`, then `fwd_o`.
pub fn forward<'s, 'b>(
    s: &'s Session<'b>,
    cfg: &GdnConfig,
    x: &GdnInputs<'s, 'b>,
) -> Result<GdnOutputs<'s, 'b>> {
    let d = Dims::of(cfg);
    let _call = s.range("chunk_gated_delta_rule");
    let l2 = if cfg.qk_l2norm {
        Some(l2norm_qk(s, &d, x)?)
    } else {
        None
    };
    let (q, k) = match &l2 {
        Some(((q2, _), (k2, _))) => (q2, k2),
        None => (&x.q, &x.k),
    };
    let (_, host_indices, host_offsets) = cfg.host_index_tensors();
    let chunk_indices = prepare_chunk_indices(s, cfg, &d, &host_indices)?;
    let idx = Index {
        cu: opt_arg(x.cu_seqlens.as_ref()),
        ci: opt_arg(chunk_indices.as_ref()),
    };
    let g_cumsum = chunk_local_cumsum(s, &d, &x.g, idx)?;
    let (a, w, u) = fwd_intra(s, &d, k, x, &g_cumsum, idx)?;
    let (chunk_offsets, hs, final_state, v_new) =
        fwd_h(s, cfg, &d, [k, &w, &u, &g_cumsum], x, idx, &host_offsets)?;
    let o = fwd_o(s, cfg, &d, [q, k, &v_new, &hs, &g_cumsum], idx)?;

    // chunk.py:123 `return g, o, A, final_state, initial_state, g_input`: the
    // locals w, u, h, v_new are released as the frame is cleared, in order.
    for tensor in [&w, &u, &hs, &v_new] {
        s.capture(tensor)?;
    }
    drop(w);
    drop(u);
    drop(hs);
    drop(v_new);

    // chunk.py:335 `return o.to(q.dtype), final_state` (same dtype: no copy).
    // apply() then releases the ctx.save_for_backward tuple (chunk.py:310),
    // last item first: A, g, k_rstd, k, q_rstd, q.
    s.capture(&a)?;
    s.capture(&g_cumsum)?;
    drop(a);
    drop(g_cumsum);
    if let Some(((q2, q_rstd), (k2, k_rstd))) = l2 {
        s.capture(&q2)?;
        s.capture(&k2)?;
        drop(k_rstd);
        drop(k2);
        drop(q_rstd);
        drop(q2);
    }
    Ok(GdnOutputs {
        o,
        final_state,
        chunk_indices,
        chunk_offsets,
    })
}

/// chunk.py:282-284: `if use_qk_l2norm_in_kernel: q, q_rstd = l2norm_fwd(q);
/// k, k_rstd = l2norm_fwd(k)`.
fn l2norm_qk<'s, 'b>(
    s: &'s Session<'b>,
    d: &Dims,
    x: &GdnInputs<'s, 'b>,
) -> Result<(Pair<'s, 'b>, Pair<'s, 'b>)> {
    let _r = s.range("l2norm_fwd");
    let q2 = l2norm(s, d, &x.q, "q")?;
    Ok((q2, l2norm(s, d, &x.k, "k")?))
}

/// One `l2norm_fwd`: l2norm.py:117 `y = torch.empty_like(x)`, l2norm.py:128
/// `rstd = torch.empty((T,), dtype=torch.float32)`.
fn l2norm<'s, 'b>(
    s: &'s Session<'b>,
    d: &Dims,
    src: &DeviceTensor<'_, '_>,
    name: &str,
) -> Result<Pair<'s, 'b>> {
    let y = s.empty(TensorSpec::new(
        format!("{name}_l2norm"),
        d.dt,
        &[1, d.t, d.hk, d.kd],
    ))?;
    let rstd = s.empty(TensorSpec::new(
        format!("{name}_rstd"),
        DType::F32,
        &[1, d.t, d.hk],
    ))?;
    let rows = d.t * d.hk;
    s.launch(
        Kernel::L2Norm,
        launch_cfg((rows.div_ceil(8), 1, 1), 256),
        &[
            src.arg(),
            y.arg(),
            rstd.arg(),
            Arg::I64(rows as i64),
            d.kdi,
            Arg::F32(L2NORM_EPS),
        ],
    )?;
    Ok((y, rstd))
}

/// chunk.py:290-291: `chunk_indices = prepare_chunk_indices(cu_seqlens, chunk_size)`,
/// memoised by @tensor_cache, so it outlives the call (varlen only).
fn prepare_chunk_indices<'s, 'b>(
    s: &'s Session<'b>,
    cfg: &GdnConfig,
    d: &Dims,
    host_indices: &[i64],
) -> Result<Option<DeviceTensor<'s, 'b>>> {
    if !cfg.varlen {
        return Ok(None);
    }
    let _r = s.range("prepare_chunk_indices");
    Ok(Some(s.from_host(
        TensorSpec::new("chunk_indices", DType::I64, &[d.nt, 2]),
        &encode_i64(host_indices),
    )?))
}

/// chunk.py:63 `g = chunk_local_cumsum(g, chunk_size, scale=RCP_LN2, ...)`;
/// cumsum.py:278 `o = torch.empty_like(g, dtype=output_dtype or g.dtype)` (fp32).
fn chunk_local_cumsum<'s, 'b>(
    s: &'s Session<'b>,
    d: &Dims,
    g: &DeviceTensor<'_, '_>,
    idx: Index,
) -> Result<DeviceTensor<'s, 'b>> {
    let _r = s.range("chunk_local_cumsum");
    let gc = s.empty(TensorSpec::new("g_cumsum", DType::F32, &[1, d.t, d.h]))?;
    s.launch(
        Kernel::ChunkLocalCumsum,
        launch_cfg((d.nt, 1, 1), d.h.next_multiple_of(32).min(256)),
        &[
            g.arg(),
            gc.arg(),
            idx.cu,
            idx.ci,
            d.ti,
            d.hi,
            Arg::F32(RCP_LN2),
        ],
    )?;
    Ok(gc)
}

/// chunk.py:72 `w, u, A = chunk_gated_delta_rule_fwd_intra(...)`: A, then w and u.
fn fwd_intra<'s, 'b>(
    s: &'s Session<'b>,
    d: &Dims,
    k: &DeviceTensor<'_, '_>,
    x: &GdnInputs<'_, '_>,
    g_cumsum: &DeviceTensor<'_, '_>,
    idx: Index,
) -> Result<(
    DeviceTensor<'s, 'b>,
    DeviceTensor<'s, 'b>,
    DeviceTensor<'s, 'b>,
)> {
    let _r = s.range("chunk_gated_delta_rule_fwd_intra");
    let a = kkt_solve(s, d, k, x, g_cumsum, idx)?;
    let (w, u) = recompute_w_u(s, d, k, x, g_cumsum, &a, idx)?;
    Ok((a, w, u))
}

/// chunk_fwd.py:385 `A = torch.zeros(B, T, HV, BT, dtype=k.dtype)` (fused kkt + solve_tril).
fn kkt_solve<'s, 'b>(
    s: &'s Session<'b>,
    d: &Dims,
    k: &DeviceTensor<'_, '_>,
    x: &GdnInputs<'_, '_>,
    g_cumsum: &DeviceTensor<'_, '_>,
    idx: Index,
) -> Result<DeviceTensor<'s, 'b>> {
    let _r = s.range("kkt_solve");
    let a = s.zeros(TensorSpec::new("A", d.dt, &[1, d.t, d.h, CHUNK]))?;
    s.launch(
        Kernel::KktSolve,
        launch_cfg((d.nt, d.h, 1), 256),
        &[
            k.arg(),
            g_cumsum.arg(),
            x.beta.arg(),
            a.arg(),
            idx.cu,
            idx.ci,
            d.ti,
            d.hi,
            d.hki,
            d.kdi,
        ],
    )?;
    Ok(a)
}

/// chunk_fwd.py:419 `recompute_w_u_fwd(...)`; wy_fast.py:273 `w = k.new_empty(B, T, HV, K)`,
/// wy_fast.py:274 `u = torch.empty_like(v)`.
fn recompute_w_u<'s, 'b>(
    s: &'s Session<'b>,
    d: &Dims,
    k: &DeviceTensor<'_, '_>,
    x: &GdnInputs<'_, '_>,
    g_cumsum: &DeviceTensor<'_, '_>,
    a: &DeviceTensor<'_, '_>,
    idx: Index,
) -> Result<Pair<'s, 'b>> {
    let _r = s.range("recompute_w_u_fwd");
    let w = s.empty(TensorSpec::new("w", d.dt, &[1, d.t, d.h, d.kd]))?;
    let u = s.empty(TensorSpec::new("u", d.dt, &[1, d.t, d.h, d.vd]))?;
    s.launch(
        Kernel::RecomputeWU,
        launch_cfg((d.nt, d.h, 1), 256),
        &[
            k.arg(),
            x.v.arg(),
            x.beta.arg(),
            g_cumsum.arg(),
            a.arg(),
            w.arg(),
            u.arg(),
            idx.cu,
            idx.ci,
            d.ti,
            d.hi,
            d.hki,
            d.kdi,
            d.vdi,
        ],
    )?;
    Ok((w, u))
}

/// chunk.py:95 `h, v_new, final_state = chunk_gated_delta_rule_fwd_h(...)`:
/// the state recurrence over the chunks, from `[k, w, u, g_cumsum]`. Returns
/// chunk_offsets (varlen only), h, final_state and v_new.
fn fwd_h<'s, 'b>(
    s: &'s Session<'b>,
    cfg: &GdnConfig,
    d: &Dims,
    [k, w, u, g_cumsum]: [&DeviceTensor<'_, '_>; 4],
    x: &GdnInputs<'_, '_>,
    idx: Index,
    host_offsets: &[i64],
) -> Result<(
    Option<DeviceTensor<'s, 'b>>,
    DeviceTensor<'s, 'b>,
    DeviceTensor<'s, 'b>,
    DeviceTensor<'s, 'b>,
)> {
    let _r = s.range("chunk_gated_delta_rule_fwd_h");
    // chunk_delta_h.py:715 `chunk_offsets = prepare_chunk_offsets(cu_seqlens, BT)` (@tensor_cache).
    let chunk_offsets = if cfg.varlen {
        Some(s.from_host(
            TensorSpec::new("chunk_offsets", DType::I64, &[d.n + 1]),
            &encode_i64(host_offsets),
        )?)
    } else {
        None
    };
    // chunk_delta_h.py:722 `h = k.new_empty(B, NT, HV, K, V)`.
    let hs = s.empty(TensorSpec::new("h", d.dt, &[1, d.nt, d.h, d.kd, d.vd]))?;
    // chunk_delta_h.py:723 `final_state = k.new_zeros(N, HV, K, V, dtype=torch.float32)`.
    let final_state = s.zeros(TensorSpec::new(
        "final_state",
        DType::F32,
        &[d.n, d.h, d.kd, d.vd],
    ))?;
    // chunk_delta_h.py:725 `v_new = torch.empty_like(u)`.
    let v_new = s.empty(TensorSpec::new("v_new", d.dt, &[1, d.t, d.h, d.vd]))?;
    s.launch(
        Kernel::ChunkFwdH,
        launch_cfg((d.vd.div_ceil(32), d.n, d.h), 256),
        &[
            k.arg(),
            w.arg(),
            u.arg(),
            g_cumsum.arg(),
            opt_arg(x.initial_state.as_ref()),
            hs.arg(),
            final_state.arg(),
            v_new.arg(),
            idx.cu,
            opt_arg(chunk_offsets.as_ref()),
            d.ti,
            d.hi,
            d.hki,
            d.kdi,
            d.vdi,
        ],
    )?;
    Ok((chunk_offsets, hs, final_state, v_new))
}

/// chunk.py:111 `o = chunk_fwd_o(q, k, v_new, h, g, scale, ...)` from
/// `[q, k, v_new, h, g_cumsum]`; chunk_o.py:565 `o = torch.empty_like(v)`.
fn fwd_o<'s, 'b>(
    s: &'s Session<'b>,
    cfg: &GdnConfig,
    d: &Dims,
    [q, k, v_new, hs, g_cumsum]: [&DeviceTensor<'_, '_>; 5],
    idx: Index,
) -> Result<DeviceTensor<'s, 'b>> {
    let _r = s.range("chunk_fwd_o");
    let o = s.empty(TensorSpec::new("o", d.dt, &[1, d.t, d.h, d.vd]))?;
    s.launch(
        Kernel::ChunkFwdO,
        launch_cfg((d.nt, d.h, 1), 256),
        &[
            q.arg(),
            k.arg(),
            v_new.arg(),
            hs.arg(),
            g_cumsum.arg(),
            o.arg(),
            idx.cu,
            idx.ci,
            d.ti,
            d.hi,
            d.hki,
            d.kdi,
            d.vdi,
            Arg::F32(cfg.scale()),
        ],
    )?;
    Ok(o)
}

/// Wall-clock time of one run, measured on the host around synchronised work.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RunTiming {
    /// Allocating and uploading the inputs.
    pub inputs_ms: f64,
    /// The forward call, from its first allocation to its last free, synchronised.
    pub forward_ms: f64,
}

/// A whole run as a caller would do it: inputs, the call, then the caller
/// drops the results (o, final_state), fla's cached index tensors, and the
/// inputs, newest first.
pub fn run(s: &Session<'_>, cfg: &GdnConfig, host: Option<&GdnHostInputs>) -> Result<RunTiming> {
    cfg.validate()?;
    let t0 = Instant::now();
    let inputs = allocate_inputs(s, cfg, host)?;
    s.backend().synchronize()?;
    let t1 = Instant::now();
    let out = forward(s, cfg, &inputs)?;
    s.backend().synchronize()?;
    let t2 = Instant::now();
    s.capture(&out.o)?;
    s.capture(&out.final_state)?;
    let GdnOutputs {
        o,
        final_state,
        chunk_indices,
        chunk_offsets,
    } = out;
    drop(o);
    drop(final_state);
    drop(chunk_offsets);
    drop(chunk_indices);
    inputs.free();
    Ok(RunTiming {
        inputs_ms: (t1 - t0).as_secs_f64() * 1e3,
        forward_ms: (t2 - t1).as_secs_f64() * 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Recorded, RecordingBackend};
    use crate::tensor::LedgerEvent;

    fn cfg(seqlens: &[usize], varlen: bool) -> GdnConfig {
        GdnConfig {
            seqlens: seqlens.to_vec(),
            varlen,
            heads: 48,
            key_heads: 48,
            key_dim: 128,
            value_dim: 128,
            dtype: DType::BF16,
            scale: None,
            qk_l2norm: false,
            initial_state: false,
        }
    }

    fn events(s: &Session<'_>) -> Vec<(char, String, usize)> {
        s.ledger()
            .into_iter()
            .map(|e| match e {
                LedgerEvent::Alloc { spec, .. } => ('+', spec.name.clone(), spec.bytes()),
                LedgerEvent::Free { spec, .. } => ('-', spec.name.clone(), spec.bytes()),
            })
            .collect()
    }

    /// The bytes and order docs/architecture.md records for fla 0.6.0 at T=4128,
    /// H=48, K=V=128 bf16, and the frees that follow from fla's references.
    #[test]
    fn fla_060_sequence_at_4128_tokens() {
        let rec = RecordingBackend::new();
        let s = Session::new(&rec, false);
        run(&s, &cfg(&[4128], false), None).unwrap();
        let ev = events(&s);
        let t = 4128 * 48;
        let expected: Vec<(char, &str, usize)> = vec![
            ('+', "q", t * 128 * 2),
            ('+', "k", t * 128 * 2),
            ('+', "v", t * 128 * 2),
            ('+', "g", t * 4),
            ('+', "beta", t * 2),
            ('+', "g_cumsum", 792_576),
            ('+', "A", 25_362_432),
            ('+', "w", 50_724_864),
            ('+', "u", 50_724_864),
            ('+', "h", 102_236_160),
            ('+', "final_state", 3_145_728),
            ('+', "v_new", 50_724_864),
            ('+', "o", 50_724_864),
            ('-', "w", 50_724_864),
            ('-', "u", 50_724_864),
            ('-', "h", 102_236_160),
            ('-', "v_new", 50_724_864),
            ('-', "A", 25_362_432),
            ('-', "g_cumsum", 792_576),
            ('-', "o", 50_724_864),
            ('-', "final_state", 3_145_728),
            ('-', "beta", t * 2),
            ('-', "g", t * 4),
            ('-', "v", t * 128 * 2),
            ('-', "k", t * 128 * 2),
            ('-', "q", t * 128 * 2),
        ];
        let got: Vec<(char, &str, usize)> =
            ev.iter().map(|(c, n, b)| (*c, n.as_str(), *b)).collect();
        assert_eq!(got, expected);

        // Peak above the inputs: everything from g_cumsum to o is live at once.
        let peak: usize = expected[5..13].iter().map(|e| e.2).sum();
        assert_eq!(peak, 334_436_352); // 318.9 MiB, as measured (docs/architecture.md)
        assert!((peak as f64 / (1u64 << 20) as f64 - 318.9).abs() < 0.05);

        // Driver-level: one alloc per tensor, A and final_state zeroed, five kernels.
        let log = rec.log();
        let allocs = log
            .iter()
            .filter(|r| matches!(r, Recorded::Alloc { .. }))
            .count();
        let memsets: Vec<usize> = log
            .iter()
            .filter_map(|r| match r {
                Recorded::Memset { bytes, .. } => Some(*bytes),
                _ => None,
            })
            .collect();
        let kernels: Vec<Kernel> = log
            .iter()
            .filter_map(|r| match r {
                Recorded::Launch { kernel, .. } => Some(*kernel),
                _ => None,
            })
            .collect();
        assert_eq!(allocs, 13);
        assert_eq!(memsets, vec![25_362_432, 3_145_728]);
        assert_eq!(
            kernels,
            vec![
                Kernel::ChunkLocalCumsum,
                Kernel::KktSolve,
                Kernel::RecomputeWU,
                Kernel::ChunkFwdH,
                Kernel::ChunkFwdO
            ]
        );
        assert_eq!(rec.live_bytes(), 0);
    }

    #[test]
    fn varlen_gqa_l2norm_sequence() {
        let mut c = cfg(&[100, 64, 1], true);
        c.heads = 4;
        c.key_heads = 2;
        c.key_dim = 32;
        c.value_dim = 16;
        c.qk_l2norm = true;
        c.initial_state = true;
        assert_eq!(c.chunks(), 2 + 1 + 1);
        let rec = RecordingBackend::new();
        let s = Session::new(&rec, false);
        run(&s, &c, None).unwrap();
        let names: Vec<String> = events(&s)
            .into_iter()
            .map(|(c, n, b)| format!("{c}{n}:{b}"))
            .collect();
        let t = 165;
        let expect = [
            format!("+q:{}", t * 2 * 32 * 2),
            format!("+k:{}", t * 2 * 32 * 2),
            format!("+v:{}", t * 4 * 16 * 2),
            format!("+g:{}", t * 4 * 4),
            format!("+beta:{}", t * 4 * 2),
            format!("+initial_state:{}", 3 * 4 * 32 * 16 * 4),
            "+cu_seqlens:32".to_string(),
            format!("+q_l2norm:{}", t * 2 * 32 * 2),
            format!("+q_rstd:{}", t * 2 * 4),
            format!("+k_l2norm:{}", t * 2 * 32 * 2),
            format!("+k_rstd:{}", t * 2 * 4),
            "+chunk_indices:64".to_string(),
            format!("+g_cumsum:{}", t * 4 * 4),
            format!("+A:{}", t * 4 * 64 * 2),
            format!("+w:{}", t * 4 * 32 * 2),
            format!("+u:{}", t * 4 * 16 * 2),
            "+chunk_offsets:32".to_string(),
            format!("+h:{}", 4 * 4 * 32 * 16 * 2),
            format!("+final_state:{}", 3 * 4 * 32 * 16 * 4),
            format!("+v_new:{}", t * 4 * 16 * 2),
            format!("+o:{}", t * 4 * 16 * 2),
            format!("-w:{}", t * 4 * 32 * 2),
            format!("-u:{}", t * 4 * 16 * 2),
            format!("-h:{}", 4 * 4 * 32 * 16 * 2),
            format!("-v_new:{}", t * 4 * 16 * 2),
            format!("-A:{}", t * 4 * 64 * 2),
            format!("-g_cumsum:{}", t * 4 * 4),
            format!("-k_rstd:{}", t * 2 * 4),
            format!("-k_l2norm:{}", t * 2 * 32 * 2),
            format!("-q_rstd:{}", t * 2 * 4),
            format!("-q_l2norm:{}", t * 2 * 32 * 2),
            format!("-o:{}", t * 4 * 16 * 2),
            format!("-final_state:{}", 3 * 4 * 32 * 16 * 4),
            "-chunk_offsets:32".to_string(),
            "-chunk_indices:64".to_string(),
            "-cu_seqlens:32".to_string(),
            format!("-initial_state:{}", 3 * 4 * 32 * 16 * 4),
            format!("-beta:{}", t * 4 * 2),
            format!("-g:{}", t * 4 * 4),
            format!("-v:{}", t * 4 * 16 * 2),
            format!("-k:{}", t * 2 * 32 * 2),
            format!("-q:{}", t * 2 * 32 * 2),
        ];
        assert_eq!(names, expect);
    }

    #[test]
    fn out_of_memory_names_the_tensor_and_frees_the_rest() {
        // Room for the inputs and the first intermediates, not for h.
        let c = cfg(&[4128], false);
        let t = 4128 * 48;
        let inputs = 3 * t * 128 * 2 + t * 4 + t * 2;
        let cap = inputs + 792_576 + 25_362_432 + 2 * 50_724_864 + 1_000_000;
        let rec = RecordingBackend::with_capacity(cap);
        let s = Session::new(&rec, false);
        let err = run(&s, &c, None).unwrap_err().to_string();
        assert!(
            err.starts_with("allocating h (bf16 [1, 65, 48, 128, 128], 102236160 bytes)"),
            "{err}"
        );
        assert_eq!(
            rec.live_bytes(),
            0,
            "every tensor is freed on the error path"
        );
    }

    #[test]
    fn rejects_bad_shapes() {
        let mut c = cfg(&[10], false);
        c.key_heads = 5;
        assert!(c.validate().unwrap_err().to_string().contains("multiple"));
        let mut c = cfg(&[10, 0], true);
        assert!(c.validate().unwrap_err().to_string().contains("length 0"));
        c.seqlens = vec![10];
        c.key_dim = 512;
        assert!(c.validate().unwrap_err().to_string().contains("K <= 256"));
    }

    #[test]
    fn rcp_ln2_is_flas_constant_in_fp32() {
        let fla: f64 = "1.4426950216".parse().unwrap();
        assert_eq!(fla as f32, RCP_LN2);
    }

    #[test]
    fn index_tensors_follow_fla() {
        let c = cfg(&[100, 64, 1], true);
        let (cu, ind, off) = c.host_index_tensors();
        assert_eq!(cu, vec![0, 100, 164, 165]);
        assert_eq!(ind, vec![0, 0, 0, 1, 1, 0, 2, 0]);
        assert_eq!(off, vec![0, 2, 3, 4]);
    }
}
