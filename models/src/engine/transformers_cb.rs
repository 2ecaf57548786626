//! transformers 5.17's continuous batching (`transformers serve --continuous-batching`,
//! `generate_batch`): the paged KV pool and the batch it plans at start, from the config, the
//! flag and the memory free on the card, by transformers' own formula.
//!
//! Read from the transformers 5.17.0 wheel (paths under `transformers/`):
//! - `generation/continuous_batching/cache.py:565-812` `PagedAttentionMemoryHandler`: the memory
//!   a batch of `M` tokens and `N` cache pages takes is `cm·M + cn·N + cmn·M·N + cmm·M²` per
//!   activation peak (`activation_peak`, `:621-641`: the lm head's `M × (hidden·a + vocab·4)`,
//!   attention's `M × a(hidden + heads·head_dim + 2·page)` plus `N × 2·page·a`), with the static
//!   buffers' terms (`_equation_coefficients`, `:762-802`); `get_available_memory` (`:643-650`)
//!   takes `(total − max(total − free, reserved)) × max_memory_percent` from
//!   `torch.cuda.mem_get_info` (`requests.py:43-52`); `infer_max_batch_tokens_and_num_blocks`
//!   (`:652-680`) sizes `M` as the pages a batch filling 10% of the cache allows, at most 8,192
//!   and at least 256, then `N = ⌊(avail − cm·M − cmm·M²) / (cn + cmn·M)⌋` for each peak, the
//!   smallest; `num_blocks = N // block_size` (`:722-727`).
//! - `cache.py:56-86` `group_layers_by_attn_type` (the layers in groups of the gcd of each
//!   attention type's count); `:244-256` K and V of `(num_blocks + 2) · block_size` slots per
//!   layer of a group; `configuration_utils.py:1753` `block_size = 256`.
//! - `initialization.py`: `max_memory_percent` 0.9, or 0.8 with logit processors (`:270-272`);
//!   the block table only on the flash-attention decode path (`:114-146`, else
//!   `max_blocks_per_request = 0`); CUDA graphs, and with them async batching (two sets of IO
//!   tensors), only when no attention mask is needed, i.e. with flash attention (`:200-267`).
//!
//! Modelled for `paged|sdpa` and `paged|eager` (one attention mask) and flash attention (none),
//! full-attention and sliding-window layers; linear-attention (GDN) layers are refused, as
//! transformers refuses them (`cache.py:279-280`).

use serde::Serialize;

use crate::{LayerKind, ModelConfig, ModelError};

/// transformers' default cache block (`ContinuousBatchingConfig.block_size`).
pub const DEFAULT_BLOCK_SIZE: u64 = 256;
const MIN_MAX_BATCH_TOKENS: u64 = 256;
const DEFAULT_MAX_BATCH_TOKENS: u64 = 8192;
/// The share of the cache one batch may fill when neither `M` nor `N` is given.
const CACHE_FILL_PER_BATCH: f64 = 0.1;

/// What the continuous-batching planner is asked.
#[derive(Clone, Debug)]
pub struct ContinuousBatching {
    /// The model.
    pub config: ModelConfig,
    /// `--cb-max-memory-percent` (`max_memory_percent`).
    pub max_memory_percent: f64,
    /// `--cb-block-size`.
    pub block_size: u64,
    /// Whether the attention is flash attention (no mask, CUDA graphs and async batching on).
    pub flash_attention: bool,
    /// Free device memory when the cache is made (`torch.cuda.mem_get_info` after the weights
    /// are loaded and the cache emptied).
    pub free_bytes: u64,
    /// Bytes PyTorch holds reserved then (its `memory_reserved`): at most what is used.
    pub reserved_bytes: u64,
    /// The card's total.
    pub total_bytes: u64,
}

/// The pool and batch transformers plans.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CbPlan {
    /// Bytes the cache and its batch may take (`available_memory`).
    pub available: u64,
    /// `max_batch_tokens` (`M`).
    pub max_batch_tokens: u64,
    /// `num_blocks`.
    pub num_blocks: u64,
    /// The block in tokens.
    pub block_size: u64,
    /// Token slots of the pool (`num_blocks × block_size`).
    pub pages: u64,
    /// The KV pool's bytes: K and V of every layer of a group, `(num_blocks + 2) × block_size`
    /// slots each.
    pub kv_pool_bytes: u64,
    /// The footprint transformers checks against `available` (the larger peak's polynomial).
    pub footprint: u64,
}

/// One activation peak's coefficients `(cm, cn, cmn, cmm)`.
type Coefficients = (f64, f64, f64, f64);

impl ContinuousBatching {
    fn groups(&self) -> Result<(u64, u64), ModelError> {
        let cfg = &self.config;
        if cfg.layer_types.contains(&LayerKind::LinearAttention) {
            return Err(ModelError::Invalid(
                "transformers 5.17's continuous batching refuses linear-attention (GDN) layers (\"Invalid group type: linear_attention\", cache.py:279-280); serve this model without --continuous-batching".into(),
            ));
        }
        // Every layer is full attention here (a sliding window is not read from the config).
        let layers = cfg.layer_types.len() as u64;
        Ok((1, layers))
    }

    fn coefficients(&self, peak: (f64, f64)) -> Result<Coefficients, ModelError> {
        let cfg = &self.config;
        let (num_groups, group_size) = self.groups()?;
        let (num_groups, group_size) = (num_groups as f64, group_size as f64);
        let a = cfg.dtype.size_bytes() as f64;
        let c = a;
        let i = 4.0;
        let k = if self.flash_attention { 2.0 } else { 1.0 };
        let masks = if self.flash_attention { 0.0 } else { 1.0 };
        let page = (cfg.head_dim * cfg.num_key_value_heads) as f64;
        let max_blocks_per_request = if self.flash_attention { 32.0 } else { 0.0 };
        let (delta_m, delta_n) = peak;
        let cn = delta_n + 2.0 * group_size * page * c + k * num_groups * 8.0;
        let cm = delta_m
            + k * 7.0 * i
            + k * i
            + k * num_groups * max_blocks_per_request * i
            + k * num_groups * 8.0
            + k * num_groups * 8.0;
        let cmn = k * masks * a;
        let cmm = k * masks * a;
        Ok((cm, cn, cmn, cmm))
    }

    fn peaks(&self) -> [(f64, f64); 2] {
        let cfg = &self.config;
        let a = cfg.dtype.size_bytes() as f64;
        let page = (cfg.head_dim * cfg.num_key_value_heads) as f64;
        let q = (cfg.num_attention_heads * cfg.head_dim) as f64;
        let h = cfg.hidden_size as f64;
        [
            (h * a + cfg.vocab_size as f64 * 4.0, 0.0),
            (a * (h + q + 2.0 * page), 2.0 * page * a),
        ]
    }

    fn quadratic(a: f64, b: f64, c: f64) -> Result<f64, ModelError> {
        if a == 0.0 {
            return Ok((-c / b).trunc());
        }
        let d = b * b - 4.0 * a * c;
        if d < 0.0 {
            return Err(ModelError::Invalid(
                "no room for a cache: the memory available is negative".into(),
            ));
        }
        let root = (-b + d.sqrt()) / (2.0 * a);
        if root < 0.0 {
            return Err(ModelError::Invalid(
                "no room for a cache: the memory available is too small".into(),
            ));
        }
        Ok(root.floor())
    }

    /// The pool and the batch, as `infer_max_batch_tokens_and_num_blocks` plans them.
    pub fn plan(&self) -> Result<CbPlan, ModelError> {
        if !(self.max_memory_percent > 0.0 && self.max_memory_percent <= 1.0) {
            return Err(ModelError::Invalid(format!(
                "--cb-max-memory-percent must be above 0 and at most 1, not {}",
                self.max_memory_percent
            )));
        }
        if self.block_size < 4 {
            return Err(ModelError::Invalid(format!(
                "the block size must be at least 4 tokens, not {}",
                self.block_size
            )));
        }
        let used = self.total_bytes.saturating_sub(self.free_bytes);
        let available = (self
            .total_bytes
            .saturating_sub(used.max(self.reserved_bytes)) as f64
            * self.max_memory_percent) as u64;
        let avail = available as f64;
        let bs = self.block_size as f64;
        let coeffs: Vec<Coefficients> = self
            .peaks()
            .into_iter()
            .map(|p| self.coefficients(p))
            .collect::<Result<_, _>>()?;
        // M from a batch that fills 10% of the cache, per peak; the smallest.
        let mut upper = f64::INFINITY;
        for &(cm, cn, cmn, cmm) in &coeffs {
            let m = CACHE_FILL_PER_BATCH;
            let pages = Self::quadratic(cmn * m + cmm * m * m, cn + cm * m, -avail)?;
            upper = upper.min((pages * m).trunc());
        }
        let mut max_batch_tokens = (DEFAULT_MAX_BATCH_TOKENS as f64).min(upper);
        max_batch_tokens = max_batch_tokens.max(MIN_MAX_BATCH_TOKENS as f64);
        let big_m = max_batch_tokens;
        let mut num_blocks = f64::INFINITY;
        for &(cm, cn, cmn, cmm) in &coeffs {
            let pages = ((avail - cm * big_m - cmm * big_m * big_m) / (cn + cmn * big_m)).floor();
            num_blocks = num_blocks.min((pages / bs).floor());
        }
        if num_blocks <= 0.0 {
            return Err(ModelError::Invalid(format!(
                "{available} bytes leave no block for the cache at a batch of {big_m} tokens"
            )));
        }
        let (max_batch_tokens, num_blocks) = (big_m as u64, num_blocks as u64);
        let pages = num_blocks * self.block_size;
        let footprint = coeffs
            .iter()
            .map(|&(cm, cn, cmn, cmm)| {
                let (m, n) = (max_batch_tokens as f64, pages as f64);
                cn * n + cm * m + cmn * n * m + cmm * m * m
            })
            .fold(0.0f64, f64::max) as u64;
        let (_, group_size) = self.groups()?;
        let cfg = &self.config;
        let kv_pool_bytes = 2
            * group_size
            * (num_blocks + 2)
            * self.block_size
            * cfg.num_key_value_heads
            * cfg.head_dim
            * cfg.dtype.size_bytes();
        Ok(CbPlan {
            available,
            max_batch_tokens,
            num_blocks,
            block_size: self.block_size,
            pages,
            kv_pool_bytes,
            footprint,
        })
    }
}
