//! What a byte is for: the twelve categories every byte of a step, a trace's moment or the
//! live view falls in. One type for the model (its parts, their residuals) and for the
//! trace's categoriser (`vramtrace::categoriser`, which re-exports it).

use std::fmt;

use serde::Serialize;

/// What a byte is for. The keys ([`Category::key`]) are those of `vramtrace report --json`'s
/// `categories`; the titles ([`Category::title`]) what a person reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// The model's parameters and buffers.
    Weights,
    /// Attention keys and values kept between steps.
    KvCache,
    /// Recurrent state kept between steps (GDN / mamba conv and SSM state).
    State,
    /// Tensors live only within a step.
    Activations,
    /// A serving engine's static input and output buffers.
    EngineBuffers,
    /// Memory held by CUDA graphs (their private pools).
    CudaGraphs,
    /// NCCL's buffers and communicators' workspaces.
    Communication,
    /// Autotuning scratch (Triton's benchmark cache flush, candidates' copies).
    Autotune,
    /// Reserved by the caching allocator, not allocated to any tensor.
    AllocatorReserve,
    /// The CUDA context, loaded modules and libraries' own state (cuBLAS workspaces).
    Context,
    /// Other processes on the device.
    OtherProcess,
    /// What no rule covers.
    Unnamed,
}

impl Category {
    /// Every category, in report and stacking order.
    pub const ALL: [Category; 12] = [
        Category::Weights,
        Category::KvCache,
        Category::State,
        Category::Activations,
        Category::EngineBuffers,
        Category::CudaGraphs,
        Category::Communication,
        Category::Autotune,
        Category::AllocatorReserve,
        Category::Context,
        Category::OtherProcess,
        Category::Unnamed,
    ];

    /// The name in `report --json` and the models' tables (`kv_cache`).
    pub const fn key(self) -> &'static str {
        match self {
            Category::Weights => "weights",
            Category::KvCache => "kv_cache",
            Category::State => "state",
            Category::Activations => "activations",
            Category::EngineBuffers => "engine_buffers",
            Category::CudaGraphs => "cuda_graphs",
            Category::Communication => "communication",
            Category::Autotune => "autotune",
            Category::AllocatorReserve => "allocator_reserve",
            Category::Context => "context",
            Category::OtherProcess => "other_process",
            Category::Unnamed => "unnamed",
        }
    }

    /// The name a person reads (`KV cache`).
    pub const fn title(self) -> &'static str {
        match self {
            Category::Weights => "weights",
            Category::KvCache => "KV cache",
            Category::State => "recurrent state",
            Category::Activations => "activations",
            Category::EngineBuffers => "engine buffers",
            Category::CudaGraphs => "CUDA graphs",
            Category::Communication => "communication",
            Category::Autotune => "autotuning",
            Category::AllocatorReserve => "allocator reserve",
            Category::Context => "context and modules",
            Category::OtherProcess => "other processes",
            Category::Unnamed => "unnamed",
        }
    }

    /// Its position in [`Category::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The category of a key (`kv_cache`) or a title (`KV cache`), ignoring case.
    pub fn parse(s: &str) -> Option<Category> {
        Category::ALL
            .into_iter()
            .find(|c| c.key().eq_ignore_ascii_case(s) || c.title().eq_ignore_ascii_case(s))
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.title())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_titles_parse_back_in_order() {
        for (i, c) in Category::ALL.into_iter().enumerate() {
            assert_eq!(c.index(), i);
            assert_eq!(Category::parse(c.key()), Some(c));
            assert_eq!(Category::parse(c.title()), Some(c));
            assert_eq!(serde_json::to_value(c).unwrap(), c.key());
        }
        assert_eq!(Category::parse("KV CACHE"), Some(Category::KvCache));
        assert_eq!(Category::parse("kv"), None);
    }
}
