//! The models and options the prefill's unit tests plan with.

use vramtrace_models::{ModelConfig, WeightFormat};

use super::{KvCacheMode, PrefillOptions};
use crate::dtype::DType;

/// Qwen3.6-27B's config.json, as shipped in samples/.
pub(super) fn qwen36() -> ModelConfig {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../samples/models/Qwen3.6-27B/config.json"
    );
    ModelConfig::from_path(path).unwrap()
}

/// Two GDN layers then one attention layer, twice; small enough to read.
pub(super) fn tiny() -> ModelConfig {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tiny/config.json");
    ModelConfig::from_path(path).unwrap()
}

/// A bf16 prefill of `prompt` tokens in chunks of `chunk`, the KV cache grown.
pub(super) fn options(prompt: usize, chunk: usize) -> PrefillOptions {
    PrefillOptions {
        prompt_tokens: prompt,
        chunk,
        weights: WeightFormat::Bf16,
        kv_cache: KvCacheMode::Grow,
        kv_dtype: DType::BF16,
        seed: 0,
    }
}
