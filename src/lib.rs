//! vramtrace: GPU memory profiler and allocation tracer.
//!
//! The preload (`probes/preload`) records every allocation the CUDA driver sees into one trace
//! file per process; this crate reads those files ([`Trace`]), replays them into live sets,
//! peaks and failures ([`replay`], [`summary`]), symbolises native stacks offline
//! ([`symbolize`]), predicts what kernels allocate (the `vramtrace-models` crate) and matches the two
//! ([`attribution`]). The `vramtrace` binary (`src/cli/`) is a thin layer over it: clap, the commands, text
//! rendering of what has no library renderer, the program launcher, progress bars and NVML.
//!
//! ```
//! use vramtrace_models::{DType, GdnShape, gdn_fla_0_6_0, peak};
//! use vramtrace::attribution::{Moment, Observed, attribute};
//!
//! // fla 0.6.0's chunk forward at T=4128, 48 heads, K=V=128, bf16 ...
//! let tensors = gdn_fla_0_6_0::tensors(&GdnShape::new(&[4128], 48, 128, 128, DType::BF16)).unwrap();
//! assert_eq!(peak(&tensors).bytes, 334_436_352);
//! // ... against what a trace showed live at the peak (here: exactly those sizes, in order).
//! let observed: Vec<Observed> = tensors
//!     .iter()
//!     .enumerate()
//!     .map(|(i, t)| Observed { size: t.bytes, t_ns: i as u64, ptr: format!("{i:#x}"),
//!                             api: "cuMemAlloc_v2", name: None, label: None, failed: false,
//!                             frames: vec![], frame_files: vec![], op: None })
//!     .collect();
//! let a = attribute(&tensors, observed, 1, Moment::Peak);
//! assert_eq!(a.attributed_bytes, 334_436_352);
//! assert_eq!(a.unexplained_bytes, 0);
//! ```
//!
//! # Design constraints
//! - **Analysis never takes a path.** Replay, summary and attribution work on a [`Trace`] in
//!   memory (or a tensor list), so every part is testable without a GPU or a file.
//! - **Buckets are never summed together.** Physical device memory, unified memory, pinned
//!   host memory, reserved address space and mappings are kept apart ([`replay::Pool`]).
//! - **Releases pair in their own namespace**: a `cuMemFree` with what `cuMemAlloc*` returned,
//!   a `cuMemRelease` with a `cuMemCreate` handle, and so on, within one process.
//! - **Models are named variants of one upstream version each**, never blends, and cite the
//!   file and line they were read from.

pub mod attribution;
pub mod calibrate;
pub mod categories;
pub mod categoriser;
pub mod cliff;
mod cu_result;
pub mod diff;
mod error;
pub mod events;
pub mod evidence;
pub mod export;
pub mod forecast;
pub mod growth;
pub mod import;
pub mod live;
pub mod names;
pub mod observe;
pub mod parse;
pub mod plots;
pub mod replay;
pub mod report;
pub mod summary;
pub mod symbolize;
pub mod timeline;
pub mod torch_replay;
pub mod trace;
pub mod whatif;

pub use error::{Error, Result, with_causes};
pub use trace::{Process, Trace};

#[cfg(test)]
mod tests;
