//! Exports: a trace written into the formats other tools read.
//!
//! One module per format, each with one entry point that takes the [`Trace`] and where to
//! write:
//!
//! | format | entry point | opened by |
//! | --- | --- | --- |
//! | Parquet tables | [`export_parquet`] | DuckDB, pyarrow, polars, pandas, Spark, Trino |
//! | PyTorch memory snapshot | [`export_pytorch`] | `torch.cuda._memory_viz`, the memory_viz web page |
//! | Chrome trace event JSON | [`export_perfetto`] | the Perfetto UI, `chrome://tracing` |
//! | folded stacks / flamegraph SVG | [`export_flamegraph`] | any browser; `inferno`, `flamegraph.pl` |
//!
//! Every exporter streams: it folds [`Trace::items`] as they come and holds only the live set,
//! the stack table and (Parquet) one row group, never the whole trace.

use std::collections::HashMap;

use crate::trace::Trace;

pub mod flamegraph;
pub mod parquet;
pub mod perfetto;
pub mod pytorch;

pub use self::flamegraph::{FlamegraphOptions, Weight, export_flamegraph};
pub use self::parquet::{ParquetTables, export_parquet};
pub use self::perfetto::export_perfetto;
pub use self::pytorch::{SnapshotCounts, SnapshotOptions, export_pytorch};

pub use crate::error::ExportError;

/// Where an export's progress goes (the binary draws a spinner on stderr).
pub trait ProgressSink {
    /// Counts `n` more items read. Called often: it must be cheap.
    fn inc(&self, n: u64);
    /// Names the current pass and starts its count again.
    fn pass(&self, what: &str);
    /// The export is over: remove what was drawn.
    fn finish(&self);
}

/// Progress of a long export: nothing ([`Progress::hidden`]) or a [`ProgressSink`].
pub struct Progress(Option<Box<dyn ProgressSink>>);

impl Progress {
    /// No progress output (tests, library callers).
    pub fn hidden() -> Progress {
        Progress(None)
    }

    /// Progress reported to `sink`.
    pub fn to(sink: Box<dyn ProgressSink>) -> Progress {
        Progress(Some(sink))
    }

    /// Counts `n` more items read.
    pub fn inc(&self, n: u64) {
        if let Some(b) = &self.0 {
            b.inc(n);
        }
    }

    /// Names the current pass.
    pub fn pass(&self, what: &str) {
        if let Some(b) = &self.0 {
            b.pass(what);
        }
    }

    /// Ends the progress output.
    pub fn finish(&self) {
        if let Some(b) = &self.0 {
            b.finish();
        }
    }
}

/// Microseconds since the trace's start, for formats that count in µs.
pub(crate) fn rel_us(trace_start_ns: u64, t_ns: u64) -> f64 {
    t_ns.saturating_sub(trace_start_ns) as f64 / 1000.0
}

/// Whether a driver event is a segment of PyTorch's caching allocator as the exports show it:
/// an allocation of device memory by address (`cuMemAlloc*`, stream-ordered and pool
/// allocations; not a `cuMemCreate` handle, whose bytes are where it is mapped) or a mapping
/// into reserved address space (a chunk of an expandable segment).
pub(crate) fn is_segment(e: &vramtrace_format::Event) -> bool {
    use vramtrace_format::MemKind;
    match e.mem {
        MemKind::Device => !matches!(e.api.name(), "cuMemCreate" | "cuMemRelease"),
        MemKind::Mapping => true,
        _ => false,
    }
}

/// The category of a tensor or allocation with this range label and name, as the exports
/// write it: one of [`CATEGORIES`], by [`crate::categories::category`]'s rule today. With
/// [`CATEGORIES`], the one place the exports ask, so the shared categoriser can replace the
/// rule here alone.
pub fn category_of(label: Option<&str>, name: Option<&str>) -> &'static str {
    CATEGORIES[crate::categories::category(label, name).index()]
}

/// The category of a tensor or allocation made with this stack, range label and name: the
/// categoriser's reading of its Python frames and native modules as well
/// ([`crate::categoriser::categorise_stack`]), as the timeline decides when an allocation is
/// made.
pub fn category_of_stack(
    p: &crate::trace::Process,
    stack: u32,
    bytes: u64,
    label: Option<&str>,
    name: Option<&str>,
) -> &'static str {
    CATEGORIES[crate::categoriser::categorise_stack(p, stack, bytes, label, name)
        .category
        .index()]
}

/// Every category [`category_of`] gives, in the timeline's stacking order.
pub const CATEGORIES: [&str; crate::categories::N] = crate::categories::CATEGORIES;

/// The range path open on each thread (`prefill/layer.3/gdn`), as the preload labels the
/// driver events made inside it: a tensor record carries no label of its own.
#[derive(Debug, Default)]
pub(crate) struct RangePaths(HashMap<(usize, u32), Vec<String>>);

impl RangePaths {
    /// Follows a range push or pop; other items are ignored.
    pub(crate) fn follow(&mut self, trace: &Trace, pi: usize, item: &crate::trace::Item) {
        use crate::trace::Item;
        match item {
            Item::RangePush { tid, name, .. } => {
                let n = trace.processes[pi].string(*name).unwrap_or("?");
                self.0.entry((pi, *tid)).or_default().push(n.to_string());
            }
            Item::RangePop { tid, .. } => {
                if let Some(r) = self.0.get_mut(&(pi, *tid)) {
                    r.pop();
                }
            }
            _ => {}
        }
    }

    /// The label of something made now on thread `tid` of process `pi`.
    pub(crate) fn label(&self, pi: usize, tid: u32) -> Option<String> {
        self.0
            .get(&(pi, tid))
            .filter(|r| !r.is_empty())
            .map(|r| r.join("/"))
    }
}

/// Whether the trace holds any timed item at all.
pub fn has_items(trace: &Trace) -> Result<bool, ExportError> {
    Ok(trace.items()?.next().is_some())
}
