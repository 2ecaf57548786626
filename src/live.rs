//! The live view's data: a [`LiveSource`] over a trace directory that processes are still
//! writing (or a finished one), plus a device memory reader ([`DeviceMemory`]; the binary's
//! reads NVML).
//!
//! # How it follows
//! - **Files.** The directory is listed again every [`LiveOptions::rescan`]; every `*.vtr` gets a
//!   [`Follower`] (version 1 and 2 files), so workers and ranks that start later are picked up.
//!   A file whose header is not complete yet is waited for; a damaged or foreign file becomes an
//!   [`Update::Notice`] and is skipped, never an error.
//! - **Replay.** Side records (strings, stacks, modules, devices) go into one [`Process`] per
//!   file; timed records of all files read in one poll are sorted by time and fed to one
//!   [`TimelineFold`] (the same replay state machine as `summary`, and the same fold as the
//!   timeline plot), keyed by the file's index.
//! - **Samples.** A poll does not send one sample per event: the trace time it covered is cut
//!   into at most [`crate::timeline::MAX_BUCKETS`] buckets (see [`crate::timeline`]). A live
//!   poll (100 ms of trace) gives about ten points per device; the first poll of a finished
//!   trace a few hundred.
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
//! Allocations are stacked by [`crate::categories`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vramtrace_format::{FILE_EXTENSION, Follower, Problem, Record};
use vramtrace_view_model::{
    BreakdownEntry, DeviceInfo, GrowthPanel, GrowthRow, LineGroup, LiveAllocation, LiveSnapshot,
    LiveSource, NvmlPanel, ProcessInfo, SnapshotQuery, Update,
};

use crate::attribution::Observed;
use crate::categories::{CATEGORIES, N};
use crate::forecast::LiveModel;
use crate::replay::{LiveAlloc, Pool};
use crate::symbolize::StackSymbolizer;
use crate::timeline::{Book, TimelineFold};
use crate::trace::{Item, MemorySource, Process, Trace};

/// Settings of a [`DirSource`].
#[derive(Debug, Clone)]
pub struct LiveOptions {
    /// Largest live allocations a snapshot lists.
    pub top: usize,
    /// Ask for device and per-process memory (NVML, through the reader given with
    /// [`DirSource::with_device_memory`]).
    pub nvml: bool,
    /// How often the directory is listed for new files.
    pub rescan: Duration,
    /// How long one poll may read before it returns what it has.
    pub poll_budget: Duration,
    /// How often the device memory reader is asked.
    pub nvml_every: Duration,
    /// How long a file must stand still before its process is looked for (and, gone, said to
    /// have exited).
    pub exit_quiet: Duration,
}

impl Default for LiveOptions {
    fn default() -> Self {
        LiveOptions {
            top: 40,
            nvml: true,
            rescan: Duration::from_millis(250),
            poll_budget: Duration::from_millis(40),
            nvml_every: Duration::from_secs(1),
            exit_quiet: EXIT_QUIET,
        }
    }
}

/// A traced file being followed.
struct LiveProc {
    follower: Follower,
    /// Its tables, once the header is complete.
    process: Option<Process>,
    skipped: bool,
    problems: usize,
    /// When records were last read from it.
    grew: Instant,
    /// Said to have exited.
    exited: bool,
    /// Its last read found nothing new (the reader is at its end).
    caught_up: bool,
}

/// How long a file must stand still before its process is looked for.
const EXIT_QUIET: Duration = Duration::from_secs(1);

/// Whether the process that writes a trace with this header still runs: on this host, a
/// process with its pid whose command starts as the header's; a trace from another host is
/// not followed live, and is taken as finished.
fn still_runs(h: &vramtrace_format::Header) -> bool {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    if !h.hostname.is_empty() && host.trim() != h.hostname {
        return false;
    }
    let Ok(cmdline) = std::fs::read(format!("/proc/{}/cmdline", h.pid)) else {
        return false;
    };
    let first = cmdline.split(|&b| b == 0).next().unwrap_or_default();
    h.cmdline
        .first()
        .is_none_or(|c| c.as_bytes() == first || first.ends_with(c.as_bytes()))
}

/// Reads a device's memory as the driver sees it, for the live view's panel: the binary gives
/// one over NVML; without one the panel says why it is empty.
pub trait DeviceMemory: Send {
    /// The panel of the device with this (NVML) ordinal; a failed reading is
    /// [`NvmlPanel::Unavailable`] with the reason.
    fn panel(&self, ordinal: u32) -> NvmlPanel;
}

/// The device memory reader, opened once, and when it was last asked.
struct NvmlProbe {
    reader: Result<Box<dyn DeviceMemory>, String>,
    last: Option<Instant>,
}

impl NvmlProbe {
    fn new(enabled: bool) -> Self {
        let reader = if enabled {
            Err("no device memory reader was given to the live source".to_string())
        } else {
            Err("not asked (--no-nvml)".into())
        };
        NvmlProbe { reader, last: None }
    }

    fn panel(&self, ordinal: u32) -> NvmlPanel {
        match &self.reader {
            Ok(r) => r.panel(ordinal),
            Err(e) => NvmlPanel::Unavailable(e.clone()),
        }
    }
}

/// A [`LiveSource`] over a trace directory (see the module documentation).
pub struct DirSource {
    dir: PathBuf,
    options: LiveOptions,
    files: BTreeSet<PathBuf>,
    procs: Vec<LiveProc>,
    timeline: TimelineFold,
    last_scan: Option<Instant>,
    devices: BTreeMap<i32, (String, u64)>,
    nvml: NvmlProbe,
    frames: HashMap<(u32, u32), (Vec<String>, String)>,
    past: Option<(SnapshotQuery, Option<LiveSnapshot>)>,
    said_waiting: bool,
    said_following: bool,
    model: Option<LiveModel>,
    log: Option<PollLog>,
    /// The growth table as last computed, and the trace time it was computed at: recomputed at
    /// most once per [`GROWTH_EVERY_NS`] of trace time.
    growth: Option<(u64, Option<GrowthPanel>)>,
}

/// How much trace time passes between two computations of the growth table (each is a pass
/// over the growth fold's buckets, not over the trace).
const GROWTH_EVERY_NS: u64 = 1_000_000_000;

/// A line per read of the followed files, when `VRAMTRACE_LIVE_LOG` names a file: the wall time
/// since the view started, the timed items read, the milliseconds spent reading and then
/// replaying them, and the trace time reached. It shows whether a view that falls behind is
/// waiting for records or busy replaying them.
struct PollLog {
    file: std::fs::File,
    started: Instant,
}

impl PollLog {
    fn from_env() -> Option<PollLog> {
        let path = std::env::var_os("VRAMTRACE_LIVE_LOG")?;
        std::fs::File::create(path).ok().map(PollLog::to)
    }

    fn to(file: std::fs::File) -> PollLog {
        PollLog {
            file,
            started: Instant::now(),
        }
    }

    fn poll(&mut self, items: usize, read: Duration, total: Duration, latest_s: f64) {
        use std::io::Write;
        let _ = writeln!(
            self.file,
            "{:.3} items {items} read_ms {:.1} replay_ms {:.1} trace_s {latest_s:.3}",
            self.started.elapsed().as_secs_f64(),
            read.as_secs_f64() * 1e3,
            (total - read).as_secs_f64() * 1e3,
        );
    }

    fn snapshot(&mut self, took: Duration, at_s: f64) {
        use std::io::Write;
        let _ = writeln!(
            self.file,
            "{:.3} snapshot_ms {:.1} at_s {at_s:.3}",
            self.started.elapsed().as_secs_f64(),
            took.as_secs_f64() * 1e3,
        );
    }
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
            timeline: TimelineFold::new().with_growth(),
            last_scan: None,
            devices: BTreeMap::new(),
            frames: HashMap::new(),
            past: None,
            said_waiting: false,
            said_following: false,
            model: None,
            log: PollLog::from_env(),
            growth: None,
        }
    }

    /// Logs each read of the files and each snapshot into `file`, as `VRAMTRACE_LIVE_LOG`
    /// does (see [`DirSource`]'s field `log`).
    pub fn with_poll_log(mut self, file: std::fs::File) -> Self {
        self.log = Some(PollLog::to(file));
        self
    }

    /// Shows `model` beside the observed bytes in every snapshot, with the live forecast.
    pub fn with_model(mut self, model: LiveModel) -> Self {
        self.model = Some(model);
        self
    }

    /// Reads device memory with `reader` (or says why there is none), when
    /// [`LiveOptions::nvml`] asks for it; without this call the panel says no reader was given.
    pub fn with_device_memory(mut self, reader: Result<Box<dyn DeviceMemory>, String>) -> Self {
        if self.options.nvml {
            self.nvml.reader = reader;
        }
        self
    }

    /// Seconds since the trace's start of the latest event read.
    pub fn latest_s(&self) -> f64 {
        self.timeline.secs(self.timeline.latest_ns())
    }

    /// `CLOCK_MONOTONIC` ns of the latest event read (0 before any).
    pub fn latest_ns(&self) -> u64 {
        self.timeline.latest_ns()
    }

    /// Time 0 of the view: the earliest start of a process seen (`CLOCK_MONOTONIC` ns).
    pub fn start_ns(&self) -> Option<u64> {
        self.timeline.start_ns()
    }

    /// Events replayed so far.
    pub fn events(&self) -> u64 {
        self.timeline.events()
    }

    /// Allocations live now (the size of the replay's state).
    pub fn live_len(&self) -> usize {
        self.timeline.live_len()
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
                    grew: Instant::now(),
                    exited: false,
                    caught_up: false,
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
        for lp in &mut self.procs {
            if lp.exited
                || lp.skipped
                || !lp.caught_up
                || lp.grew.elapsed() < self.options.exit_quiet
            {
                continue;
            }
            if let Some(h) = lp.follower.header()
                && lp.process.is_some()
                && !still_runs(h)
            {
                lp.exited = true;
                out.push(Update::Exited { pid: h.pid });
            }
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
            lp.caught_up = records.is_empty();
            if !records.is_empty() {
                lp.grew = Instant::now();
            }
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
                self.timeline.start_at(h.start_mono_ns);
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
                    Record::PyStack { stack, frames } => {
                        process.py_stacks.insert(stack, frames);
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

    /// Replays a batch in time order and sends bucketed samples and failures; a device seen for
    /// the first time also gets its NVML panel, right after its categories.
    fn ingest(&mut self, batch: Vec<(u64, usize, Item)>, out: &mut Vec<Update>) {
        let from = out.len();
        let procs = &self.procs;
        self.timeline
            .ingest(batch, |pi| procs[pi].process.as_ref(), out);
        if !out[from..]
            .iter()
            .any(|u| matches!(u, Update::Categories { .. }))
        {
            return;
        }
        let tail = out.split_off(from);
        for u in tail {
            let new_device = match &u {
                Update::Categories { device, .. } => Some(*device),
                _ => None,
            };
            out.push(u);
            if let Some(device) = new_device {
                out.push(Update::Nvml {
                    device,
                    panel: self.nvml.panel(device),
                });
            }
        }
    }

    fn poll_nvml(&mut self, out: &mut Vec<Update>) {
        if self.timeline.devices().next().is_none()
            || self
                .nvml
                .last
                .is_some_and(|l| l.elapsed() < self.options.nvml_every)
        {
            return;
        }
        self.nvml.last = Some(Instant::now());
        if self.nvml.reader.is_err() {
            return; // said once per device already
        }
        for d in self.timeline.devices() {
            out.push(Update::Nvml {
                device: d as u32,
                panel: self.nvml.panel(d as u32),
            });
        }
    }

    /// The snapshot at the live edge, from the live replay.
    fn live_snapshot(&mut self, query: &SnapshotQuery) -> LiveSnapshot {
        let device = query.device as i32;
        let wanted: Vec<usize> = self
            .procs
            .iter()
            .enumerate()
            .filter(|(_, lp)| {
                lp.process
                    .as_ref()
                    .is_some_and(|p| query.pid.is_none_or(|pid| pid == p.pid()))
            })
            .map(|(pi, _)| pi)
            .collect();
        let procs: Vec<Option<&Process>> = self.procs.iter().map(|l| l.process.as_ref()).collect();
        let now = self.timeline.latest_ns();
        let time_s = self.timeline.secs(now);
        let traced: Vec<(u32, u64)> = self
            .procs
            .iter()
            .enumerate()
            .filter_map(|(pi, lp)| {
                let p = lp.process.as_ref()?;
                let live = self
                    .timeline
                    .book
                    .replay
                    .level(pi, device, Pool::Device)
                    .live;
                Some((p.pid(), live))
            })
            .collect();
        let panel = self.nvml.panel(query.device);
        let mut snap = build_snapshot(
            &self.timeline.book,
            &procs,
            &wanted,
            device,
            now,
            time_s,
            self.options.top,
            &mut self.frames,
        );
        if let NvmlPanel::Available { processes, .. } = panel {
            add_untraced(&mut snap.breakdown, &processes, &traced, query.pid);
        }
        let total = self.devices.get(&device).map(|d| d.1);
        if let Some(m) = &mut self.model {
            let book = &self.timeline.book;
            let key = live_key(true, book, procs.len(), &wanted, device);
            let enforced = book.torch_limit(&wanted, device);
            snap.model = Some(m.at(&snap.breakdown, total, enforced, key, || {
                live_observed(book, &procs, &wanted, device)
            }));
        }
        snap.growth = self.growth_panel(now);
        snap
    }

    /// The growth table at trace time `now` (every process, every device), recomputed when
    /// [`GROWTH_EVERY_NS`] passed; `None` until every file's process is read.
    fn growth_panel(&mut self, now: u64) -> Option<GrowthPanel> {
        if let Some((at, panel)) = &self.growth
            && now < at.saturating_add(GROWTH_EVERY_NS)
        {
            return panel.clone();
        }
        let processes: Option<Vec<&Process>> =
            self.procs.iter().map(|l| l.process.as_ref()).collect();
        let processes = processes?;
        let mut symbolizers: HashMap<usize, StackSymbolizer<'_>> = HashMap::new();
        let g = self.timeline.growth(&processes, &mut |pi, stack| {
            symbolizers
                .entry(pi)
                .or_insert_with(|| StackSymbolizer::new(processes[pi]))
                .stack(stack)
                .iter()
                .map(|f| f.to_string())
                .collect()
        });
        let panel = g.map(|g| GrowthPanel {
            verdict: g.verdict.key().to_string(),
            headline: g.headline(),
            lines: g
                .lines
                .iter()
                .map(|l| GrowthRow {
                    place: l.place.clone(),
                    bytes_per_hour: l.bytes_per_hour,
                    uncertainty_bytes_per_hour: l.uncertainty_bytes_per_hour,
                    live_bytes: l.live_bytes,
                    verdict: l.verdict.key().to_string(),
                })
                .collect(),
        });
        self.growth = Some((now, panel.clone()));
        panel
    }

    /// The snapshot at an earlier time: the directory read again up to it.
    fn past_snapshot(&mut self, query: &SnapshotQuery) -> Option<LiveSnapshot> {
        let trace = Trace::open(&self.dir).ok()?;
        let t0 = self.timeline.start_ns().unwrap_or_else(|| trace.start_ns());
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
        let wanted: Vec<usize> = (0..trace.processes.len())
            .filter(|&pi| query.pid.is_none_or(|pid| pid == trace.processes[pi].pid()))
            .collect();
        let procs: Vec<Option<&Process>> = trace.processes.iter().map(Some).collect();
        let mut snap = build_snapshot(
            &book,
            &procs,
            &wanted,
            device,
            target,
            query.time_s,
            self.options.top,
            &mut self.frames,
        );
        let total = self.devices.get(&device).map(|d| d.1);
        if let Some(m) = &mut self.model {
            let key = live_key(false, &book, procs.len(), &wanted, device);
            let enforced = book.torch_limit(&wanted, device);
            snap.model = Some(m.at(&snap.breakdown, total, enforced, key, || {
                live_observed(&book, &procs, &wanted, device)
            }));
        }
        Some(snap)
    }
}

/// A key for the live set of `wanted` on `device` in `book`: it changes when the set may have
/// (the book replays one more record; another device or process is asked for; the live edge's
/// book or one read again up to an earlier time; a process file more).
fn live_key(edge: bool, book: &Book, processes: usize, wanted: &[usize], device: i32) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (edge, book.replayed(), processes, wanted, device).hash(&mut h);
    h.finish()
}

/// The live allocations of `wanted` on `device` as `compare` observes them, in time order: a
/// process's tensors where it recorded them, else its driver allocations. Names given through
/// the annotation ABI are not read here (the book keeps none), so matches rest on frames,
/// order and size.
fn live_observed(
    book: &Book,
    procs: &[Option<&Process>],
    wanted: &[usize],
    device: i32,
) -> Vec<Observed> {
    let mut out: Vec<(u64, usize, Observed)> = Vec::new();
    for &pi in wanted {
        let Some(p) = procs.get(pi).copied().flatten() else {
            continue;
        };
        if book.has_tensors(pi, device) {
            // Many tensors share a stack: its frames are read once.
            let mut frames: HashMap<u32, (Vec<String>, Vec<String>)> = HashMap::new();
            for t in book.tensors.live_set(pi, device) {
                let (f, files) = frames
                    .entry(t.event.stack)
                    .or_insert_with(|| crate::observe::python_frames(p, t.event.stack))
                    .clone();
                let o = crate::observe::live_tensor(p, &t.event, None, f, files);
                out.push((t.event.t_ns, t.seq, o));
            }
        } else {
            for a in book.replay.largest(pi, device, Pool::Device, usize::MAX) {
                out.push((a.event.t_ns, a.seq, crate::observe::observed_alloc(p, &a)));
            }
        }
    }
    out.sort_by_key(|(t, seq, _)| (*t, *seq));
    out.into_iter().map(|(_, _, o)| o).collect()
}

fn describe_problem(p: &Problem) -> String {
    format!("{p:?}")
}

/// The frame shown for an allocation: its innermost Python line that is neither the probe's
/// nor PyTorch's machinery (the line the categoriser groups an unnamed allocation by); without
/// one, the innermost native frame that is not the driver's or an allocator's.
fn top_frame(fs: &[crate::symbolize::Frame], shown: &[String]) -> String {
    let python: Vec<crate::categoriser::PyFrame<'_>> = fs
        .iter()
        .filter(|f| f.is_python())
        .map(|f| crate::categoriser::PyFrame {
            file: f.file.as_deref().unwrap_or("?"),
            function: f.function.as_deref().unwrap_or("?"),
            line: f.line.unwrap_or(0),
        })
        .collect();
    if !python.is_empty() {
        return crate::categoriser::site_of(&python, &[]);
    }
    shown
        .iter()
        .find(|f| !is_internal(f))
        .or(shown.first())
        .cloned()
        .unwrap_or_default()
}

/// Adds to a live breakdown what NVML sees beyond the trace: for a traced process, NVML's
/// figure minus its traced bytes (its context and loaded modules), for any other process its
/// whole figure; only `pid`'s when the view is about one process.
fn add_untraced(
    breakdown: &mut Vec<BreakdownEntry>,
    nvml: &[vramtrace_view_model::NvmlProcess],
    traced: &[(u32, u64)],
    pid: Option<u32>,
) {
    use crate::categoriser::Category;
    let (mut context, mut others) = (0u64, 0u64);
    for n in nvml {
        if pid.is_some_and(|p| p != n.pid) {
            continue;
        }
        match traced.iter().find(|(p, _)| *p == n.pid) {
            Some((_, t)) => context += n.used_bytes.saturating_sub(*t),
            None => others += n.used_bytes,
        }
    }
    for (c, b) in [
        (Category::Context, context),
        (Category::OtherProcess, others),
    ] {
        if b == 0 {
            continue;
        }
        let label = format!("{} (NVML)", c.title());
        match breakdown.iter_mut().find(|e| e.label == label) {
            Some(e) => e.bytes += b,
            None => breakdown.push(BreakdownEntry { label, bytes: b }),
        }
    }
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
        "at::detail::empty",
        "at::empty",
        "at::native::empty",
    ];
    INTERNAL
        .iter()
        .any(|w| frame.starts_with(w) || frame.contains(&format!("::{w}")))
        || frame.contains("CachingAllocator")
}

/// One row of the largest-live table before it is shown: a tensor or a driver allocation.
enum Row {
    Tensor(usize, vramtrace_format::TensorEvent),
    Driver(LiveAlloc),
}

impl Row {
    fn size(&self) -> u64 {
        match self {
            Row::Tensor(_, t) => t.size,
            Row::Driver(a) => a.size(),
        }
    }
}

/// The snapshot of `wanted` processes on `device` from a replay `book`: for a process with
/// tensor records its live tensors (their operator and shape, their Python line) and its driver
/// allocations that are not PyTorch's segments (whose free bytes are the reserve band); for
/// any other process its driver allocations. The live tensors are also grouped by Python line.
#[allow(clippy::too_many_arguments)]
fn build_snapshot(
    book: &Book,
    procs: &[Option<&Process>],
    wanted: &[usize],
    device: i32,
    now_ns: u64,
    time_s: f64,
    top: usize,
    frames: &mut HashMap<(u32, u32), (Vec<String>, String)>,
) -> LiveSnapshot {
    let mut rows: Vec<Row> = Vec::new();
    let mut lines: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    let mut cats = [0u64; N];
    for &pi in wanted {
        let Some(p) = procs.get(pi).copied().flatten() else {
            continue;
        };
        for (s, x) in cats.iter_mut().zip(book.device_cats(device, Some(pi))) {
            *s += x;
        }
        let tensors = book.has_tensors(pi, device);
        // Every live driver allocation of a process without tensors is a candidate; with
        // tensors, only those that are not segments (few: the context's, NCCL's).
        // (Without tensors only the `top` largest are sorted: the live set may be large.)
        let driver = book.replay.largest(
            pi,
            device,
            Pool::Device,
            if tensors { usize::MAX } else { top },
        );
        rows.extend(
            driver
                .into_iter()
                .filter(|a| !tensors || !book.is_segment(pi, a.event.stack, a.event.label))
                .take(top)
                .map(Row::Driver),
        );
        if tensors {
            // Many tensors share a stack: its line is read once.
            let mut line_of: HashMap<u32, String> = HashMap::new();
            for t in book.tensors.live_set(pi, device) {
                let line = line_of
                    .entry(t.event.stack)
                    .or_insert_with(|| {
                        crate::torch_replay::python_locations(p, t.event.stack)
                            .first()
                            .map(|l| l.to_string())
                            .unwrap_or_else(|| "no Python frame".to_string())
                    })
                    .clone();
                let g = lines.entry(line).or_default();
                g.0 += 1;
                g.1 += t.event.size;
                rows.push(Row::Tensor(pi, t.event));
            }
        }
    }
    rows.sort_by_key(|r| std::cmp::Reverse(r.size()));
    rows.truncate(top);
    let mut shown = Vec::with_capacity(rows.len());
    let mut symbolizers: HashMap<usize, StackSymbolizer<'_>> = HashMap::new();
    for r in rows {
        match r {
            Row::Tensor(pi, t) => {
                let Some(p) = procs.get(pi).copied().flatten() else {
                    continue;
                };
                let locations = crate::torch_replay::python_locations(p, t.stack);
                let category = book
                    .tensor_category(pi, t.stack)
                    .map(|c| c.title())
                    .unwrap_or("unnamed");
                shown.push(LiveAllocation {
                    size_bytes: t.size,
                    name: crate::torch_replay::describe(p, &t).unwrap_or_default(),
                    driver_function: format!("tensor, {category}"),
                    age_s: now_ns.saturating_sub(t.t_ns) as f64 / 1e9,
                    top_frame: locations.first().map(|l| l.to_string()).unwrap_or_default(),
                    stack: locations.iter().map(|l| l.to_string()).collect(),
                });
            }
            Row::Driver(a) => {
                let Some(p) = procs.get(a.process).copied().flatten() else {
                    continue;
                };
                let name = match &a.annotation {
                    Some(ann) => p.tensor_name(ann),
                    None => p.string(a.event.label).unwrap_or("").to_string(),
                };
                let key = (p.pid(), a.event.stack);
                let (stack, top_frame) = match frames.get(&key) {
                    Some(s) => s.clone(),
                    None => {
                        let fs = symbolizers
                            .entry(a.process)
                            .or_insert_with(|| StackSymbolizer::new(p))
                            .stack(a.event.stack);
                        let s: Vec<String> = fs.iter().map(|f| f.to_string()).collect();
                        let top = top_frame(&fs, &s);
                        frames.insert(key, (s.clone(), top.clone()));
                        (s, top)
                    }
                };
                shown.push(LiveAllocation {
                    size_bytes: a.size(),
                    name,
                    driver_function: a.event.api.name().to_string(),
                    age_s: now_ns.saturating_sub(a.event.t_ns) as f64 / 1e9,
                    top_frame,
                    stack,
                });
            }
        }
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
    let mut by_line: Vec<LineGroup> = lines
        .into_iter()
        .map(|(line, (count, bytes))| LineGroup { line, count, bytes })
        .collect();
    by_line.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.line.cmp(&b.line)));
    by_line.truncate(top);
    LiveSnapshot {
        time_s,
        largest: shown,
        breakdown,
        by_line,
        model: None,
        growth: None,
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
            let this = Instant::now();
            let batch = self.read_files(&mut out);
            if batch.is_empty() {
                break;
            }
            let (items, read) = (batch.len(), this.elapsed());
            self.ingest(batch, &mut out);
            if let Some(log) = &mut self.log {
                let latest_s = self.timeline.secs(self.timeline.latest_ns());
                log.poll(items, read, this.elapsed(), latest_s);
            }
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
            let started = Instant::now();
            let s = self.live_snapshot(query);
            if let Some(log) = &mut self.log {
                log.snapshot(started.elapsed(), query.time_s);
            }
            return Some(s);
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
    fn nvml_adds_context_and_other_processes() {
        use vramtrace_view_model::NvmlProcess;
        let nvml = [
            NvmlProcess {
                pid: 7,
                used_bytes: 1000,
            },
            NvmlProcess {
                pid: 9,
                used_bytes: 300,
            },
        ];
        let mut b = vec![BreakdownEntry {
            label: "weights".into(),
            bytes: 600,
        }];
        add_untraced(&mut b, &nvml, &[(7, 600)], None);
        let got: Vec<(&str, u64)> = b.iter().map(|e| (e.label.as_str(), e.bytes)).collect();
        assert_eq!(
            got,
            [
                ("weights", 600),
                ("context and modules (NVML)", 400),
                ("other processes (NVML)", 300)
            ]
        );
        let mut one = Vec::new();
        add_untraced(&mut one, &nvml, &[(7, 600)], Some(7));
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].bytes, 400);
    }

    #[test]
    fn the_top_frame_is_the_python_line() {
        use crate::symbolize::{Frame, PYTHON_MODULE};
        let py = |file: &str, function: &str, line: u32| Frame {
            addr: String::new(),
            module: PYTHON_MODULE.into(),
            function: Some(function.into()),
            file: Some(file.into()),
            line: Some(line),
        };
        let fs = vec![
            py(
                "/opt/torch/.venv/lib/python3.12/site-packages/torch/_ops.py",
                "__call__",
                841,
            ),
            py(
                "/opt/torch/.venv/lib/python3.12/site-packages/transformers/generation/continuous_batching/cache.py",
                "__init__",
                251,
            ),
            Frame {
                addr: "0x1".into(),
                module: "libtorch_cpu.so".into(),
                function: Some("at::detail::empty_generic".into()),
                file: None,
                line: None,
            },
        ];
        let shown: Vec<String> = fs.iter().map(|f| f.to_string()).collect();
        assert_eq!(top_frame(&fs, &shown), "cache.py:251 __init__");
        assert_eq!(
            top_frame(&fs[2..], &shown[2..]),
            "at::detail::empty_generic [libtorch_cpu.so]"
        );
    }

    #[test]
    fn internal_frames_are_skipped() {
        assert!(is_internal("cuMemAlloc_v2 (mod.rs:13294)"));
        assert!(is_internal(
            "c10::cuda::CUDACachingAllocator::Native::malloc"
        ));
        assert!(!is_internal("body (prefill.rs:731)"));
        // The H200's transformers serve: PyTorch's empty tensor factory is not the top frame.
        assert!(is_internal("at::detail::empty_generic [libtorch_cpu.so]"));
    }
}
