//! FlashAttention-2's varlen forward, as PyTorch's copy
//! (`torch.ops.aten._flash_attention_forward`, torch 2.11) or Dao-AILab
//! flash-attn allocates it.
//!
//! `mha_varlen_fwd` (csrc/flash_attn/flash_api.cpp, and PyTorch's
//! aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp) allocates,
//! in order:
//! - `out = empty_like(q)` unless the caller passes `out` (PyTorch's
//!   `_flash_attention_forward` passes none from Python; vLLM passes its own);
//! - `softmax_lse`, fp32: `[num_heads, total_q]` since FA 2.6.0
//!   (`unpadded_lse`), `[batch, num_heads, max_seqlen_q]` up to 2.5.9; padded on
//!   the query side only, and `max_seqlen_k` sizes nothing;
//! - `rng_state`, two 64-bit words (int64 in flash-attn, uint64 in PyTorch),
//!   allocated even without dropout;
//! - PyTorch only: `_unused`, a 0-dim uint64 (returned as `philox_offset`;
//!   annotated `_unused_philox_offset`).
//!
//! `p` (the debug softmax) needs dropout and `return_softmax`, and the split-KV
//! accumulators (`softmax_lse_accum`, `out_accum`) are only made for paged KV or
//! when `max_seqlen_q == 1` with grouped heads (decode): neither happens in a
//! varlen prefill, so neither is reproduced; decode shapes are refused.

use std::time::Instant;

use crate::backend::{Arg, Kernel, LaunchConfig};
use crate::dtype::{DType, encode_i32};
use crate::error::{Error, Result};
use crate::gdn::RunTiming;
use crate::rng::Rng;
use crate::tensor::{DeviceTensor, Session, TensorSpec};

/// Which implementation's allocations to follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaApi {
    /// PyTorch's copy (`_flash_attention_forward`): adds the 0-dim `philox_offset`.
    Torch,
    /// Dao-AILab flash-attn (`flash_attn_varlen_func` → `varlen_fwd`).
    FlashAttn,
}

/// One varlen attention forward.
#[derive(Clone, Debug, PartialEq)]
pub struct FaConfig {
    /// Query lengths per sequence.
    pub seqlens_q: Vec<usize>,
    /// Key lengths per sequence (equal to the query lengths for plain prefill).
    pub seqlens_k: Vec<usize>,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (GQA: `heads % kv_heads == 0`).
    pub kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// bf16 or f16 (FlashAttention accepts nothing else).
    pub dtype: DType,
    /// Causal masking (aligned to the bottom right when key and query lengths differ).
    pub causal: bool,
    /// Softmax scale; default `head_dim ** -0.5`.
    pub softmax_scale: Option<f32>,
    /// Use the old padded `softmax_lse` layout [B, H, max_seqlen_q].
    pub padded_lse: bool,
    /// `max_seqlen_q` as passed to the API (default: the longest query).
    pub max_seqlen_q: Option<usize>,
    /// `max_seqlen_k` as passed to the API (default: the longest key run).
    pub max_seqlen_k: Option<usize>,
    /// Whose allocations to follow.
    pub api: FaApi,
    /// The caller passes `out` (allocated with the inputs, as vLLM does).
    pub preallocated_out: bool,
}

impl FaConfig {
    /// A causal prefill of `seqlens`, each sequence's queries over its own
    /// keys, as PyTorch's `_flash_attention_forward` runs it: the default
    /// scale and max lengths, the unpadded `softmax_lse`, `out` allocated by
    /// the call. The `with_*` methods change the rest.
    pub fn new(
        seqlens: &[usize],
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        dtype: DType,
    ) -> Self {
        Self {
            seqlens_q: seqlens.to_vec(),
            seqlens_k: seqlens.to_vec(),
            heads,
            kv_heads,
            head_dim,
            dtype,
            causal: true,
            softmax_scale: None,
            padded_lse: false,
            max_seqlen_q: None,
            max_seqlen_k: None,
            api: FaApi::Torch,
            preallocated_out: false,
        }
    }

    /// The same call on other sequences, each over its own keys.
    pub fn with_seqlens(self, seqlens: &[usize]) -> Self {
        Self {
            seqlens_q: seqlens.to_vec(),
            seqlens_k: seqlens.to_vec(),
            ..self
        }
    }

    /// Key lengths that differ from the query lengths.
    pub fn with_kv_seqlens(self, seqlens_k: &[usize]) -> Self {
        Self {
            seqlens_k: seqlens_k.to_vec(),
            ..self
        }
    }

    /// Causal masking on or off.
    pub fn with_causal(self, causal: bool) -> Self {
        Self { causal, ..self }
    }

    /// A softmax scale other than `head_dim ** -0.5` (`None`: the default).
    pub fn with_softmax_scale(self, softmax_scale: Option<f32>) -> Self {
        Self {
            softmax_scale,
            ..self
        }
    }

    /// The padded `softmax_lse` layout of FA up to 2.5.9, or not.
    pub fn with_padded_lse(self, padded_lse: bool) -> Self {
        Self { padded_lse, ..self }
    }

    /// The `max_seqlen_q` the caller passes (`None`: the longest query).
    pub fn with_max_seqlen_q(self, max_seqlen_q: Option<usize>) -> Self {
        Self {
            max_seqlen_q,
            ..self
        }
    }

    /// The `max_seqlen_k` the caller passes (`None`: the longest key run).
    pub fn with_max_seqlen_k(self, max_seqlen_k: Option<usize>) -> Self {
        Self {
            max_seqlen_k,
            ..self
        }
    }

    /// Whose allocations to follow.
    pub fn with_api(self, api: FaApi) -> Self {
        Self { api, ..self }
    }

    /// Whether the caller passes `out`.
    pub fn with_preallocated_out(self, preallocated_out: bool) -> Self {
        Self {
            preallocated_out,
            ..self
        }
    }

    /// Σ query lengths.
    pub fn total_q(&self) -> usize {
        self.seqlens_q.iter().sum()
    }

    /// Σ key lengths.
    pub fn total_k(&self) -> usize {
        self.seqlens_k.iter().sum()
    }

    /// Sequences.
    pub fn batch(&self) -> usize {
        self.seqlens_q.len()
    }

    /// The `max_seqlen_q` passed to the kernel.
    pub fn max_seqlen_q(&self) -> usize {
        self.max_seqlen_q
            .unwrap_or_else(|| self.seqlens_q.iter().copied().max().unwrap_or(0))
    }

    /// The `max_seqlen_k` passed to the kernel.
    pub fn max_seqlen_k(&self) -> usize {
        self.max_seqlen_k
            .unwrap_or_else(|| self.seqlens_k.iter().copied().max().unwrap_or(0))
    }

    /// The softmax scale.
    pub fn scale(&self) -> f32 {
        self.softmax_scale
            .unwrap_or_else(|| (self.head_dim as f32).powf(-0.5))
    }

    /// Shape of `softmax_lse` in the chosen layout.
    pub fn lse_shape(&self) -> Vec<usize> {
        if self.padded_lse {
            vec![self.batch(), self.heads, self.max_seqlen_q()]
        } else {
            vec![self.heads, self.total_q()]
        }
    }

    /// Reject what FlashAttention (or these kernels) would not run.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidShape(m));
        if self.seqlens_q.is_empty() {
            return bad("give --seqlens a,b,c (at least one sequence)".into());
        }
        if self.seqlens_k.len() != self.seqlens_q.len() {
            return bad(format!(
                "--kv-seqlens has {} entries but --seqlens has {}",
                self.seqlens_k.len(),
                self.seqlens_q.len()
            ));
        }
        if self
            .seqlens_q
            .iter()
            .chain(&self.seqlens_k)
            .any(|&l| l == 0)
        {
            return bad("every sequence needs at least one query and one key".into());
        }
        if !matches!(self.dtype, DType::BF16 | DType::F16) {
            return bad(format!(
                "FlashAttention only supports bf16 and f16, not {}",
                self.dtype
            ));
        }
        if self.heads == 0 || self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "--heads {} must be a positive multiple of --kv-heads {}",
                self.heads, self.kv_heads
            ));
        }
        if self.head_dim == 0 || self.head_dim > 256 || !self.head_dim.is_multiple_of(8) {
            return bad(format!(
                "--head-dim {} must be a multiple of 8 and at most 256 (FlashAttention's limits)",
                self.head_dim
            ));
        }
        let longest_q = *self.seqlens_q.iter().max().unwrap_or(&0);
        let longest_k = *self.seqlens_k.iter().max().unwrap_or(&0);
        if self.max_seqlen_q() < longest_q {
            return bad(format!(
                "--max-seqlen-q {} is shorter than the longest query ({longest_q})",
                self.max_seqlen_q()
            ));
        }
        if self.max_seqlen_k() < longest_k {
            return bad(format!(
                "--max-seqlen-k {} is shorter than the longest key run ({longest_k})",
                self.max_seqlen_k()
            ));
        }
        if self.max_seqlen_q() == 1 && self.heads > self.kv_heads {
            return bad(
                "max_seqlen_q = 1 with grouped heads takes FlashAttention's decode path \
                 (seqlenq_ngroups_swapped, split-KV accumulators sized by the SM count), \
                 which this workload does not reproduce; use queries longer than 1"
                    .into(),
            );
        }
        if self.heads > 65_535 || self.batch() > 65_535 {
            return bad("at most 65535 heads and 65535 sequences (CUDA grid limits)".into());
        }
        Ok(())
    }
}

/// Host inputs, as values representable in the dtype.
#[derive(Clone, Debug, PartialEq)]
pub struct FaHostInputs {
    /// q [total_q, H, D].
    pub q: Vec<f32>,
    /// k [total_k, Hkv, D].
    pub k: Vec<f32>,
    /// v [total_k, Hkv, D].
    pub v: Vec<f32>,
}

/// q, k, v ~ N(0, 1), rounded to the dtype.
pub fn generate_inputs(cfg: &FaConfig, seed: u64) -> FaHostInputs {
    let dt = cfg.dtype;
    let normals = |stream: u64, n: usize| -> Vec<f32> {
        Rng::new(seed, stream)
            .normals(n)
            .into_iter()
            .map(|x| dt.round(x))
            .collect()
    };
    FaHostInputs {
        q: normals(11, cfg.total_q() * cfg.heads * cfg.head_dim),
        k: normals(12, cfg.total_k() * cfg.kv_heads * cfg.head_dim),
        v: normals(13, cfg.total_k() * cfg.kv_heads * cfg.head_dim),
    }
}

/// The inputs on the device, allocated before the call by the caller.
pub struct FaInputs<'s, 'b> {
    /// q [total_q, H, D].
    pub q: DeviceTensor<'s, 'b>,
    /// k [total_k, Hkv, D].
    pub k: DeviceTensor<'s, 'b>,
    /// v [total_k, Hkv, D].
    pub v: DeviceTensor<'s, 'b>,
    /// cu_seqlens_q [B + 1] int32.
    pub cu_seqlens_q: DeviceTensor<'s, 'b>,
    /// cu_seqlens_k [B + 1] int32.
    pub cu_seqlens_k: DeviceTensor<'s, 'b>,
    /// out [total_q, H, D], when the caller provides it.
    pub out: Option<DeviceTensor<'s, 'b>>,
}

/// What the call returns (all of it stays alive until the caller drops it).
pub struct FaOutputs<'s, 'b> {
    /// out, unless the caller provided it.
    pub out: Option<DeviceTensor<'s, 'b>>,
    /// softmax_lse fp32, [H, total_q] or [B, H, max_seqlen_q].
    pub softmax_lse: DeviceTensor<'s, 'b>,
    /// rng_state, two 64-bit words.
    pub rng_state: DeviceTensor<'s, 'b>,
    /// PyTorch's 0-dim `_unused` (philox offset).
    pub philox_offset: Option<DeviceTensor<'s, 'b>>,
}

impl FaInputs<'_, '_> {
    /// Free the inputs newest first, as the caller drops them.
    pub fn free(self) {
        let Self {
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_k,
            out,
        } = self;
        drop(out);
        drop(cu_seqlens_k);
        drop(cu_seqlens_q);
        drop(v);
        drop(k);
        drop(q);
    }
}

impl FaOutputs<'_, '_> {
    /// Free the results newest first, as the caller drops them.
    pub fn free(self) {
        let Self {
            out,
            softmax_lse,
            rng_state,
            philox_offset,
        } = self;
        drop(philox_offset);
        drop(rng_state);
        drop(softmax_lse);
        drop(out);
    }
}

fn cumulative(lens: &[usize]) -> Vec<i32> {
    let mut cu = vec![0i32];
    for &l in lens {
        cu.push(cu.last().copied().unwrap_or(0) + l as i32);
    }
    cu
}

/// The inputs as the little-endian bytes the device takes, so that a caller
/// uploading the same inputs many times (`prefill`) encodes them once.
#[derive(Clone, Debug, PartialEq)]
pub struct FaInputBytes {
    /// q in the input dtype.
    pub q: Vec<u8>,
    /// k in the input dtype.
    pub k: Vec<u8>,
    /// v in the input dtype.
    pub v: Vec<u8>,
}

impl FaHostInputs {
    /// Encode for a device run in `dtype`.
    pub fn encode(&self, dtype: DType) -> FaInputBytes {
        FaInputBytes {
            q: dtype.encode(&self.q),
            k: dtype.encode(&self.k),
            v: dtype.encode(&self.v),
        }
    }
}

/// Allocate q, k, v, cu_seqlens_q, cu_seqlens_k (and `out` when the caller
/// provides it), uploading `host` data when given.
pub fn allocate_inputs<'s, 'b>(
    s: &'s Session<'b>,
    cfg: &FaConfig,
    host: Option<&FaHostInputs>,
) -> Result<FaInputs<'s, 'b>> {
    let bytes = host.map(|h| h.encode(cfg.dtype));
    allocate_inputs_encoded(s, cfg, bytes.as_ref())
}

/// [`allocate_inputs`] from inputs already encoded with [`FaHostInputs::encode`].
pub fn allocate_inputs_encoded<'s, 'b>(
    s: &'s Session<'b>,
    cfg: &FaConfig,
    host: Option<&FaInputBytes>,
) -> Result<FaInputs<'s, 'b>> {
    let (tq, tk, h, hkv, d, b) = (
        cfg.total_q(),
        cfg.total_k(),
        cfg.heads,
        cfg.kv_heads,
        cfg.head_dim,
        cfg.batch(),
    );
    let dt = cfg.dtype;
    let _r = s.range("inputs");
    let q = s.input(
        TensorSpec::new("q", dt, &[tq, h, d]),
        host.map_or(&[], |x| &x.q),
    )?;
    let k = s.input(
        TensorSpec::new("k", dt, &[tk, hkv, d]),
        host.map_or(&[], |x| &x.k),
    )?;
    let v = s.input(
        TensorSpec::new("v", dt, &[tk, hkv, d]),
        host.map_or(&[], |x| &x.v),
    )?;
    // PyTorch and flash-attn both require int32 cu_seqlens.
    let cu_seqlens_q = s.input(
        TensorSpec::new("cu_seqlens_q", DType::I32, &[b + 1]),
        &encode_i32(&cumulative(&cfg.seqlens_q)),
    )?;
    let cu_seqlens_k = s.input(
        TensorSpec::new("cu_seqlens_k", DType::I32, &[b + 1]),
        &encode_i32(&cumulative(&cfg.seqlens_k)),
    )?;
    let out = if cfg.preallocated_out {
        Some(s.empty(TensorSpec::new("out", dt, &[tq, h, d]))?)
    } else {
        None
    };
    Ok(FaInputs {
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        out,
    })
}

/// `mha_varlen_fwd` as the chosen implementation allocates and computes it.
pub fn forward<'s, 'b>(
    s: &'s Session<'b>,
    cfg: &FaConfig,
    x: &FaInputs<'s, 'b>,
) -> Result<FaOutputs<'s, 'b>> {
    let (tq, h, hkv, d, b) = (
        cfg.total_q(),
        cfg.heads,
        cfg.kv_heads,
        cfg.head_dim,
        cfg.batch(),
    );
    let dt = cfg.dtype;
    let _call = s.range(match cfg.api {
        FaApi::Torch => "_flash_attention_forward",
        FaApi::FlashAttn => "flash_attn_varlen_fwd",
    });
    // flash_api.cpp mha_varlen_fwd: `out = at::empty_like(q_padded)` when no `out_` is given.
    let own_out = if x.out.is_none() {
        Some(s.empty(TensorSpec::new("out", dt, &[tq, h, d]))?)
    } else {
        None
    };
    let out = x
        .out
        .as_ref()
        .or(own_out.as_ref())
        .expect("out exists either way");
    // flash_api.cpp: `softmax_lse = at::empty({num_heads, total_q}, opts.dtype(at::kFloat))`
    // (FA >= 2.6.0), or `torch::empty({batch_size, num_heads, max_seqlen_q}, ...)` (<= 2.5.9).
    let softmax_lse = s.empty(TensorSpec::new("softmax_lse", DType::F32, &cfg.lse_shape()))?;
    // flash_api.cpp: `rng_state = at::empty({2}, at::dtype(c10::kUInt64))` (PyTorch),
    // `torch::empty({2}, options.dtype(torch::kInt64))` (flash-attn); made even without dropout.
    let rng_dtype = match cfg.api {
        FaApi::Torch => DType::U64,
        FaApi::FlashAttn => DType::I64,
    };
    let rng_state = s.empty(TensorSpec::new("rng_state", rng_dtype, &[2]))?;
    // PyTorch's flash_api.cpp: `_unused = at::empty({}, at::dtype(c10::kUInt64))`,
    // returned by _flash_attention_forward as philox_offset.
    let philox_offset = match cfg.api {
        FaApi::Torch => Some(s.empty(TensorSpec::new("_unused_philox_offset", DType::U64, &[]))?),
        FaApi::FlashAttn => None,
    };
    let mq = cfg.max_seqlen_q();
    s.launch(
        Kernel::FlashAttnVarlenFwd,
        LaunchConfig {
            grid: (mq.div_ceil(4) as u32, b as u32, h as u32),
            block: (128, 1, 1),
        },
        &[
            x.q.arg(),
            x.k.arg(),
            x.v.arg(),
            x.cu_seqlens_q.arg(),
            x.cu_seqlens_k.arg(),
            out.arg(),
            softmax_lse.arg(),
            Arg::I32(h as i32),
            Arg::I32(hkv as i32),
            Arg::I32(d as i32),
            Arg::F32(cfg.scale()),
            Arg::I32(cfg.causal as i32),
            Arg::I32(cfg.padded_lse as i32),
            Arg::I32(mq as i32),
            Arg::I64(tq as i64),
        ],
    )?;
    Ok(FaOutputs {
        out: own_out,
        softmax_lse,
        rng_state,
        philox_offset,
    })
}

/// A whole run: inputs, the call, then the caller drops the results and the
/// inputs, newest first.
pub fn run(s: &Session<'_>, cfg: &FaConfig, host: Option<&FaHostInputs>) -> Result<RunTiming> {
    cfg.validate()?;
    let t0 = Instant::now();
    let inputs = allocate_inputs(s, cfg, host)?;
    s.backend().synchronize()?;
    let t1 = Instant::now();
    let out = forward(s, cfg, &inputs)?;
    s.backend().synchronize()?;
    let t2 = Instant::now();
    if let Some(o) = out.out.as_ref().or(inputs.out.as_ref()) {
        s.capture(o)?;
    }
    s.capture(&out.softmax_lse)?;
    out.free();
    inputs.free();
    Ok(RunTiming {
        inputs_ms: (t1 - t0).as_secs_f64() * 1e3,
        forward_ms: (t2 - t1).as_secs_f64() * 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::RecordingBackend;
    use crate::tensor::LedgerEvent;

    fn cfg(seqlens: &[usize]) -> FaConfig {
        FaConfig::new(seqlens, 24, 4, 256, DType::BF16)
    }

    fn allocs(c: &FaConfig) -> Vec<(String, String, Vec<i64>, usize)> {
        let rec = RecordingBackend::new();
        let s = Session::new(&rec, false);
        run(&s, c, None).unwrap();
        assert_eq!(rec.live_bytes(), 0);
        s.ledger()
            .into_iter()
            .filter_map(|e| match e {
                LedgerEvent::Alloc { spec, stage, .. } => {
                    Some((spec.name.clone(), stage, spec.shape.clone(), spec.bytes()))
                }
                LedgerEvent::Free { .. } => None,
            })
            .collect()
    }

    #[test]
    fn torch_unpadded_sequence() {
        let a = allocs(&cfg(&[4000, 128]));
        let names: Vec<&str> = a.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "q",
                "k",
                "v",
                "cu_seqlens_q",
                "cu_seqlens_k",
                "out",
                "softmax_lse",
                "rng_state",
                "_unused_philox_offset"
            ]
        );
        assert_eq!(a[5].3, 4128 * 24 * 256 * 2);
        assert_eq!(a[6].2, vec![24, 4128]);
        assert_eq!(a[6].3, 24 * 4128 * 4);
        assert_eq!(a[7].3, 16);
        assert_eq!(a[8].3, 8);
        assert_eq!(a[5].1, "_flash_attention_forward");
    }

    /// max_seqlen_k is passed through and sizes nothing.
    #[test]
    fn max_seqlen_k_changes_no_allocation() {
        let base = allocs(&cfg(&[4000, 128]));
        let mut c = cfg(&[4000, 128]);
        c.max_seqlen_k = Some(262_144);
        assert_eq!(allocs(&c), base);
    }

    /// The old padded layout scales with max_seqlen_q (query side only).
    #[test]
    fn padded_lse_scales_with_max_seqlen_q() {
        let mut c = cfg(&[4000, 128]);
        c.padded_lse = true;
        c.max_seqlen_q = Some(32_768);
        c.api = FaApi::FlashAttn;
        let a = allocs(&c);
        let lse = a.iter().find(|x| x.0 == "softmax_lse").unwrap();
        assert_eq!(lse.2, vec![2, 24, 32_768]);
        assert_eq!(lse.3, 2 * 24 * 32_768 * 4);
        assert!(a.iter().all(|x| x.0 != "_unused_philox_offset"));
        let rng = a.iter().find(|x| x.0 == "rng_state").unwrap();
        assert_eq!(rng.3, 16);
    }

    #[test]
    fn preallocated_out_is_an_input() {
        let mut c = cfg(&[64]);
        c.preallocated_out = true;
        let a = allocs(&c);
        assert_eq!(a[5].0, "out");
        assert_eq!(a[5].1, "inputs");
        assert_eq!(a[6].0, "softmax_lse");
    }

    #[test]
    fn rejects_what_flash_attention_rejects() {
        let mut c = cfg(&[10]);
        c.dtype = DType::F32;
        assert!(c.validate().is_err());
        let mut c = cfg(&[10]);
        c.head_dim = 100;
        assert!(c.validate().is_err());
        let mut c = cfg(&[1, 1]);
        assert!(c.validate().unwrap_err().to_string().contains("decode"));
        c.seqlens_q = vec![10, 10];
        c.seqlens_k = vec![10, 10];
        c.max_seqlen_k = Some(5);
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("--max-seqlen-k")
        );
    }
}
