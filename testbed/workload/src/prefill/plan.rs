//! The plan of a prefill from the model's config.json: the options checked,
//! the persistent stand-ins sized, the layer calls shaped, the prompt cut
//! into chunks.

use vramtrace_models::{self as model, LayerKind, ModelConfig};

use super::gdn_state::{GdnStateSpec, gdn_states};
use super::weights::weight_specs;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fa::FaConfig;
use crate::gdn::GdnConfig;
use crate::tensor::TensorSpec;
use vramtrace_models::WeightFormat;

/// vLLM's chunk on a 24 GiB card (`--max-num-batched-tokens 4128`).
pub const DEFAULT_CHUNK: usize = 4128;

/// How the KV cache gets its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvCacheMode {
    /// For each chunk and attention layer, one block holding that chunk's K
    /// and V, allocated as the context grows (a paged allocator on demand), so
    /// memory fills with the prompt: this is what makes a prompt-length cliff.
    Grow,
    /// One block per attention layer for this many tokens, before the first chunk.
    Preallocate {
        /// Tokens the cache holds.
        tokens: usize,
    },
}

/// What to prefill, besides the model.
#[derive(Clone, Debug, PartialEq)]
pub struct PrefillOptions {
    /// Tokens of the one prompt.
    pub prompt_tokens: usize,
    /// Tokens per chunk (the last chunk may be shorter).
    pub chunk: usize,
    /// Storage format of the weight stand-ins.
    pub weights: WeightFormat,
    /// How the KV cache is allocated.
    pub kv_cache: KvCacheMode,
    /// KV cache element type: [`DType::BF16`] for the activation dtype (the
    /// plan takes the model's 16-bit type), or [`DType::F8E4M3`].
    pub kv_dtype: DType,
    /// Seed of the inputs of a real run.
    pub seed: u64,
}

/// One chunk of the prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkSpan {
    /// Its index (`chunk.{index}` in the labels).
    pub index: usize,
    /// Its first token.
    pub start: usize,
    /// Its tokens.
    pub tokens: usize,
}

/// Everything a prefill allocates that does not depend on the chunk, and the
/// layer shapes the kernels run with.
#[derive(Clone, Debug, PartialEq)]
pub struct PrefillPlan {
    /// The model's short name (its config's folder).
    pub model: String,
    /// The options it was planned with.
    pub options: PrefillOptions,
    /// Layer kinds, in order.
    pub layers: Vec<LayerKind>,
    /// Activation dtype (the model's `torch_dtype`).
    pub dtype: DType,
    /// Weight stand-ins in allocation order.
    pub weights: Vec<TensorSpec>,
    /// GDN state per GDN layer, in layer order.
    pub states: Vec<GdnStateSpec>,
    /// A GDN layer's call, for one token (see [`PrefillPlan::gdn_config`]).
    pub gdn: GdnConfig,
    /// An attention layer's call, for one token (see [`PrefillPlan::fa_config`]).
    pub attention: FaConfig,
    /// `hidden_size`.
    pub hidden: usize,
    /// The MLP's intermediate size (the shared expert's for MoE models).
    pub intermediate: usize,
    /// KV bytes per token of one attention layer (`kv_cache_per_token`).
    pub kv_bytes_per_token: usize,
}
impl PrefillPlan {
    /// Plan a prefill of `cfg` (one rank, no tensor parallelism).
    pub fn new(cfg: &ModelConfig, mut options: PrefillOptions) -> Result<Self> {
        let dtype = check_options(cfg, &mut options)?;
        let weights = weight_specs(cfg, options.weights)?;
        let states = gdn_states(cfg, dtype)?;
        let kv_dtype = model::DType::try_from(options.kv_dtype).map_err(Error::Model)?;
        let kv = model::kv_cache_per_token(cfg, 1, kv_dtype)?;
        let ffn = model::FfnShape::from_config(cfg, options.chunk as u64, 1, cfg.dtype)?;
        let plan = PrefillPlan {
            model: cfg.display_name(),
            options,
            layers: cfg.layer_types.clone(),
            dtype,
            weights,
            states,
            gdn: gdn_call(cfg, dtype),
            attention: FaConfig::new(
                &[1],
                cfg.num_attention_heads as usize,
                cfg.num_key_value_heads as usize,
                cfg.head_dim as usize,
                dtype,
            ),
            hidden: cfg.hidden_size as usize,
            intermediate: ffn.intermediate as usize,
            kv_bytes_per_token: kv.bytes_per_layer as usize,
        };
        plan.check_calls()?;
        Ok(plan)
    }

    /// A KV block matches the models' bytes per token, and every chunk length
    /// is a call the kernels take.
    fn check_calls(&self) -> Result<()> {
        let block = self.kv_block(0, Some(0), 1);
        if block.bytes() != self.kv_bytes_per_token {
            return Err(Error::Model(format!(
                "a KV block takes {} bytes a token, not kv_cache_per_token's {}",
                block.bytes(),
                self.kv_bytes_per_token
            )));
        }
        let mut lengths: Vec<usize> = self.chunks().iter().map(|c| c.tokens).collect();
        lengths.dedup();
        for t in lengths {
            self.gdn_config(t).validate()?;
            self.fa_config(t)
                .validate()
                .map_err(|e| Error::InvalidShape(format!("a chunk of {t} tokens: {e}")))?;
        }
        Ok(())
    }

    /// The chunks of the prompt, in order.
    pub fn chunks(&self) -> Vec<ChunkSpan> {
        let (n, c) = (self.options.prompt_tokens, self.options.chunk);
        (0..n.div_ceil(c))
            .map(|i| ChunkSpan {
                index: i,
                start: i * c,
                tokens: c.min(n - i * c),
            })
            .collect()
    }

    /// The GDN call of a chunk of `tokens`.
    pub fn gdn_config(&self, tokens: usize) -> GdnConfig {
        GdnConfig {
            seqlens: vec![tokens],
            ..self.gdn.clone()
        }
    }

    /// The attention call of a chunk of `tokens`: its queries over its own
    /// keys. FlashAttention's outputs (`out`, `softmax_lse`) are sized by the
    /// chunk's tokens, not by the context, so only the KV cache grows with it.
    pub fn fa_config(&self, tokens: usize) -> FaConfig {
        self.attention.clone().with_seqlens(&[tokens])
    }

    /// The KV block of attention layer `layer`: K and V for `tokens` tokens,
    /// `[2, tokens, kv_heads, head_dim]`; named for its chunk when the cache
    /// grows, for the layer when it is preallocated.
    pub fn kv_block(&self, layer: usize, chunk: Option<usize>, tokens: usize) -> TensorSpec {
        let name = match chunk {
            Some(i) => format!("layer.{layer}.kv.chunk.{i}"),
            None => format!("layer.{layer}.kv"),
        };
        TensorSpec::new(
            name,
            self.options.kv_dtype,
            &[2, tokens, self.attention.kv_heads, self.attention.head_dim],
        )
    }

    /// The three tensors of the MLP stand-in for a chunk of `tokens`, in
    /// allocation order (vLLM 0.20.1 `Qwen2MoeMLP.forward`, eager: see
    /// `vramtrace_models::ffn`).
    pub fn mlp_specs(&self, tokens: usize) -> [TensorSpec; 3] {
        [
            TensorSpec::new("gate_up", self.dtype, &[tokens, 2 * self.intermediate]),
            TensorSpec::new(
                "act (silu_and_mul)",
                self.dtype,
                &[tokens, self.intermediate],
            ),
            TensorSpec::new("down", self.dtype, &[tokens, self.hidden]),
        ]
    }

    /// Bytes of the weight stand-ins.
    pub fn weight_bytes(&self) -> usize {
        self.weights.iter().map(TensorSpec::bytes).sum()
    }

    /// Bytes of the GDN states.
    pub fn state_bytes(&self) -> usize {
        self.states
            .iter()
            .map(|s| s.conv.bytes() + s.ssm.bytes())
            .sum()
    }

    /// Attention layers.
    pub fn attention_layers(&self) -> usize {
        self.layers
            .iter()
            .filter(|k| **k == LayerKind::FullAttention)
            .count()
    }
}

/// Refuse what cannot run and settle the KV dtype (a 16-bit cache takes the
/// model's type); the activation dtype, the model's own.
fn check_options(cfg: &ModelConfig, options: &mut PrefillOptions) -> Result<DType> {
    let bad = |m: String| Err(Error::InvalidShape(m));
    if options.prompt_tokens == 0 {
        return bad("--prompt-tokens must be at least 1".into());
    }
    if options.chunk == 0 {
        return bad("--chunk must be at least 1".into());
    }
    let dtype = DType::from(cfg.dtype);
    if !matches!(dtype, DType::BF16 | DType::F16) {
        return Err(Error::Model(format!(
            "the model's dtype is {}; prefill runs FlashAttention, which takes bfloat16 or \
             float16 only",
            cfg.dtype
        )));
    }
    options.kv_dtype = match options.kv_dtype {
        DType::BF16 | DType::F16 => dtype,
        DType::F8E4M3 => DType::F8E4M3,
        other => return bad(format!("--kv-dtype {other} is not bf16 or fp8")),
    };
    if let KvCacheMode::Preallocate { tokens } = options.kv_cache
        && tokens < options.prompt_tokens
    {
        return bad(format!(
            "--kv-tokens {tokens} cannot hold the {} prompt tokens (vLLM refuses a prompt \
             longer than its KV cache); give at least {}",
            options.prompt_tokens, options.prompt_tokens
        ));
    }
    Ok(dtype)
}

/// A GDN layer's call for one token.
fn gdn_call(cfg: &ModelConfig, dtype: DType) -> GdnConfig {
    GdnConfig {
        seqlens: vec![1],
        // vLLM passes cu_seqlens, l2-normalises q and k inside the call and
        // always hands over (and takes back) the recurrent state.
        varlen: true,
        heads: cfg.linear_num_value_heads as usize,
        key_heads: cfg.linear_num_key_heads as usize,
        key_dim: cfg.linear_key_head_dim as usize,
        value_dim: cfg.linear_value_head_dim as usize,
        dtype,
        scale: None,
        qk_l2norm: true,
        initial_state: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prefill::fixtures::{options, qwen36, tiny};

    #[test]
    fn qwen36_plan_matches_the_models() {
        let cfg = qwen36();
        let mut o = options(262_144, DEFAULT_CHUNK);
        o.weights = WeightFormat::Int4 { group: 128 };
        let p = PrefillPlan::new(&cfg, o).unwrap();
        assert_eq!(p.weights.len(), 64 + 3);
        assert_eq!(
            p.weight_bytes() as u64,
            model::weight_bytes(&cfg, WeightFormat::Int4 { group: 128 }, 1)
                .unwrap()
                .bytes
        );
        assert_eq!(
            p.state_bytes() as u64,
            model::gdn_state_per_seq(&cfg, 1, model::DType::BF16, model::DType::F32, 0)
                .unwrap()
                .bytes_per_seq
        );
        // 4 KV heads x 256 x K and V x bf16.
        assert_eq!(p.kv_bytes_per_token, 4096);
        assert_eq!(p.attention_layers(), 16);
        let chunks = p.chunks();
        assert_eq!(chunks.len(), 64);
        assert_eq!(chunks[63].start, 63 * 4128);
        assert_eq!(chunks[63].tokens, 262_144 - 63 * 4128);
        let [gate_up, act, down] = p.mlp_specs(4128);
        // vramtrace_models::ffn's numbers for a 4128-token chunk.
        assert_eq!(
            [gate_up.bytes(), act.bytes(), down.bytes()],
            [287_440_896, 143_720_448, 42_270_720]
        );
    }

    #[test]
    fn refuses_what_cannot_run() {
        let cfg = tiny();
        let mut o = options(40, 32);
        o.kv_cache = KvCacheMode::Preallocate { tokens: 39 };
        assert!(
            PrefillPlan::new(&cfg, o)
                .unwrap_err()
                .to_string()
                .contains("--kv-tokens 39")
        );
        // A one-token last chunk with grouped heads is FlashAttention's decode path.
        let e = PrefillPlan::new(&cfg, options(33, 32)).unwrap_err();
        assert!(e.to_string().contains("a chunk of 1 tokens"), "{e}");
        assert!(PrefillPlan::new(&cfg, options(0, 32)).is_err());
    }
}
