//! vramtrace's reference workload: fla 0.6.0's gated delta rule chunk forward
//! and FlashAttention-2's varlen forward on real CUDA kernels (compiled at run
//! time with NVRTC), allocating, naming and freeing every tensor exactly as the
//! upstream code does, so traces of it can be checked against ground truth on
//! any NVIDIA GPU without PyTorch; and [`prefill`], a model-shaped chunked
//! prefill that drives both through every layer of a hybrid model until the
//! prompt is in or the card is full.
//!
//! ```
//! use vramtrace_workload::{DType, GdnConfig, RecordingBackend, Session, gdn};
//!
//! // The allocation sequence, on a bookkeeping-only backend (no GPU needed).
//! let cfg = GdnConfig {
//!     seqlens: vec![4128], varlen: false, heads: 48, key_heads: 48,
//!     key_dim: 128, value_dim: 128, dtype: DType::BF16, scale: None,
//!     qk_l2norm: false, initial_state: false,
//! };
//! let rec = RecordingBackend::new();
//! let session = Session::new(&rec, false);
//! gdn::run(&session, &cfg, None).unwrap();
//! assert_eq!(rec.live_bytes(), 0);
//! ```
//!
//! # Design constraints
//! - One driver allocation per tensor (`cuMemAlloc_v2`), in fla's order, freed
//!   where Python drops the last reference: [`DeviceTensor`] is RAII and the
//!   stage code in [`gdn`] and [`fa`] cites the upstream line for each.
//! - Real runs, `--simulate` runs and tests share one code path through the
//!   [`Backend`] trait; simulate's launches are no-ops.
//! - Sizes come from what the kernels need, never from an analytical model:
//!   the models are tested *against* this. The exception is [`prefill`]'s
//!   stand-ins for what no kernel here allocates (weights, KV cache, GDN state,
//!   the MLP), sized with `vramtrace_models`.
//! - No panics: missing libraries and driver entry points become [`Error`]s.

pub mod annotate;
pub mod backend;
pub mod check;
pub mod cuda;
mod dtype;
pub mod dump;
mod error;
pub mod fa;
pub mod fa_ref;
pub mod gdn;
pub mod gdn_ref;
pub mod kernels;
pub mod prefill;
pub mod report;
mod rng;
mod tensor;

pub use backend::{Backend, Kernel, RecordingBackend};
pub use dtype::DType;
pub use error::{AllocFailure, Error, Result};
pub use gdn::GdnConfig;
pub use tensor::{Captured, DeviceTensor, LedgerEvent, PeakMark, Session, TensorSpec};
