//! The cliff as a frontier of the whole-step model: the largest chunk that fits at a given
//! context, and the largest context that fits at a given chunk, under a limit, with the floor an
//! engine puts under the chunk.

use serde::Serialize;

use crate::{DType, Limit, ModelConfig, ModelError, ServingShape, StepModel, gdn_state_per_seq};

/// The chunks an engine can schedule: at least `min_tokens`, in steps of `multiple`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChunkFloor {
    /// The smallest chunk the engine schedules (for a prompt longer than it).
    pub min_tokens: u64,
    /// Chunks are a multiple of this many tokens.
    pub multiple: u64,
    /// Where the floor comes from, in words.
    pub why: String,
}

impl ChunkFloor {
    /// No floor: any chunk of one token or more.
    pub fn none() -> Self {
        ChunkFloor {
            min_tokens: 1,
            multiple: 1,
            why: "no floor: any chunk of one token or more".into(),
        }
    }

    /// vLLM's floor for a hybrid GDN/mamba model with `mamba_cache_mode="align"` (prefix
    /// caching): the scheduler cuts a prefill chunk down to a multiple of the cache block size
    /// (`vllm/v1/core/sched/scheduler.py` `Scheduler._mamba_block_aligned_split`: "`num_new_tokens`
    /// must be a multiple of `block_size`"), so the chunk cannot go below one block. The block is
    /// the one [`vllm_hybrid_block_size`] computes, unless the user set a larger `--block-size`.
    pub fn vllm_mamba_align(block_size: u64) -> Self {
        ChunkFloor {
            min_tokens: block_size,
            multiple: block_size,
            why: format!(
                "vLLM's mamba align mode: a prefill chunk is a multiple of the {block_size}-token cache block"
            ),
        }
    }
}

/// The attention block size vLLM sets for a hybrid attention + GDN model so that one attention
/// page holds at least one layer's mamba state, in the `align` (and `none`) cache modes:
/// `alignment * ceil(mamba_page / (alignment * attention_page_per_token))`
/// (`vllm/platforms/interface.py` `Platform._align_hybrid_block_size` in recent vLLM, where
/// `alignment = max(the backend's smallest kernel block, --block-size)`, 16 for FlashAttention's
/// `MultipleOf(16)` at the default block size; the same formula with 16 in
/// `vllm/model_executor/models/config.py` `HybridAttentionMambaModelConfig`, read at commit
/// `0144dd5b`). The `all` mode rounds to the mamba chunk size as well, which this does not.
///
/// The mamba page is one layer's conv plus recurrent state for one sequence
/// ([`gdn_state_per_seq`]); the attention page per token is one layer's K plus V
/// (`kv_bytes_per_token_layer`, which a quantised cache such as the seed notes' TurboQuant makes
/// smaller than the dtype's, raising the block: their 4128 is such a case). For Qwen3.6-27B at
/// TP 1 with a bf16 cache: 400 tokens with a bf16 recurrent state, 784 with an fp32 one.
pub fn vllm_hybrid_block_size(
    cfg: &ModelConfig,
    tp: u64,
    kv_bytes_per_token_layer: u64,
    conv_dtype: DType,
    ssm_dtype: DType,
    alignment: u64,
) -> Result<u64, ModelError> {
    if kv_bytes_per_token_layer == 0 || alignment == 0 {
        return Err(ModelError::Invalid(
            "the attention page per token and the block multiple must be at least 1 byte / 1 token"
                .into(),
        ));
    }
    let page = gdn_state_per_seq(cfg, tp, conv_dtype, ssm_dtype, 0)?.bytes_per_layer;
    Ok(alignment * page.div_ceil(alignment * kv_bytes_per_token_layer))
}

/// The largest chunk that fits at one context.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChunkFrontier {
    /// The context (tokens per sequence at the end of the step).
    pub context_tokens: u64,
    /// The largest schedulable chunk that fits; `None` when not even the floor does (the chunk
    /// lever cannot help at this context).
    pub largest_chunk: Option<u64>,
    /// The floor the chunk respects.
    pub floor: ChunkFloor,
    /// The step's counted bytes at the floor, against the limit's bytes.
    pub at_floor: u64,
    /// The limit's bytes.
    pub limit_bytes: u64,
}

/// The largest context that fits at one chunk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ContextFrontier {
    /// The chunk.
    pub chunk_tokens: u64,
    /// The largest context (tokens per sequence, the chunk included) whose step fits; `None` when
    /// not even a context of one chunk does.
    pub largest_context: Option<u64>,
    /// Whether the search stopped at `max_context` with the step still fitting.
    pub capped: bool,
    /// Whether the context stops where its K/V no longer fits the known KV pool (the engine
    /// cannot schedule it) rather than where memory runs out.
    pub limited_by_pool: bool,
    /// The limit's bytes.
    pub limit_bytes: u64,
}

impl StepModel {
    fn counted(&self, shape: &ServingShape, limit: &Limit) -> Result<u64, ModelError> {
        Ok(self
            .check(shape, limit)?
            .limit
            .map(|l| l.counted)
            .unwrap_or_default())
    }

    /// The largest chunk (a multiple of the floor's, at least its minimum, at most the context)
    /// whose step fits `limit` at `base.context_tokens`. The step's bytes grow with the chunk, so
    /// a binary search over the schedulable chunks finds it.
    pub fn largest_chunk_at(
        &self,
        base: &ServingShape,
        limit: &Limit,
        floor: &ChunkFloor,
    ) -> Result<ChunkFrontier, ModelError> {
        let limit_bytes = limit.bytes()?;
        let l = base.context_tokens;
        let m = floor.multiple.max(1);
        let lo_k = floor.min_tokens.max(1).div_ceil(m);
        let hi_k = l / m;
        let fits = |k: u64| -> Result<(bool, u64), ModelError> {
            let c = self.counted(&base.with_chunk(k * m), limit)?;
            Ok((c <= limit_bytes, c))
        };
        let (floor_fits, at_floor) = if lo_k <= hi_k {
            fits(lo_k)?
        } else {
            // The context is shorter than the floor: the whole context is one chunk.
            let c = self.counted(&base.with_chunk(l), limit)?;
            return Ok(ChunkFrontier {
                context_tokens: l,
                largest_chunk: (c <= limit_bytes).then_some(l),
                floor: floor.clone(),
                at_floor: c,
                limit_bytes,
            });
        };
        let largest = if !floor_fits {
            None
        } else {
            let (mut good, mut bad) = (lo_k, hi_k + 1);
            while bad - good > 1 {
                let mid = good + (bad - good) / 2;
                if fits(mid)?.0 {
                    good = mid;
                } else {
                    bad = mid;
                }
            }
            Some(good * m)
        };
        Ok(ChunkFrontier {
            context_tokens: l,
            largest_chunk: largest,
            floor: floor.clone(),
            at_floor,
            limit_bytes,
        })
    }

    /// The largest context (at least the chunk, at most `max_context`) whose step fits `limit`
    /// at `base.chunk_tokens`. The step's bytes grow with the context, so a binary search finds
    /// it.
    pub fn largest_context_at(
        &self,
        base: &ServingShape,
        limit: &Limit,
        max_context: u64,
    ) -> Result<ContextFrontier, ModelError> {
        let limit_bytes = limit.bytes()?;
        let t = base.chunk_tokens;
        // Memory and, with a known pool, the pool's room for the context's K/V.
        let in_pool = |l: u64| -> Result<bool, ModelError> {
            Ok(self.step(&base.with_context(l))?.kv_fits_pool != Some(false))
        };
        let fits = |l: u64| -> Result<bool, ModelError> {
            Ok(in_pool(l)? && self.counted(&base.with_context(l), limit)? <= limit_bytes)
        };
        let frontier =
            |largest_context: Option<u64>, capped: bool| -> Result<ContextFrontier, ModelError> {
                let limited_by_pool = match largest_context {
                    Some(l) if !capped => !in_pool(l + 1)?,
                    _ => false,
                };
                Ok(ContextFrontier {
                    chunk_tokens: t,
                    largest_context,
                    capped,
                    limited_by_pool,
                    limit_bytes,
                })
            };
        if max_context < t || !fits(t)? {
            return frontier(None, false);
        }
        if fits(max_context)? {
            return frontier(Some(max_context), true);
        }
        let (mut good, mut bad) = (t, max_context);
        while bad - good > 1 {
            let mid = good + (bad - good) / 2;
            if fits(mid)? {
                good = mid;
            } else {
                bad = mid;
            }
        }
        frontier(Some(good), false)
    }

    /// The step's counted bytes at each context, the chunk held: the cliff plot's first panel.
    pub fn context_curve(
        &self,
        base: &ServingShape,
        limit: &Limit,
        contexts: &[u64],
    ) -> Result<Vec<(u64, u64)>, ModelError> {
        contexts
            .iter()
            .map(|&l| Ok((l, self.counted(&base.with_context(l), limit)?)))
            .collect()
    }

    /// The step's counted bytes at each chunk, the context held: the cliff plot's second panel.
    pub fn chunk_curve(
        &self,
        base: &ServingShape,
        limit: &Limit,
        chunks: &[u64],
    ) -> Result<Vec<(u64, u64)>, ModelError> {
        chunks
            .iter()
            .map(|&c| Ok((c, self.counted(&base.with_chunk(c), limit)?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KnownParts, Runtime, StepVariants};

    fn model() -> (StepModel, ServingShape) {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../samples/models/Qwen3.6-27B/config.json");
        let c = ModelConfig::from_path(p).unwrap();
        let v = StepVariants::for_runtime(Runtime::Workload, &c);
        let s = ServingShape::prefill(&c, 4128, 4128);
        (StepModel::new(c, v, KnownParts::default()), s)
    }

    #[test]
    fn the_frontier_is_the_last_shape_that_fits() {
        let (m, s) = model();
        let limit = Limit::Card { capacity: 24 << 30 };
        let f = m.largest_context_at(&s, &limit, 1 << 20).unwrap();
        let l = f.largest_context.unwrap();
        assert!(m.check(&s.with_context(l), &limit).unwrap().fits().unwrap());
        assert!(
            !m.check(&s.with_context(l + 1), &limit)
                .unwrap()
                .fits()
                .unwrap()
        );
        // A context shorter than the floor is prefilled as one chunk.
        let short = s.with_context(1000).with_chunk(1000);
        let c = m
            .largest_chunk_at(&short, &limit, &ChunkFloor::vllm_mamba_align(4128))
            .unwrap();
        assert_eq!(c.largest_chunk, Some(1000));
        // Chunks are multiples of the floor's block.
        let at = s.with_context(20 * 4128);
        let c = m
            .largest_chunk_at(&at, &limit, &ChunkFloor::vllm_mamba_align(400))
            .unwrap();
        let chunk = c.largest_chunk.unwrap();
        assert_eq!(chunk % 400, 0);
        assert!(
            !m.check(&at.with_chunk(chunk + 400), &limit)
                .unwrap()
                .fits()
                .unwrap()
        );
        // The curves are the counted bytes at each point.
        let curve = m.context_curve(&s, &limit, &[4128, 8256]).unwrap();
        assert_eq!(curve[1].1 - curve[0].1, 270_532_608);
        let small = Limit::Card { capacity: 1 << 30 };
        let none = m.largest_context_at(&s, &small, 1 << 20).unwrap();
        assert_eq!(none.largest_context, None);
    }
}
