//! The live view's data: a [`LiveSource`] over a trace directory that processes are still
//! writing (or a finished one), plus NVML.
//!
//! # How it follows
//! - **Files.** The directory is listed again every [`LiveOptions::rescan`]; every `*.vtr` gets a
//!   [`Follower`] (version 1 and 2 files), so workers and ranks that start later are picked up.
//!   A file whose header is not complete yet is waited for; a damaged or foreign file becomes an
//!   [`Update::Notice`] and is skipped, never an error.
//! - **Replay.** Side records (strings, stacks, modules, devices) go into one [`Process`] per
//!   file; timed records of all files read in one poll are sorted by time and fed to one
//!   [`Replayer`] (the same state machine as `summary`), keyed by the file's index.
//! - **Samples.** A poll does not send one sample per event: the trace time it covered is cut
//!   into at most [`MAX_BUCKETS`] buckets of at least [`MIN_BUCKET_NS`], and each device touched
//!   in a bucket gets its highest point in the bucket (when above the bucket's end) and its end
//!   point, stacked by [`CATEGORIES`]. A live poll (100 ms of trace) gives about ten points per
//!   device; the first poll of a finished trace a few hundred.
//! - **Bounded.** One poll reads at most [`LiveOptions::poll_budget`] of wall time (the rest
//!   waits for the next poll), the followers hold one block per writing thread, the replay holds
//!   the live set, the processes their string and stack tables: nothing grows with the number of
//!   events.
//! - **Snapshots.** At the live edge (the view following) the largest allocations come from the
//!   live replay, at no cost. At an earlier cursor the directory is read again from the start up
//!   to that time with [`Trace::open`] and a fresh replay (bounded memory: one live set; time:
//!   one pass over the trace up to the cursor); the last answer is kept, so a paused view asks
//!   once.
//!
//! # Categories
//! [`category`] sorts an allocation by its range label (NVTX or annotation range) first, then by
//! its annotated name, lower-cased, by substring:
//! `weight`, `embed`, `lm_head`, `param` → weights; `kv`, `cache` (and in a label `_state`: the
//! recurrent state kept between chunks) → KV cache; `ballast`, `capacity`, `reserve` → other;
//! any other name → activations; no label and no name → unnamed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vramtrace_format::{Event, FILE_EXTENSION, Follower, Problem, Record};
use vramtrace_viewer::model::{
    BreakdownEntry, DeviceInfo, FailedAllocation, LiveAllocation, LiveSnapshot, NvmlPanel,
    NvmlProcess, ProcessInfo, SnapshotQuery, TimelinePoint, Update,
};
use vramtrace_viewer::tui::LiveSource;

use crate::replay::{FastMap, LiveAlloc, Pool, Replayer, Step};
use crate::symbolize::StackSymbolizer;
use crate::trace::{Item, MemorySource, Process, Trace};

/// The categories of the stacked timeline and the breakdown, in stacking order.
pub const CATEGORIES: [&str; 5] = ["weights", "KV cache", "activations", "other", "unnamed"];

/// Index in [`CATEGORIES`] of an allocation with this range label and annotated name (see the
/// module documentation for the rule).
pub fn category(label: Option<&str>, name: Option<&str>) -> usize {
    const WEIGHTS: &[&str] = &["weight", "embed", "lm_head", "param"];
    const KV: &[&str] = &["kv", "cache"];
    const OTHER: &[&str] = &["ballast", "capacity", "reserve"];
    let label = label.filter(|s| !s.is_empty()).map(str::to_ascii_lowercase);
    let name = name.filter(|s| !s.is_empty()).map(str::to_ascii_lowercase);
    let has = |s: &Option<String>, words: &[&str]| {
        s.as_deref()
            .is_some_and(|s| words.iter().any(|w| s.contains(w)))
    };
    for s in [&label, &name] {
        if has(s, WEIGHTS) {
            return 0;
        }
        if has(s, KV) || (std::ptr::eq(s, &label) && has(s, &["_state"])) {
            return 1;
        }
        if has(s, OTHER) {
            return 3;
        }
    }
    if label.is_some() || name.is_some() {
        2
    } else {
        4
    }
}

/// The most trace time one bucket of samples covers at least.
pub const MIN_BUCKET_NS: u64 = 10_000_000;
/// The most buckets one poll is cut into.
pub const MAX_BUCKETS: u64 = 256;

/// Settings of a [`DirSource`].
#[derive(Debug, Clone)]
pub struct LiveOptions {
    /// Largest live allocations a snapshot lists.
    pub top: usize,
    /// Ask NVML for device and per-process memory.
    pub nvml: bool,
    /// How often the directory is listed for new files.
    pub rescan: Duration,
    /// How long one poll may read before it returns what it has.
    pub poll_budget: Duration,
    /// How often NVML is asked.
    pub nvml_every: Duration,
}

impl Default for LiveOptions {
    fn default() -> Self {
        LiveOptions {
            top: 40,
            nvml: true,
            rescan: Duration::from_millis(250),
            poll_budget: Duration::from_millis(40),
            nvml_every: Duration::from_secs(1),
        }
    }
}

/// Which pairing group a driver function's identifier lives in (pointers, `cuMemCreate`
/// handles, arrays), so a release finds the bytes its allocation put in a category.
fn group(e: &Event) -> u8 {
    match e.api.name() {
        "cuMemCreate" | "cuMemRelease" => 1,
        "cuArrayCreate_v2" | "cuArray3DCreate_v2" | "cuArrayDestroy" => 2,
        _ => 0,
    }
}

/// One device-memory allocation as the category books see it.
#[derive(Clone, Copy)]
struct Booked {
    device: i32,
    category: u8,
    size: u64,
    label: u32,
}

/// The replay plus live bytes by category per process and device.
#[derive(Default)]
struct Book {
    replay: Replayer,
    seq: usize,
    booked: FastMap<(usize, u8, u64), Booked>,
    by_cat: BTreeMap<(usize, i32), [u64; 5]>,
}

impl Book {
    fn add(&mut self, pi: usize, b: Booked, sign: bool) {
        let c = &mut self.by_cat.entry((pi, b.device)).or_default()[b.category as usize];
        *c = if sign {
            c.saturating_add(b.size)
        } else {
            c.saturating_sub(b.size)
        };
    }

    fn unbook(&mut self, key: (usize, u8, u64)) {
        if let Some(old) = self.booked.remove(&key) {
            self.add(key.0, old, false);
        }
    }

    /// Applies one item of process `pi`; returns the step of an event.
    fn apply(&mut self, pi: usize, item: &Item, p: &Process) -> Option<Step> {
        match item {
            Item::Event(e) => {
                let step = self.replay.apply(pi, self.seq, e);
                self.seq += 1;
                let key = (pi, group(e), e.ptr);
                match &step {
                    Step::Allocated { pool } => {
                        self.unbook(key);
                        if *pool == Pool::Device {
                            let b = Booked {
                                device: e.device,
                                category: category(p.string(e.label), None) as u8,
                                size: e.size,
                                label: e.label,
                            };
                            self.booked.insert(key, b);
                            self.add(pi, b, true);
                        }
                    }
                    Step::Released { .. } => self.unbook(key),
                    _ => {}
                }
                Some(step)
            }
            Item::Annotate(a) => {
                if self.replay.annotate(pi, a).is_some()
                    && let Some(mut b) = self.booked.get(&(pi, 0, a.ptr)).copied()
                {
                    let c = category(p.string(b.label), p.string(a.name)) as u8;
                    if c != b.category {
                        self.add(pi, b, false);
                        b.category = c;
                        self.add(pi, b, true);
                        self.booked.insert((pi, 0, a.ptr), b);
                    }
                }
                None
            }
            _ => None,
        }
    }

    /// Live bytes by category on `device`, of one process or of all.
    fn device_cats(&self, device: i32, process: Option<usize>) -> [u64; 5] {
        let mut sum = [0u64; 5];
        for ((pi, d), v) in &self.by_cat {
            if *d == device && process.is_none_or(|p| p == *pi) {
                for (s, x) in sum.iter_mut().zip(v) {
                    *s = s.saturating_add(*x);
                }
            }
        }
        sum
    }
}

/// A traced file being followed.
struct LiveProc {
    follower: Follower,
    /// Its tables, once the header is complete.
    process: Option<Process>,
    skipped: bool,
    problems: usize,
}

/// NVML, opened once.
struct NvmlProbe {
    nvml: Result<nvml_wrapper::Nvml, String>,
    last: Option<Instant>,
}

impl NvmlProbe {
    fn new(enabled: bool) -> Self {
        let nvml = if enabled {
            nvml_wrapper::Nvml::init().map_err(|e| match e {
                nvml_wrapper::error::NvmlError::LibloadingError(_) => {
                    "libnvidia-ml.so.1 cannot be loaded (no NVIDIA driver here)".to_string()
                }
                e => e.to_string(),
            })
        } else {
            Err("not asked (--no-nvml)".into())
        };
        NvmlProbe { nvml, last: None }
    }

    fn panel(&self, ordinal: u32) -> NvmlPanel {
        let nvml = match &self.nvml {
            Ok(n) => n,
            Err(e) => return NvmlPanel::Unavailable(e.clone()),
        };
        // NVML numbers devices by PCI order, CUDA by CUDA_VISIBLE_DEVICES / speed: the same
        // index only when neither reorders. The reading is labelled with NVML's name.
        let read = || -> Result<NvmlPanel, nvml_wrapper::error::NvmlError> {
            let d = nvml.device_by_index(ordinal)?;
            let m = d.memory_info()?;
            let processes = d
                .running_compute_processes()?
                .into_iter()
                .map(|p| NvmlProcess {
                    pid: p.pid,
                    used_bytes: match p.used_gpu_memory {
                        nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => b,
                        nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => 0,
                    },
                })
                .collect();
            Ok(NvmlPanel::Available {
                used_bytes: m.used,
                total_bytes: m.total,
                processes,
            })
        };
        read().unwrap_or_else(|e| NvmlPanel::Unavailable(format!("NVML device {ordinal}: {e}")))
    }
}

/// A [`LiveSource`] over a trace directory (see the module documentation).
pub struct DirSource {
    dir: PathBuf,
    options: LiveOptions,
    files: BTreeSet<PathBuf>,
    procs: Vec<LiveProc>,
    book: Book,
    t0: Option<u64>,
    latest_ns: u64,
    last_scan: Option<Instant>,
    devices: BTreeMap<i32, (String, u64)>,
    stacked: BTreeSet<i32>,
    nvml: NvmlProbe,
    frames: HashMap<(u32, u32), Vec<String>>,
    past: Option<(SnapshotQuery, Option<LiveSnapshot>)>,
    said_waiting: bool,
    said_following: bool,
    events: u64,
}

/// At most this many problems of one file are reported as notices.
const MAX_PROBLEM_NOTICES: usize = 3;

impl DirSource {
    /// Follows `dir` (it may be empty, or not exist yet).
    pub fn new(dir: &Path, options: LiveOptions) -> DirSource {
        DirSource {
            dir: dir.to_path_buf(),
            nvml: NvmlProbe::new(options.nvml),
            options,
            files: BTreeSet::new(),
            procs: Vec::new(),
            book: Book::default(),
            t0: None,
            latest_ns: 0,
            last_scan: None,
            devices: BTreeMap::new(),
            stacked: BTreeSet::new(),
            frames: HashMap::new(),
            past: None,
            said_waiting: false,
            said_following: false,
            events: 0,
        }
    }

    /// Seconds since the trace's start of the latest event read.
    pub fn latest_s(&self) -> f64 {
        self.secs(self.latest_ns)
    }

    /// `CLOCK_MONOTONIC` ns of the latest event read (0 before any).
    pub fn latest_ns(&self) -> u64 {
        self.latest_ns
    }

    /// Time 0 of the view: the earliest start of a process seen (`CLOCK_MONOTONIC` ns).
    pub fn start_ns(&self) -> Option<u64> {
        self.t0
    }

    /// Events replayed so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Allocations live now (the size of the replay's state).
    pub fn live_len(&self) -> usize {
        self.book.replay.live_len()
    }

    fn secs(&self, t_ns: u64) -> f64 {
        t_ns.saturating_sub(self.t0.unwrap_or(t_ns)) as f64 / 1e9
    }

    fn scan(&mut self, out: &mut Vec<Update>) {
        self.last_scan = Some(Instant::now());
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            if !self.said_waiting {
                out.push(Update::Notice(format!(
                    "waiting for {} to appear",
                    self.dir.display()
                )));
                self.said_waiting = true;
            }
            return;
        };
        let mut new: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == FILE_EXTENSION))
            .filter(|p| !self.files.contains(p))
            .collect();
        new.sort();
        for path in new {
            self.files.insert(path.clone());
            let meta = std::fs::metadata(&path);
            if !meta.as_ref().is_ok_and(|m| m.is_file()) {
                out.push(Update::Notice(format!(
                    "skipped {}: not a regular file",
                    path.display()
                )));
                continue;
            }
            match Follower::open(&path) {
                Ok(follower) => self.procs.push(LiveProc {
                    follower,
                    process: None,
                    skipped: false,
                    problems: 0,
                }),
                Err(e) => out.push(Update::Notice(format!("skipped {}: {e}", path.display()))),
            }
        }
        if self.said_waiting && !self.procs.is_empty() && !self.said_following {
            self.said_following = true;
            out.push(Update::Notice(format!(
                "following {} trace file(s) in {}",
                self.procs.len(),
                self.dir.display()
            )));
        }
        if self.files.is_empty() && !self.said_waiting {
            out.push(Update::Notice(format!(
                "waiting for traces in {}",
                self.dir.display()
            )));
            self.said_waiting = true;
        }
    }

    /// Reads every file once; returns the timed items read.
    fn read_files(&mut self, out: &mut Vec<Update>) -> Vec<(u64, usize, Item)> {
        let mut batch = Vec::new();
        for pi in 0..self.procs.len() {
            let lp = &mut self.procs[pi];
            if lp.skipped {
                continue;
            }
            let (records, problems) = match lp.follower.poll() {
                Ok(r) => r,
                Err(e) => {
                    lp.skipped = true;
                    out.push(Update::Notice(format!(
                        "skipped {}: {e}",
                        lp.follower.path().display()
                    )));
                    continue;
                }
            };
            for p in problems {
                lp.problems += 1;
                if lp.problems <= MAX_PROBLEM_NOTICES {
                    out.push(Update::Notice(format!(
                        "{}: {}",
                        lp.follower.path().display(),
                        describe_problem(&p)
                    )));
                }
            }
            if lp.process.is_none() {
                let Some(h) = lp.follower.header() else {
                    continue;
                };
                let Ok(p) = Process::from_source(
                    lp.follower.path().to_path_buf(),
                    h.clone(),
                    Arc::new(MemorySource::default()),
                ) else {
                    continue;
                };
                self.t0 = Some(self.t0.map_or(h.start_mono_ns, |t| t.min(h.start_mono_ns)));
                out.push(Update::Process(ProcessInfo {
                    pid: h.pid,
                    parent: (h.ppid != 0).then_some(h.ppid),
                    command: h.cmdline.join(" "),
                }));
                lp.process = Some(p);
            }
            let process = lp.process.as_mut().expect("set above");
            for r in records {
                match r {
                    Record::String { id, text } => {
                        process.strings.insert(id, text);
                    }
                    Record::Stack { id, frames } => {
                        process.stacks.insert(id, frames);
                    }
                    Record::Module(m) => process.modules.push(m),
                    Record::Dropped { .. } => {
                        // The first drop only: the ring drops a block every 64 KiB from then on.
                        if process.dropped.is_empty() {
                            out.push(Update::Notice(format!(
                                "{}: tensor events are being dropped to keep the trace within its size budget (driver events, failures and the live tensors are kept)",
                                lp.follower.path().display()
                            )));
                        }
                        if let Record::Dropped {
                            tid,
                            from_t_ns,
                            to_t_ns,
                            ..
                        } = r
                        {
                            process.dropped.push((tid, from_t_ns, to_t_ns));
                        }
                    }
                    Record::Note { t_ns, text } => {
                        out.push(Update::Notice(format!(
                            "{}: {text}",
                            lp.follower.path().display()
                        )));
                        process.notes.push((t_ns, text));
                    }
                    Record::Driver { version } => process.driver_version = Some(version),
                    Record::Device(d) => {
                        if d.ordinal >= 0
                            && self.devices.get(&d.ordinal)
                                != Some(&(d.name.clone(), d.total_bytes))
                        {
                            self.devices
                                .insert(d.ordinal, (d.name.clone(), d.total_bytes));
                            out.push(Update::Device(DeviceInfo {
                                ordinal: d.ordinal as u32,
                                name: d.name.clone(),
                                total_bytes: d.total_bytes,
                            }));
                        }
                        match process.devices.iter_mut().find(|o| o.ordinal == d.ordinal) {
                            Some(old) => *old = d,
                            None => process.devices.push(d),
                        }
                    }
                    r => {
                        if let Some(it) = Item::from_record(r) {
                            batch.push((it.t_ns(), pi, it));
                        }
                    }
                }
            }
        }
        batch
    }

    /// Replays a batch in time order and sends bucketed samples and failures.
    fn ingest(&mut self, mut batch: Vec<(u64, usize, Item)>, out: &mut Vec<Update>) {
        batch.sort_by_key(|(t, _, _)| *t);
        let (Some(first), Some(last)) = (batch.first().map(|b| b.0), batch.last().map(|b| b.0))
        else {
            return;
        };
        let span = last - first;
        let buckets = (span / MIN_BUCKET_NS).clamp(1, MAX_BUCKETS);
        let width = (span / buckets).max(1) + 1;
        let mut bucket = 0u64;
        let mut end_t = first;
        // Per device touched in this bucket: the highest live bytes, when, and their split.
        let mut high: BTreeMap<i32, (u64, u64, [u64; 5])> = BTreeMap::new();
        for (t, pi, item) in batch {
            let b = (t - first) / width;
            if b != bucket {
                self.flush(&mut high, end_t, out);
                bucket = b;
            }
            end_t = t;
            let Some(process) = self.procs[pi].process.as_ref() else {
                continue;
            };
            let step = self.book.apply(pi, &item, process);
            let Item::Event(e) = &item else { continue };
            self.events += 1;
            match step {
                Some(Step::Allocated { pool: Pool::Device }) => {
                    let cats = self.book.device_cats(e.device, None);
                    let total: u64 = cats.iter().sum();
                    let h = high.entry(e.device).or_insert((0, t, cats));
                    if total >= h.0 {
                        *h = (total, t, cats);
                    }
                }
                Some(Step::Released { freed: Some(f) }) if f.pool == Pool::Device => {
                    high.entry(f.event.device).or_insert((0, t, [0; 5]));
                }
                Some(Step::Failed) => {
                    let device = e.device.max(0);
                    let label = process
                        .string(e.label)
                        .map(str::to_string)
                        .unwrap_or_default();
                    out.push(Update::Failure(FailedAllocation {
                        time_s: self.secs(t),
                        device: device as u32,
                        pid: process.pid(),
                        request_bytes: e.size,
                        free_bytes: (e.total_bytes != 0).then_some(e.free_bytes),
                        label,
                        error: crate::cu_result::name(e.result)
                            .map(str::to_string)
                            .unwrap_or_else(|| crate::cu_result::describe(e.result)),
                    }));
                    high.entry(device).or_insert((0, t, [0; 5]));
                }
                _ => {}
            }
        }
        self.flush(&mut high, end_t, out);
        self.latest_ns = self.latest_ns.max(last);
    }

    fn flush(
        &mut self,
        high: &mut BTreeMap<i32, (u64, u64, [u64; 5])>,
        end_t: u64,
        out: &mut Vec<Update>,
    ) {
        for (device, (max, max_t, max_cats)) in std::mem::take(high) {
            if device < 0 {
                continue;
            }
            if self.stacked.insert(device) {
                out.push(Update::Categories {
                    device: device as u32,
                    names: CATEGORIES.iter().map(|s| s.to_string()).collect(),
                });
                out.push(Update::Nvml {
                    device: device as u32,
                    panel: self.nvml.panel(device as u32),
                });
            }
            let cats = self.book.device_cats(device, None);
            let now: u64 = cats.iter().sum();
            let end_s = self.secs(end_t.max(self.latest_ns));
            if max > now && max_t < end_t {
                out.push(Update::Sample {
                    device: device as u32,
                    point: TimelinePoint::stacked(self.secs(max_t).min(end_s), max_cats.to_vec()),
                });
            }
            out.push(Update::Sample {
                device: device as u32,
                point: TimelinePoint::stacked(end_s, cats.to_vec()),
            });
        }
    }

    fn poll_nvml(&mut self, out: &mut Vec<Update>) {
        if self.stacked.is_empty()
            || self
                .nvml
                .last
                .is_some_and(|l| l.elapsed() < self.options.nvml_every)
        {
            return;
        }
        self.nvml.last = Some(Instant::now());
        if self.nvml.nvml.is_err() {
            return; // said once per device already
        }
        for &d in &self.stacked {
            out.push(Update::Nvml {
                device: d as u32,
                panel: self.nvml.panel(d as u32),
            });
        }
    }

    /// The snapshot at the live edge, from the live replay.
    fn live_snapshot(&mut self, query: &SnapshotQuery) -> LiveSnapshot {
        let device = query.device as i32;
        let mut wanted = Vec::new();
        for (pi, lp) in self.procs.iter().enumerate() {
            if let Some(p) = &lp.process
                && query.pid.is_none_or(|pid| pid == p.pid())
            {
                wanted.push(pi);
            }
        }
        let procs: Vec<Option<&Process>> = self.procs.iter().map(|l| l.process.as_ref()).collect();
        let mut largest: Vec<LiveAlloc> = Vec::new();
        for &pi in &wanted {
            largest.extend(
                self.book
                    .replay
                    .largest(pi, device, Pool::Device, self.options.top),
            );
        }
        let mut cats = [0u64; 5];
        for &pi in &wanted {
            for (s, x) in cats.iter_mut().zip(self.book.device_cats(device, Some(pi))) {
                *s += x;
            }
        }
        let now = self.latest_ns;
        let time_s = self.secs(now);
        build_snapshot(
            &procs,
            largest,
            cats,
            now,
            time_s,
            self.options.top,
            &mut self.frames,
        )
    }

    /// The snapshot at an earlier time: the directory read again up to it.
    fn past_snapshot(&mut self, query: &SnapshotQuery) -> Option<LiveSnapshot> {
        let trace = Trace::open(&self.dir).ok()?;
        let t0 = self.t0.unwrap_or_else(|| trace.start_ns());
        let target = t0.saturating_add((query.time_s.max(0.0) * 1e9) as u64);
        let mut book = Book::default();
        trace
            .for_each_item(|pi, it| {
                if it.t_ns() > target {
                    return ControlFlow::Break(());
                }
                book.apply(pi, &it, &trace.processes[pi]);
                ControlFlow::Continue(())
            })
            .ok()?;
        let device = query.device as i32;
        let mut largest = Vec::new();
        let mut cats = [0u64; 5];
        for (pi, p) in trace.processes.iter().enumerate() {
            if query.pid.is_some_and(|pid| pid != p.pid()) {
                continue;
            }
            largest.extend(
                book.replay
                    .largest(pi, device, Pool::Device, self.options.top),
            );
            for (s, x) in cats.iter_mut().zip(book.device_cats(device, Some(pi))) {
                *s += x;
            }
        }
        let procs: Vec<Option<&Process>> = trace.processes.iter().map(Some).collect();
        Some(build_snapshot(
            &procs,
            largest,
            cats,
            target,
            query.time_s,
            self.options.top,
            &mut self.frames,
        ))
    }
}

fn describe_problem(p: &Problem) -> String {
    format!("{p:?}")
}

/// Frames of the driver and allocators, skipped when choosing the top frame.
fn is_internal(frame: &str) -> bool {
    const INTERNAL: &[&str] = &[
        "cuMem",
        "cudaMalloc",
        "libcuda",
        "libcudart",
        "CUDACachingAllocator",
        "c10::cuda::",
    ];
    INTERNAL
        .iter()
        .any(|w| frame.starts_with(w) || frame.contains(&format!("::{w}")))
        || frame.contains("CachingAllocator")
}

fn build_snapshot(
    procs: &[Option<&Process>],
    mut largest: Vec<LiveAlloc>,
    cats: [u64; 5],
    now_ns: u64,
    time_s: f64,
    top: usize,
    frames: &mut HashMap<(u32, u32), Vec<String>>,
) -> LiveSnapshot {
    largest.sort_by(|a, b| b.size().cmp(&a.size()).then(a.seq.cmp(&b.seq)));
    largest.truncate(top);
    let mut rows = Vec::with_capacity(largest.len());
    let mut symbolizers: HashMap<usize, StackSymbolizer<'_>> = HashMap::new();
    for a in largest {
        let Some(p) = procs.get(a.process).copied().flatten() else {
            continue;
        };
        let name = match &a.annotation {
            Some(ann) => p.tensor_name(ann),
            None => p.string(a.event.label).unwrap_or("").to_string(),
        };
        let key = (p.pid(), a.event.stack);
        let stack = match frames.get(&key) {
            Some(s) => s.clone(),
            None => {
                let s: Vec<String> = symbolizers
                    .entry(a.process)
                    .or_insert_with(|| StackSymbolizer::new(p))
                    .stack(a.event.stack)
                    .iter()
                    .map(|f| f.to_string())
                    .collect();
                frames.insert(key, s.clone());
                s
            }
        };
        let top_frame = stack
            .iter()
            .find(|f| !is_internal(f))
            .or(stack.first())
            .cloned()
            .unwrap_or_default();
        rows.push(LiveAllocation {
            size_bytes: a.size(),
            name,
            driver_function: a.event.api.name().to_string(),
            age_s: now_ns.saturating_sub(a.event.t_ns) as f64 / 1e9,
            top_frame,
            stack,
        });
    }
    let breakdown = CATEGORIES
        .iter()
        .zip(cats)
        .filter(|(_, b)| *b > 0)
        .map(|(l, b)| BreakdownEntry {
            label: l.to_string(),
            bytes: b,
        })
        .collect();
    LiveSnapshot {
        time_s,
        largest: rows,
        breakdown,
    }
}

impl LiveSource for DirSource {
    fn poll(&mut self) -> Vec<Update> {
        let mut out = Vec::new();
        if self
            .last_scan
            .is_none_or(|l| l.elapsed() >= self.options.rescan)
        {
            self.scan(&mut out);
        }
        let started = Instant::now();
        loop {
            let batch = self.read_files(&mut out);
            if batch.is_empty() {
                break;
            }
            self.ingest(batch, &mut out);
            if started.elapsed() >= self.options.poll_budget {
                break;
            }
        }
        self.poll_nvml(&mut out);
        out
    }

    fn snapshot(&mut self, query: &SnapshotQuery) -> Option<LiveSnapshot> {
        if query.time_s >= self.latest_s() - 1e-9 {
            self.past = None;
            return Some(self.live_snapshot(query));
        }
        if let Some((q, s)) = &self.past
            && q == query
        {
            return s.clone();
        }
        let s = self.past_snapshot(query);
        self.past = Some((*query, s.clone()));
        s
    }
}

/// Reads a finished trace directory to its end and returns every update, as the live view
/// would receive them (the plots' timeline is built from them). NVML is not asked.
pub fn read_all(dir: &Path) -> Vec<Update> {
    let mut source = DirSource::new(
        dir,
        LiveOptions {
            nvml: false,
            poll_budget: Duration::from_secs(3600),
            ..LiveOptions::default()
        },
    );
    let mut all = Vec::new();
    loop {
        let u = source.poll();
        let samples = u.iter().any(|u| matches!(u, Update::Sample { .. }));
        all.extend(u);
        if !samples {
            break;
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_follow_the_documented_rule() {
        let c = |l: Option<&str>, n: Option<&str>| CATEGORIES[category(l, n)];
        assert_eq!(
            c(Some("prefill/weights"), Some("layer.0.weights")),
            "weights"
        );
        assert_eq!(c(None, Some("embed_tokens")), "weights");
        assert_eq!(c(Some("prefill/kv_cache"), None), "KV cache");
        assert_eq!(
            c(Some("prefill/gdn_state"), Some("layer.3.ssm_state")),
            "KV cache"
        );
        assert_eq!(
            c(Some("prefill/capacity"), Some("capacity ballast")),
            "other"
        );
        assert_eq!(
            c(
                Some("prefill/chunk.0/layer.3/gdn/inputs"),
                Some("initial_state")
            ),
            "activations"
        );
        assert_eq!(c(Some("forward"), None), "activations");
        assert_eq!(c(None, None), "unnamed");
        assert_eq!(c(Some(""), Some("")), "unnamed");
    }

    #[test]
    fn internal_frames_are_skipped() {
        assert!(is_internal("cuMemAlloc_v2 (mod.rs:13294)"));
        assert!(is_internal(
            "c10::cuda::CUDACachingAllocator::Native::malloc"
        ));
        assert!(!is_internal("body (prefill.rs:731)"));
    }
}
