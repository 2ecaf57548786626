//! The view models of vramtrace's live view and plots: plain data the analysis library
//! (`vramtrace`) computes from traces, NVML and the analytical models, and the viewer
//! (`vramtrace-viewer`) draws.
//!
//! This crate depends on nothing but std, so the library can build its views without pulling
//! in a rendering library (ratatui, plotters); only the `vramtrace` binary and the viewer do
//! (docs/architecture.md, "Who may import whom").
//!
//! - The view models: what the live view shows ([`Update`], [`LiveSnapshot`], [`NvmlPanel`],
//!   [`ModelAtCursor`]) and what the plots draw ([`TimelinePlot`], [`BreakdownPlot`],
//!   [`CliffCurve`], [`CliffPanels`], [`CapacityBar`]).
//! - [`Timeline`]: a device's live bytes over time in bounded memory (older points thinned,
//!   keeping the envelope; the peak and the failures exact).
//! - [`LiveSource`]: what the live view is fed by (the library implements it over a growing
//!   trace directory); [`ScriptedSource`] plays prepared updates back, for tests.
//! - [`format_count`]: counts as the views write them (`12,345`).
//!
//! Sizes are bytes (`u64`), times are seconds since the trace's start (`f64`).
//!
//! # Example
//!
//! ```
//! use vramtrace_view_model::{Timeline, TimelinePoint};
//!
//! let mut timeline = Timeline::default().with_capacity_bytes(Some(24 << 30));
//! for (t, gib) in [(0.0, 2), (1.0, 12), (2.0, 21), (3.0, 9)] {
//!     timeline.push(TimelinePoint::new(t, gib << 30));
//! }
//! assert_eq!(timeline.peak().map(|p| p.bytes), Some(21 << 30));
//! assert_eq!(timeline.live_at(2.5), Some(21 << 30));
//! ```

mod model;
mod source;
mod timeline;
mod units;

pub use model::*;
pub use source::{LiveSource, ScriptedSource};
pub use timeline::{
    DEFAULT_MAX_POINTS, MAX_KEPT_FAILURES, RESERVE_CATEGORY, Timeline, TimelinePlot,
};
pub use units::format_count;
