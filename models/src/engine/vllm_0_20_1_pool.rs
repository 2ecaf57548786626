//! vLLM 0.20.1's KV-cache pool, given the bytes its start-up left for it: the page per layer
//! type, the attention block size a hybrid model is aligned to, the groups that share a page,
//! the number of blocks, the concurrency and the token count vLLM logs, and its start-up check
//! that one request of `max_model_len` fits. Read from the wheel (every line cited in
//! docs/vllm-0.20.1-planner-notes.md, sections 4 and 5); the memory available for the pool
//! (`determine_available_memory`) is an input here, not yet predicted.

use serde::Serialize;

use crate::ModelError;

/// The block size vLLM uses when none is given (`config/cache.py:45`), and the alignment of
/// attention kernel blocks (FlashAttention's `MultipleOf(16)`, `platforms/interface.py:576-583`).
pub const DEFAULT_BLOCK_SIZE: u64 = 16;

/// A Gated DeltaNet layer's state per request (`mamba_utils.py:212-234`
/// `gated_delta_net_state_shape`), per tensor-parallel rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdnState {
    /// `linear_num_key_heads`.
    pub key_heads: u64,
    /// `linear_num_value_heads`.
    pub value_heads: u64,
    /// `linear_key_head_dim`.
    pub key_dim: u64,
    /// `linear_value_head_dim`.
    pub value_dim: u64,
    /// `linear_conv_kernel_dim`.
    pub conv_kernel: u64,
    /// Bytes per element of the conv state (the model dtype unless `mamba_cache_dtype`).
    pub conv_bytes: u64,
    /// Bytes per element of the recurrent state (`mamba_ssm_cache_dtype`).
    pub ssm_bytes: u64,
}

impl GdnState {
    /// The state's bytes on one rank of `tp` (`MambaSpec.page_size_bytes`,
    /// `v1/kv_cache_interface.py:529-538`): the conv state `(conv_k − 1 + spec, conv_dim / tp)`
    /// and the recurrent state `(nv / tp, dv, dk)`.
    pub fn page_bytes(&self, tp: u64, num_spec: u64) -> Result<u64, ModelError> {
        let conv_dim = self.key_dim * self.key_heads * 2 + self.value_dim * self.value_heads;
        for (what, n) in [
            ("the conv dim", conv_dim),
            ("the value heads", self.value_heads),
        ] {
            if tp == 0 || n % tp != 0 {
                return Err(ModelError::Invalid(format!(
                    "{what} ({n}) does not divide by tensor parallelism {tp} (vLLM's divide() asserts it)"
                )));
            }
        }
        let conv = (self.conv_kernel - 1 + num_spec) * (conv_dim / tp) * self.conv_bytes;
        let ssm = (self.value_heads / tp) * self.value_dim * self.key_dim * self.ssm_bytes;
        Ok(conv + ssm)
    }
}

/// What the pool is made for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolShape {
    /// Full-attention layers.
    pub attention_layers: u64,
    /// Gated DeltaNet layers (0 for a dense model).
    pub gdn_layers: u64,
    /// KV heads per rank (`get_num_kv_heads(parallel_config)`: replicated when fewer than TP).
    pub kv_heads_per_rank: u64,
    /// Head size of K and of V.
    pub head_size: u64,
    /// Bytes per KV element (the model dtype with `--kv-cache-dtype auto`, 1 for fp8).
    pub kv_bytes: u64,
    /// The GDN state, for a hybrid model.
    pub gdn: Option<GdnState>,
    /// Tensor parallelism.
    pub tp: u64,
    /// `--block-size`, if given.
    pub block_size: Option<u64>,
    /// `--max-model-len`.
    pub max_model_len: u64,
    /// Speculative tokens (0 without speculative decoding).
    pub num_spec: u64,
    /// `--enable-prefix-caching` on a hybrid model: mamba cache mode "align" (Qwen3-Next and
    /// Qwen3.5 do not support "all"; `model_executor/models/config.py:351-377`), two states a
    /// request plus the speculative ones instead of one.
    pub prefix_caching: bool,
}

/// The pool vLLM makes from `available` bytes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Pool {
    /// The attention block size in tokens (aligned up for a hybrid model).
    pub block_size: u64,
    /// Bytes of one page (one block of one layer; a hybrid's state padded to it).
    pub page_bytes: u64,
    /// The GDN state's own bytes before padding, for a hybrid model.
    pub gdn_state_bytes: Option<u64>,
    /// Layers sharing one tensor (one from each group).
    pub group_size: u64,
    /// Groups of attention layers and of GDN layers.
    pub groups: (u64, u64),
    /// Blocks of the pool (`get_num_blocks`), the null block included.
    pub num_blocks: u64,
    /// Bytes the pool allocates: group_size × page × num_blocks.
    pub pool_bytes: u64,
    /// Blocks one request of `max_model_len` needs.
    pub blocks_per_request: u64,
    /// `Maximum concurrency for … tokens per request`.
    pub max_concurrency: f64,
    /// `GPU KV cache size: … tokens` (`int(max_concurrency × max_model_len)`).
    pub kv_cache_tokens: u64,
    /// Bytes one request of `max_model_len` needs (the start-up check's `needed`).
    pub needed_bytes: u64,
}

/// The pool of `shape` in `available` bytes (`kv_cache_utils.py:930-947, 872-890, 1684-1713`),
/// or vLLM's start-up error when one request of `max_model_len` does not fit (`:689-723`).
pub fn plan(shape: &PoolShape, available: i128) -> Result<Pool, ModelError> {
    if shape.max_model_len == 0 || shape.attention_layers + shape.gdn_layers == 0 {
        return Err(ModelError::Invalid(
            "a pool needs layers and a max_model_len of at least 1".into(),
        ));
    }
    let attn_1tok = 2 * shape.kv_heads_per_rank * shape.head_size * shape.kv_bytes;
    let mut block = shape.block_size.unwrap_or(DEFAULT_BLOCK_SIZE);
    let mut gdn_state_bytes = None;
    if let Some(g) = shape.gdn.filter(|_| shape.gdn_layers > 0) {
        // `_align_hybrid_block_size` (`platforms/interface.py:596-610`): the attention block
        // grows to hold at least one state, in multiples of the kernel alignment.
        let state = g.page_bytes(shape.tp, shape.num_spec)?;
        let align = DEFAULT_BLOCK_SIZE.max(block);
        let attn_block = align * state.div_ceil(align * attn_1tok);
        block = block.max(attn_block);
        gdn_state_bytes = Some(state);
    }
    // The state is padded to the attention page (`:615-635`).
    let page = block * attn_1tok;
    // `_get_kv_cache_groups_uniform_page_size` (`kv_cache_utils.py:1136-1147`): the smaller
    // layer count, or the larger when it is under 1.5× the smaller; one type alone: all.
    let (a, m) = (shape.attention_layers, shape.gdn_layers);
    let group_size = match (a, m) {
        (0, n) | (n, 0) => n,
        _ => {
            let (lo, hi) = (a.min(m), a.max(m));
            if hi * 2 < lo * 3 { hi } else { lo }
        }
    };
    let groups = (a.div_ceil(group_size), m.div_ceil(group_size));
    // One request: cdiv(M, B) attention blocks per attention group, and per GDN group its
    // state, once plus the speculative ones in mode "none" (prefix caching is off for hybrids by
    // default), twice in "align" (`v1/kv_cache_interface.py:540-547`).
    let states = if shape.prefix_caching { 2 } else { 1 };
    let blocks_per_request =
        groups.0 * shape.max_model_len.div_ceil(block) + groups.1 * (states + shape.num_spec);
    let needed = u128::from(group_size) * u128::from(page) * u128::from(blocks_per_request);
    let needed_bytes = crate::error::fit_bytes("one request's KV cache", needed)?;
    if available <= 0 {
        return Err(ModelError::Invalid(
            "No available memory for the cache blocks (vLLM's start-up error: the weights, the profile run's peak and the non-torch memory take more than --gpu-memory-utilization allows)".into(),
        ));
    }
    if i128::from(needed_bytes) > available {
        return Err(ModelError::Invalid(format!(
            "vLLM refuses to start: one request of max_model_len {} needs {} GiB of KV cache, more than the {} GiB available",
            shape.max_model_len,
            gib(needed_bytes as f64),
            gib(available as f64)
        )));
    }
    let num_blocks = (available as u128 / u128::from(page) / u128::from(group_size)) as u64;
    let max_concurrency = num_blocks as f64 / blocks_per_request as f64;
    Ok(Pool {
        block_size: block,
        page_bytes: page,
        gdn_state_bytes,
        group_size,
        groups,
        num_blocks,
        pool_bytes: group_size * page * num_blocks,
        blocks_per_request,
        max_concurrency,
        kv_cache_tokens: (max_concurrency * shape.max_model_len as f64) as u64,
        needed_bytes,
    })
}

/// vLLM's `format_gib` (`utils/mem_utils.py:27-28`): GiB rounded to two decimals, as Python
/// prints a float.
fn gib(bytes: f64) -> String {
    let v = (bytes / (1u64 << 30) as f64 * 100.0).round() / 100.0;
    if v.fract() == 0.0 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen3-Next-80B-A3B's shape (12 full-attention and 36 GDN layers; 2 KV heads of 256;
    /// GDN 16 key and 32 value heads of 128, conv kernel 4; bf16), as vLLM 0.20.1 sizes it.
    fn qwen3_next(tp: u64) -> PoolShape {
        PoolShape {
            attention_layers: 12,
            gdn_layers: 36,
            kv_heads_per_rank: 2,
            head_size: 256,
            kv_bytes: 2,
            gdn: Some(GdnState {
                key_heads: 16,
                value_heads: 32,
                key_dim: 128,
                value_dim: 128,
                conv_kernel: 4,
                conv_bytes: 2,
                ssm_bytes: 2,
            }),
            tp,
            block_size: None,
            max_model_len: 32_768,
            num_spec: 0,
            prefix_caching: false,
        }
    }

    /// A dense model's shape: 32 layers, 8 KV heads of 128, bf16, one rank.
    fn dense(max_model_len: u64) -> PoolShape {
        PoolShape {
            attention_layers: 32,
            gdn_layers: 0,
            kv_heads_per_rank: 8,
            head_size: 128,
            kv_bytes: 2,
            gdn: None,
            tp: 1,
            block_size: None,
            max_model_len,
            num_spec: 0,
            prefix_caching: false,
        }
    }

    #[test]
    fn a_hybrid_s_block_grows_to_hold_its_state_and_the_state_is_padded() {
        // docs/vllm-0.20.1-planner-notes.md, section 8: per TP, the state's bytes, the aligned
        // attention block and the page both share.
        for (tp, state, block, page) in [
            (1, 1_097_728u64, 544u64, 1_114_112u64),
            (2, 548_864, 544, 557_056),
            (4, 274_432, 272, 278_528),
            (8, 137_216, 144, 147_456),
        ] {
            let mut s = qwen3_next(tp);
            // KV heads are replicated when fewer than the ranks: one per rank from TP 2 on.
            s.kv_heads_per_rank = if tp == 1 { 2 } else { 1 };
            let p = plan(&s, 60 << 30).unwrap();
            assert_eq!(p.gdn_state_bytes, Some(state), "TP {tp}");
            assert_eq!((p.block_size, p.page_bytes), (block, page), "TP {tp}");
            assert_eq!((p.group_size, p.groups), (12, (1, 3)));
        }
        // At TP 1 and 32,768 tokens a request takes cdiv(32768, 544) = 61 attention blocks and
        // one state in each of the 3 GDN groups: 64 blocks, and 512 tokens a block.
        let p = plan(&qwen3_next(1), 60 << 30).unwrap();
        assert_eq!(p.blocks_per_request, 64);
        assert_eq!(p.num_blocks, (60u64 << 30) / 1_114_112 / 12);
        assert_eq!(p.kv_cache_tokens, 512 * p.num_blocks);
    }

    /// A user's log (tests/data/vllm_startup_logs.json, `qwen3-next-80b-int4-autoround-tp2-
    /// fp8e5m2`: TP 2, fp16, `--kv-cache-dtype fp8_e5m2`, max_model_len 215,040; a vLLM of
    /// October 2025) says "GPU KV cache size: 90,048 tokens" and "Maximum concurrency for
    /// 215,040 tokens per request: 1.66x". Its available bytes are not in the log, so this
    /// checks the shape, not the size: with an fp8 page of 512 B a token, the state of
    /// 548,864 B aligns the attention block to exactly 1,072 tokens (90,048 = 84 × 1,072), a
    /// request needs 201 + 3 blocks, and 1.66x is 338 or 339 blocks, whose share per group
    /// (84, of 4 groups) is the version's token count.
    #[test]
    fn a_user_s_qwen3_next_log_has_the_aligned_block_of_its_fp8_pool() {
        let mut s = qwen3_next(2);
        s.kv_heads_per_rank = 1;
        s.kv_bytes = 1;
        s.max_model_len = 215_040;
        let p = plan(&s, 4 << 30).unwrap();
        assert_eq!(p.block_size, 1072);
        assert_eq!(p.page_bytes, 548_864);
        assert_eq!(p.blocks_per_request, 204);
        assert_eq!(90_048 % p.block_size, 0);
        for num_blocks in [338u64, 339] {
            assert_eq!(
                format!("{:.2}", num_blocks as f64 / p.blocks_per_request as f64),
                "1.66"
            );
            assert_eq!(num_blocks / 4 * p.block_size, 90_048);
        }
    }

    #[test]
    fn a_dense_pool_logs_concurrency_times_max_model_len_not_blocks_times_block_size() {
        // Section 8's dense example: 32 layers, 8 KV heads of 128, bf16, blocks of 16, 60 GiB.
        let mut s = dense(8192);
        let p = plan(&s, 60 << 30).unwrap();
        assert_eq!(
            (p.page_bytes, p.group_size, p.num_blocks),
            (65_536, 32, 30_720)
        );
        assert_eq!(format!("{:.2}", p.max_concurrency), "60.00");
        assert_eq!(p.kv_cache_tokens, 491_520);
        s.max_model_len = 8193;
        let p = plan(&s, 60 << 30).unwrap();
        assert_eq!(p.blocks_per_request, 513);
        assert_eq!(format!("{:.2}", p.max_concurrency), "59.88");
        assert_eq!(p.kv_cache_tokens, 490_621);
    }

    #[test]
    fn vllm_refuses_to_start_when_one_request_does_not_fit() {
        let s = dense(131_072);
        // 131,072 tokens × 128 KiB = 16 GiB needed.
        let e = plan(&s, 8 << 30).unwrap_err().to_string();
        assert!(
            e.contains("needs 16.0 GiB of KV cache, more than the 8.0 GiB"),
            "{e}"
        );
        assert!(plan(&s, 16 << 30).is_ok());
        let e = plan(&s, -(1 << 30)).unwrap_err().to_string();
        assert!(e.contains("No available memory"), "{e}");
    }
}
