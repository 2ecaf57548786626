//! The view models: plain data the library computes from traces and NVML and the
//! viewer draws. Nothing here knows where the numbers came from.
//!
//! Sizes are bytes (`u64`), times are seconds since the trace's start (`f64`).

/// One traced process, as the header lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Process id (host pid namespace, as NVML reports it).
    pub pid: u32,
    /// Parent process id, when the trace recorded one.
    pub parent: Option<u32>,
    /// Command line, shortened by the renderer when it does not fit.
    pub command: String,
}

/// One CUDA device seen in the traces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// CUDA ordinal (the `cuda:N` index).
    pub ordinal: u32,
    /// Marketing name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Total device memory in bytes.
    pub total_bytes: u64,
}

/// Live bytes on one device at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct TimelinePoint {
    /// Seconds since the trace started.
    pub time_s: f64,
    /// Bytes live on the device (all traced processes) at `time_s`.
    pub live_bytes: u64,
    /// Optional split of `live_bytes` by category, in the order of the
    /// timeline's [`crate::Timeline::categories`]; empty when not stacked.
    pub by_category: Vec<u64>,
}

impl TimelinePoint {
    /// A point with no category split.
    pub fn new(time_s: f64, live_bytes: u64) -> Self {
        Self {
            time_s,
            live_bytes,
            by_category: Vec::new(),
        }
    }

    /// A point split by category; `live_bytes` is the sum of the parts.
    pub fn stacked(time_s: f64, by_category: Vec<u64>) -> Self {
        Self {
            time_s,
            live_bytes: by_category.iter().sum(),
            by_category,
        }
    }
}

/// The highest live-bytes moment seen so far.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Peak {
    /// When it happened, seconds since the trace started.
    pub time_s: f64,
    /// Live bytes at that moment.
    pub bytes: u64,
}

/// An allocation the driver (or an allocator) refused.
#[derive(Debug, Clone, PartialEq)]
pub struct FailedAllocation {
    /// When it happened, seconds since the trace started.
    pub time_s: f64,
    /// Device the allocation was for.
    pub device: u32,
    /// Process that asked.
    pub pid: u32,
    /// Requested size in bytes.
    pub request_bytes: u64,
    /// Free device memory reported at the failure (`cuMemGetInfo`), if known.
    pub free_bytes: Option<u64>,
    /// Name of what was being allocated: annotation, NVTX range or model tensor.
    pub label: String,
    /// Error name, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
    pub error: String,
}

/// One allocation live at the cursor's time.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveAllocation {
    /// Size in bytes.
    pub size_bytes: u64,
    /// Name: annotation, NVTX range, or matched model tensor; empty if none.
    pub name: String,
    /// Driver entry point that made it, e.g. `cuMemAlloc_v2`.
    pub driver_function: String,
    /// Seconds it had been live at the cursor's time.
    pub age_s: f64,
    /// The most useful frame (first frame outside allocator internals).
    pub top_frame: String,
    /// The full symbolised stack, innermost frame first, one frame a line.
    pub stack: Vec<String>,
}

/// Bytes of one label or category.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakdownEntry {
    /// Label or category name (`weights`, `KV cache`, `activations`, `unnamed`, ...).
    pub label: String,
    /// Live bytes under it.
    pub bytes: u64,
}

/// What was live at one time on one device: the answer to a [`SnapshotQuery`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LiveSnapshot {
    /// The time the snapshot describes.
    pub time_s: f64,
    /// The largest live allocations, largest first (the source decides how many).
    pub largest: Vec<LiveAllocation>,
    /// Live bytes by label or category.
    pub breakdown: Vec<BreakdownEntry>,
    /// The live tensors grouped by their Python line, most bytes first (empty without tensor
    /// records).
    pub by_line: Vec<LineGroup>,
    /// The whole-step model at this moment, when the view was given one (`--model`).
    pub model: Option<ModelAtCursor>,
    /// What grows over the run so far (the latest moment only; `None` in the past or before the
    /// source can tell).
    pub growth: Option<GrowthPanel>,
}

/// What grows over the run so far, as the live view's growth table shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct GrowthPanel {
    /// `leak`, `plateau` or `none`: the verdict as it stands now.
    pub verdict: String,
    /// One line: the verdict, the line it rests on, the rate of the bytes held.
    pub headline: String,
    /// The lines, fastest growing first.
    pub lines: Vec<GrowthRow>,
}

/// One allocating place in the growth table.
#[derive(Debug, Clone, PartialEq)]
pub struct GrowthRow {
    /// The Python line, else the native function.
    pub place: String,
    /// Growth rate over the steady state so far, bytes an hour.
    pub bytes_per_hour: f64,
    /// Its standard error.
    pub uncertainty_bytes_per_hour: f64,
    /// Bytes it holds now.
    pub live_bytes: u64,
    /// `leak`, `plateau` or `steady`.
    pub verdict: String,
}

/// The live tensors allocated at one Python line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineGroup {
    /// `file.py:LINE function` (the innermost frame that is the program's own).
    pub line: String,
    /// Tensors live.
    pub count: usize,
    /// Their bytes.
    pub bytes: u64,
}

/// One part of the whole-step model beside the bytes observed in its category.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelPart {
    /// The category (`weights`, `KV cache`, ...).
    pub category: String,
    /// The model's bytes for it, `None` where it is not modelled.
    pub modelled_bytes: Option<u64>,
    /// The bytes observed in the category at the cursor.
    pub observed_bytes: u64,
    /// What the modelled figure rests on (`config`, `the trace, given`, ...).
    pub rests_on: String,
}

/// The live forecast: the next prefill chunk's modelled peak at the current context against the
/// limit, and how much more context fits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forecast {
    /// The context read from the trace (the KV cache's bytes ÷ the model's K/V per token).
    pub context_tokens: u64,
    /// The model's K/V bytes per token the context was read with.
    pub kv_bytes_per_token: u64,
    /// The next chunk's tokens.
    pub chunk_tokens: u64,
    /// The modelled step's bytes counted against the limit at the next chunk.
    pub next_step_bytes: u64,
    /// The limit's bytes.
    pub limit_bytes: u64,
    /// How the limit is named after its bytes (`--capacity`, `the card`).
    pub limit_label: String,
    /// The largest context whose modelled step fits (`None`: not even the next chunk fits).
    pub largest_context: Option<u64>,
    /// Whether `largest_context` is only the search's cap (the cliff lies beyond it).
    pub capped: bool,
    /// The token slots of a KV pool the engine preallocated, read from the trace (more than
    /// one sequence can hold): the context is then not known from memory (`context_tokens` is
    /// 0) and the next chunk is its smallest step.
    pub kv_pool_tokens: Option<u64>,
    /// Whether the pool, not memory, is what stops `largest_context`.
    pub limited_by_pool: bool,
}

impl Forecast {
    /// `limit − next step`: negative when the next chunk is modelled not to fit.
    pub fn headroom_bytes(&self) -> i128 {
        i128::from(self.limit_bytes) - i128::from(self.next_step_bytes)
    }

    /// Tokens of context that still fit after the current one (0 when the next chunk does not).
    pub fn tokens_left(&self) -> u64 {
        self.largest_context
            .map_or(0, |l| l.saturating_sub(self.context_tokens))
    }
}

/// The whole-step model at the cursor: its parts beside the observed categories, and the
/// forecast when the context could be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelAtCursor {
    /// The model and serving shape, e.g. `Qwen3.5-9B (transformers), chunk 4128`.
    pub title: String,
    /// The parts, in stacking order.
    pub parts: Vec<ModelPart>,
    /// The forecast; `None` with the reason when it cannot be made.
    pub forecast: Result<Forecast, String>,
    /// The modelled step's tensors beside the live allocations they match; the reason when the
    /// step could not be modelled.
    pub tensors: Result<ModelTensors, String>,
}

/// The tensors of one layer's peak of the modelled step beside the live allocations at the
/// cursor (what `vramtrace compare` prints, at the cursor).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelTensors {
    /// Which peak and step, e.g. `gdn layer's peak, chunk 16,384 at context 16,384`.
    pub title: String,
    /// The modelled tensors live at that peak, in the model's allocation order.
    pub rows: Vec<ModelTensor>,
    /// Live allocations at the cursor that were compared (tensors where they were recorded).
    pub live_count: usize,
    /// Their bytes.
    pub live_bytes: u64,
}

impl ModelTensors {
    /// The modelled bytes of all rows.
    pub fn modelled_bytes(&self) -> u64 {
        self.rows.iter().map(|r| r.modelled_bytes).sum()
    }

    /// The modelled bytes of the rows that matched a live allocation.
    pub fn matched_modelled_bytes(&self) -> u64 {
        self.rows
            .iter()
            .filter(|r| r.observed_bytes.is_some())
            .map(|r| r.modelled_bytes)
            .sum()
    }

    /// The observed bytes of the allocations the rows matched.
    pub fn matched_observed_bytes(&self) -> u64 {
        self.rows.iter().filter_map(|r| r.observed_bytes).sum()
    }
}

/// One modelled tensor beside the live allocation it matched, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelTensor {
    /// The tensor's name in the upstream code (`o`, `h`, `softmax_lse`).
    pub name: String,
    /// The model's bytes.
    pub modelled_bytes: u64,
    /// The matched allocation's bytes; `None` when nothing live matched.
    pub observed_bytes: Option<u64>,
    /// The matched allocation's innermost Python line (or its name), or for an unmatched
    /// tensor the line the model cites.
    pub line: String,
    /// What the match rests on (`name`, `frame at its line`, `order and size`, `size only`),
    /// or why there is none (`unmatched`, `unmatched: 3 alike`, `unmatched: other code`).
    pub basis: String,
}

/// Which snapshot the view needs: the CLI answers it from its replay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SnapshotQuery {
    /// Device ordinal.
    pub device: u32,
    /// Only this process, or all processes when `None`.
    pub pid: Option<u32>,
    /// Seconds since the trace started.
    pub time_s: f64,
}

/// NVML's view of one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlProcess {
    /// Process id.
    pub pid: u32,
    /// Device memory NVML says the process uses.
    pub used_bytes: u64,
}

/// The NVML panel of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvmlPanel {
    /// NVML answered.
    Available {
        /// Device memory in use (all processes, contexts included).
        used_bytes: u64,
        /// Total device memory.
        total_bytes: u64,
        /// Per-process use, as NVML lists the running compute processes.
        processes: Vec<NvmlProcess>,
    },
    /// NVML could not be asked (no driver, no GPU, CI); the reason is shown.
    Unavailable(String),
}

/// One new piece of information from a [`crate::LiveSource`].
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// A process appeared (or its details changed; keyed by pid).
    Process(ProcessInfo),
    /// A device appeared (keyed by ordinal).
    Device(DeviceInfo),
    /// Category names for a device's stacked points.
    Categories {
        /// Device ordinal.
        device: u32,
        /// Names, in the order of [`TimelinePoint::by_category`].
        names: Vec<String>,
    },
    /// Live bytes on a device at a moment; points arrive in time order.
    Sample {
        /// Device ordinal.
        device: u32,
        /// The point.
        point: TimelinePoint,
    },
    /// A refused allocation.
    Failure(FailedAllocation),
    /// The latest NVML reading of a device.
    Nvml {
        /// Device ordinal.
        device: u32,
        /// The reading.
        panel: NvmlPanel,
    },
    /// A line for the status bar: "waiting for traces in DIR", a skipped file, ...
    Notice(String),
    /// A traced process is gone (its file stopped growing and no such process runs).
    Exited {
        /// Its pid.
        pid: u32,
    },
}

/// Observed beside predicted bytes of one tensor, for the breakdown plot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakdownRow {
    /// Tensor or label name.
    pub tensor: String,
    /// Bytes the analytical model predicts, if it names this tensor.
    pub predicted_bytes: Option<u64>,
    /// Bytes observed in the trace, if an allocation matched.
    pub observed_bytes: Option<u64>,
}

/// The breakdown plot: one row per tensor at the peak or a failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakdownPlot {
    /// Title, e.g. `at the peak (12.4 s), cuda:0`.
    pub title: String,
    /// Rows, drawn top to bottom in this order.
    pub rows: Vec<BreakdownRow>,
}

/// The cliff plot: the model's peak against prompt length.
#[derive(Debug, Clone, PartialEq)]
pub struct CliffCurve {
    /// Title, e.g. the model and configuration.
    pub title: String,
    /// `(prompt tokens, model peak bytes)`, in token order.
    pub model: Vec<(u64, u64)>,
    /// Device capacity the cliff is measured against.
    pub capacity_bytes: Option<u64>,
    /// First prompt length whose predicted peak exceeds the capacity.
    pub cliff_tokens: Option<u64>,
    /// `(prompt tokens, observed peak bytes)` from traces.
    pub observed: Vec<(u64, u64)>,
}

/// One panel of the whole-step cliff: the step's bytes counted against the limit as one shape
/// varies (the context at a fixed chunk, or the chunk at a fixed context).
#[derive(Debug, Clone, PartialEq)]
pub struct CliffPanel {
    /// What varies, for the x axis (`context tokens at a chunk of 4128`).
    pub x_desc: String,
    /// `(x, bytes counted against the limit)`, in x order.
    pub curve: Vec<(u64, u64)>,
    /// The largest x that fits (the frontier), when one does.
    pub frontier: Option<u64>,
    /// The failing step: `(x, bytes the model counts for it)`.
    pub failure: Option<(u64, u64)>,
}

/// The whole-step cliff: the context panel, then the chunk panel, against one limit.
#[derive(Debug, Clone, PartialEq)]
pub struct CliffPanels {
    /// Title: the model, the program and the limit.
    pub title: String,
    /// The enforced limit in bytes.
    pub limit_bytes: u64,
    /// How the limit is said in the legend (`PyTorch's per-process limit`).
    pub limit_label: String,
    /// What drew the curves, in the legend (`whole-step model`, `transformers' planner`).
    pub curve_label: String,
    /// How the failing step's mark is said in the legend (`the failing step`).
    pub failure_label: String,
    /// The panels, left to right.
    pub panels: Vec<CliffPanel>,
}

/// One part of the capacity bar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacityPart {
    /// Its name (`weights`, `KV cache`, `free`).
    pub label: String,
    /// Bytes.
    pub bytes: u64,
}

/// The breakdown as one stacked bar against the enforced limit, the failing request drawn past
/// what was used so that it overhangs the limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacityBar {
    /// Title: the moment and the device.
    pub title: String,
    /// The enforced limit in bytes.
    pub limit_bytes: u64,
    /// How the limit is said (`a card of 18.00 GiB`).
    pub limit_label: String,
    /// The parts in stacking order (`free` last when there is room left).
    pub parts: Vec<CapacityPart>,
    /// The refused request: its label and bytes.
    pub request: Option<CapacityPart>,
}

/// The growth plot: live bytes by category over the run, stacked, with the bytes held from the
/// driver and the steady state's fitted rate drawn over them (`vramtrace plot --kind growth`).
#[derive(Debug, Clone, PartialEq)]
pub struct GrowthPlot {
    /// Title above the plot.
    pub title: String,
    /// One line under it: the verdict and its first piece of evidence.
    pub subtitle: String,
    /// Each bucket's start, seconds since the trace began.
    pub t_s: Vec<f64>,
    /// Per category: its title, its index in the categories' stacking order (the fill), and
    /// its bytes at each bucket.
    pub categories: Vec<(String, usize, Vec<u64>)>,
    /// Bytes held from the driver at each bucket (its low-water mark).
    pub held: Vec<u64>,
    /// The steady state's fitted line: (seconds, bytes) at its start and at the end.
    pub steady: Option<((f64, f64), (f64, f64))>,
    /// The rate written beside that line.
    pub steady_label: String,
}
