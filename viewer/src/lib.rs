//! Presentation for vramtrace: a live terminal view and plot files, drawn
//! from plain view models.
//!
//! The library reads traces, replays them and runs the analytical models, and
//! the CLI asks NVML; they turn what they found into the types of [`model`]
//! (the crate `vramtrace-view-model`, viewer/model/, which has no rendering
//! dependency, re-exported here) and hand them here. This crate draws them:
//!
//! - [`tui`]: the live view (`vramtrace live`). [`tui::run`] takes a
//!   [`tui::LiveSource`], which the library implements over a growing trace
//!   directory (src/live.rs), and runs draw → keys → tick until the user quits.
//! - [`plot`]: timeline, breakdown and cliff plots written as PNG or SVG
//!   (`vramtrace plot`), with an embedded font.
//!
//! # Design constraints
//!
//! - **Presentation only.** Nothing here reads trace files, knows the trace
//!   format or calls NVML; every input is a plain value, so every panel and
//!   plot is testable without a GPU, a trace or a terminal.
//! - **Bounded memory.** A live view may run for days: each device's
//!   [`Timeline`] keeps at most a fixed number of points (older ones are
//!   thinned, keeping the envelope), with the peak and the failures exact;
//!   the largest-live table and the breakdown are asked of the source for
//!   the cursor's time, so the view never holds more than one live set.
//! - **The terminal is always restored**: on quit, on error and on panic.
//! - **No system libraries**: the plots' font is compiled in, nothing links
//!   fontconfig or freetype.
//!
//! # Example
//!
//! ```
//! use vramtrace_viewer::model::{TimelinePoint, DeviceInfo};
//! use vramtrace_viewer::plot::TimelinePlot;
//! use vramtrace_viewer::{plot, Timeline};
//!
//! let mut timeline = Timeline::default().with_capacity_bytes(Some(24 << 30));
//! for (t, gib) in [(0.0, 2), (1.0, 12), (2.0, 21), (3.0, 9)] {
//!     timeline.push(TimelinePoint::new(t, gib << 30));
//! }
//! let device = DeviceInfo { ordinal: 0, name: "NVIDIA H200".into(), total_bytes: 140 << 30 };
//! let plot = TimelinePlot { title: "prefill".into(), devices: vec![(device, timeline)] };
//! let dir = tempfile::tempdir()?;
//! plot::plot_timeline(&plot, &dir.path().join("timeline.svg"))?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The live view is the same idea: put [`model::Update`]s in, draw `&App`.
//!
//! ```
//! use ratatui::{Terminal, backend::TestBackend};
//! use vramtrace_viewer::model::{TimelinePoint, Update};
//! use vramtrace_viewer::tui::{App, ViewOptions};
//!
//! let mut app = App::new(ViewOptions::default());
//! app.apply([Update::Sample { device: 0, point: TimelinePoint::new(0.5, 1 << 30) }]);
//! let mut terminal = Terminal::new(TestBackend::new(100, 30))?;
//! terminal.draw(|frame| frame.render_widget(&app, frame.area()))?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
pub mod plot;
pub mod tui;
mod units;

pub use error::ViewerError;
pub use units::{
    ByteUnit, format_bytes, format_count, format_seconds, format_signed_bytes, nice_ceil,
};
/// The view models, the [`Timeline`] and the [`tui::LiveSource`] trait: the crate
/// `vramtrace-view-model` (viewer/model/).
pub use vramtrace_view_model as model;
pub use vramtrace_view_model::{DEFAULT_MAX_POINTS, MAX_KEPT_FAILURES, Timeline};
