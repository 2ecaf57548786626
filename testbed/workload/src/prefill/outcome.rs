//! What a prefill did: the chunks that completed, the bytes held by kind,
//! the peak, and the allocation that did not fit.

use vramtrace_models::LayerKind;

use super::plan::ChunkSpan;
use crate::tensor::PeakMark;

/// Bytes held by each kind of tensor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// The capacity ballast.
    pub ballast: usize,
    /// Weight stand-ins.
    pub weights: usize,
    /// KV cache blocks.
    pub kv_cache: usize,
    /// GDN conv and recurrent states.
    pub gdn_state: usize,
    /// Everything else: the live layer's inputs, intermediates and outputs.
    pub activations: usize,
}

impl Held {
    /// All of it.
    pub fn total(&self) -> usize {
        self.ballast + self.weights + self.kv_cache + self.gdn_state + self.activations
    }

    /// Everything but the activations.
    pub(super) fn persistent(&self) -> usize {
        self.ballast + self.weights + self.kv_cache + self.gdn_state
    }
}

/// What one completed chunk left behind.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChunkReport {
    /// Which chunk.
    pub span: ChunkSpan,
    /// Prompt tokens prefilled once it finished.
    pub tokens_done: usize,
    /// KV cache bytes held then.
    pub kv_cache_bytes: usize,
    /// Bytes held then (the persistent tensors).
    pub live_bytes: usize,
    /// The most bytes held at once during the chunk.
    pub peak_bytes: usize,
    /// Wall time of the chunk, in seconds.
    pub seconds: f64,
}

/// Where a prefill was when an allocation failed.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    /// The tensor that could not be allocated.
    pub name: String,
    /// Its dtype name.
    pub dtype: String,
    /// Its shape.
    pub shape: Vec<i64>,
    /// Bytes requested.
    pub bytes: usize,
    /// The range path of the request, the label the preload records with it.
    pub label: String,
    /// The chunk being prefilled (none while allocating persistent tensors).
    pub chunk: Option<ChunkSpan>,
    /// The layer running (none outside the layers).
    pub layer: Option<usize>,
    /// Its kind.
    pub layer_kind: Option<LayerKind>,
    /// The stage: the label below `layer.{l}/`, or below `prefill/` outside layers.
    pub stage: String,
    /// Prompt tokens prefilled by the chunks before.
    pub tokens_prefilled: usize,
    /// Bytes held when the request failed.
    pub held: Held,
    /// Free device memory then, when the device says.
    pub device_free: Option<usize>,
    /// The driver's error.
    pub message: String,
}

/// What a prefill did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrefillOutcome {
    /// The chunks that completed.
    pub chunks: Vec<ChunkReport>,
    /// The persistent bytes at the end (or at the failure).
    pub persistent: Held,
    /// The most bytes held at once.
    pub peak: Option<PeakMark>,
    /// The allocation that did not fit, if one did not.
    pub failure: Option<Failure>,
}
