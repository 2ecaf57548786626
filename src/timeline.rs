//! The stacked timeline: live device bytes by category over time, as one fold over timed items
//! (those of [`Trace::items`], or the batches the live view reads from growing files).
//!
//! The live view ([`crate::live::DirSource`]) feeds it each poll's batch; the timeline plot
//! ([`crate::plots::timeline`]) feeds it a whole trace at once ([`fold`]). Both get the same
//! [`Update`]s: a device's categories, then samples, and every failed allocation.
//!
//! # Samples
//! A batch does not send one sample per event: the trace time it covers is cut into at most
//! [`MAX_BUCKETS`] buckets of at least [`MIN_BUCKET_NS`], and each device touched in a bucket
//! gets its highest point in the bucket (when above the bucket's end) and its end point, stacked
//! by [`crate::categories::CATEGORIES`]. An allocation's category is decided when it is made
//! ([`crate::categoriser::categorise_stack`]: its Python frames, native modules and label; an
//! annotation naming it later decides again), once per process, stack and label. Offline
//! ([`fold`], [`TimelineFold::with_categories`]) a stack the categoriser saw live at the
//! report's moment takes its verdict there ([`crate::categoriser::stack_categories`]: lifetimes
//! included) at every time, so the plot agrees with the report's breakdown.

use std::collections::{BTreeMap, BTreeSet};

use vramtrace_format::{Event, TensorAction, TensorEvent};
use vramtrace_view_model::{DeviceInfo, FailedAllocation, TimelinePoint, Update};

use crate::categories::{CATEGORIES, N};
use crate::categoriser::{Category, StackCategories, categorise_stack};
use crate::error::Result;
use crate::replay::{FastMap, Pool, Replayer, Step};
use crate::torch_replay::{TensorReplay, TensorStep};
use crate::trace::{Item, Process, Trace};

/// The most trace time one bucket of samples covers at least.
pub const MIN_BUCKET_NS: u64 = 10_000_000;
/// The most buckets one poll is cut into.
pub const MAX_BUCKETS: u64 = 256;

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
pub(crate) struct Booked {
    device: i32,
    category: u8,
    size: u64,
    label: u32,
    stack: u32,
    /// A segment of PyTorch's caching allocator.
    segment: bool,
}

/// The replay plus live bytes by category per process and device.
#[derive(Default)]
pub(crate) struct Book {
    pub(crate) replay: Replayer,
    seq: usize,
    booked: FastMap<(usize, u8, u64), Booked>,
    by_cat: BTreeMap<(usize, i32), [u64; N]>,
    /// The category of an allocation as it is made, and whether it is a segment, by process,
    /// stack and label.
    made: FastMap<(usize, u32, u32), (u8, bool)>,
    /// The part of `by_cat` that is PyTorch's segments.
    seg_by_cat: BTreeMap<(usize, i32), [u64; N]>,
    /// The tensor-level live set.
    pub(crate) tensors: TensorReplay,
    /// Live tensor bytes by category, per process and device with tensor records.
    tensor_cats: BTreeMap<(usize, i32), [u64; N]>,
    /// Live tensors: (process, pointer) to (device, category, bytes).
    tensor_booked: FastMap<(usize, u64), (i32, u8, u64)>,
    /// The category of a tensor as it is made, by process and stack.
    tensor_made: FastMap<(usize, u32), u8>,
    /// Verdicts by process and stack that win over [`categorise_stack`] (offline: those of the
    /// report's moment).
    categories: StackCategories,
    /// PyTorch's per-process limit (`set_per_process_memory_fraction`) by process and device, as
    /// its latest refusal recorded it: the limit the allocator actually enforces there.
    torch_limits: BTreeMap<(usize, i32), u64>,
    /// What the latest tensor record did (read by the growth fold).
    pub(crate) last_tensor: Option<TensorStep>,
}

fn add_to(v: &mut u64, by: u64, sign: bool) {
    *v = if sign {
        v.saturating_add(by)
    } else {
        v.saturating_sub(by)
    };
}

impl Book {
    /// The per-process limit PyTorch's refusals recorded on `device` for the processes in
    /// `wanted` (the smallest when several say), if any refused.
    pub(crate) fn torch_limit(&self, wanted: &[usize], device: i32) -> Option<u64> {
        wanted
            .iter()
            .filter_map(|&pi| self.torch_limits.get(&(pi, device)).copied())
            .min()
    }

    fn add(&mut self, pi: usize, b: Booked, sign: bool) {
        let c = &mut self.by_cat.entry((pi, b.device)).or_default()[b.category as usize];
        add_to(c, b.size, sign);
        if b.segment {
            let c = &mut self.seg_by_cat.entry((pi, b.device)).or_default()[b.category as usize];
            add_to(c, b.size, sign);
        }
    }

    /// Applies a tensor record of process `pi`.
    fn apply_tensor(&mut self, pi: usize, seq: usize, te: &TensorEvent, p: &Process) -> TensorStep {
        if te.action == TensorAction::AllocFailed && te.limit > 0 {
            self.torch_limits.insert((pi, te.device), te.limit);
        }
        let step = self.tensors.apply(pi, seq, te);
        // A process and device with tensor records is stacked at the tensor level from its
        // first record on, a refusal included.
        self.tensor_cats.entry((pi, te.device)).or_default();
        let allocated = matches!(step, TensorStep::Allocated | TensorStep::Restated(true));
        // The driver allocation a tensor names as its segment is one, whatever its stack says
        // (an imported snapshot's or an attached process's segments have no native frames).
        if allocated
            && te.segment != 0
            && let Some(b) = self.booked.get_mut(&(pi, 0, te.segment))
            && !b.segment
        {
            b.segment = true;
            let b = *b;
            let c = &mut self.seg_by_cat.entry((pi, b.device)).or_default()[b.category as usize];
            add_to(c, b.size, true);
        }
        if (allocated || matches!(step, TensorStep::Released(_)))
            && let Some((device, cat, size)) = self.tensor_booked.remove(&(pi, te.ptr))
        {
            add_to(
                &mut self.tensor_cats.entry((pi, device)).or_default()[cat as usize],
                size,
                false,
            );
        }
        if allocated {
            let fixed = &self.categories;
            let cat = *self.tensor_made.entry((pi, te.stack)).or_insert_with(|| {
                fixed
                    .tensor(pi, te.stack)
                    .unwrap_or_else(|| categorise_stack(p, te.stack, te.size, None, None).category)
                    .index() as u8
            });
            self.tensor_booked
                .insert((pi, te.ptr), (te.device, cat, te.size));
            add_to(
                &mut self.tensor_cats.entry((pi, te.device)).or_default()[cat as usize],
                te.size,
                true,
            );
        }
        step
    }

    fn unbook(&mut self, key: (usize, u8, u64)) {
        if let Some(old) = self.booked.remove(&key) {
            self.add(key.0, old, false);
        }
    }

    /// Applies one item of process `pi`; returns the step of an event.
    pub(crate) fn apply(&mut self, pi: usize, item: &Item, p: &Process) -> Option<Step> {
        match item {
            Item::Event(e) => {
                let step = self.replay.apply(pi, self.seq, e);
                self.seq += 1;
                let key = (pi, group(e), e.ptr);
                match &step {
                    Step::Allocated { pool } => {
                        self.unbook(key);
                        if *pool == Pool::Device {
                            let fixed = &self.categories;
                            let (category, segment) =
                                *self.made.entry((pi, e.stack, e.label)).or_insert_with(|| {
                                    (
                                        fixed
                                            .allocation(pi, e.stack)
                                            .unwrap_or_else(|| {
                                                categorise_stack(
                                                    p,
                                                    e.stack,
                                                    e.size,
                                                    p.string(e.label),
                                                    None,
                                                )
                                                .category
                                            })
                                            .index() as u8,
                                        crate::categoriser::is_segment_stack(p, e.stack),
                                    )
                                });
                            let b = Booked {
                                device: e.device,
                                category,
                                size: e.size,
                                label: e.label,
                                stack: e.stack,
                                segment,
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
                // A stack with a fixed verdict keeps it (the verdict saw the name).
                if self.replay.annotate(pi, a).is_some()
                    && let Some(mut b) = self.booked.get(&(pi, 0, a.ptr)).copied()
                    && self.categories.allocation(pi, b.stack).is_none()
                {
                    let c =
                        categorise_stack(p, b.stack, b.size, p.string(b.label), p.string(a.name))
                            .category
                            .index() as u8;
                    if c != b.category {
                        self.add(pi, b, false);
                        b.category = c;
                        self.add(pi, b, true);
                        self.booked.insert((pi, 0, a.ptr), b);
                    }
                }
                None
            }
            Item::Tensor(te) => {
                let seq = self.seq;
                self.seq += 1;
                self.last_tensor = Some(self.apply_tensor(pi, seq, te, p));
                None
            }
            _ => None,
        }
    }

    /// Whether process `pi` has tensor records on `device` (its stack is at the tensor level).
    /// Driver events and tensor records replayed so far: the live sets change only with it.
    pub(crate) fn replayed(&self) -> usize {
        self.seq
    }

    pub(crate) fn has_tensors(&self, pi: usize, device: i32) -> bool {
        self.tensor_cats.contains_key(&(pi, device))
    }

    /// Whether the allocation made at `stack` with `label` by process `pi` is one of PyTorch's
    /// segments (known once one such allocation was made).
    pub(crate) fn is_segment(&self, pi: usize, stack: u32, label: u32) -> bool {
        self.made.get(&(pi, stack, label)).is_some_and(|m| m.1)
    }

    /// The category a tensor made at `stack` by process `pi` was put in.
    pub(crate) fn tensor_category(&self, pi: usize, stack: u32) -> Option<Category> {
        self.tensor_made
            .get(&(pi, stack))
            .map(|&i| Category::ALL[i as usize])
    }

    /// Live bytes by category on `device`, of one process or of all (see the module's
    /// documentation for a process with tensor records).
    pub(crate) fn device_cats(&self, device: i32, process: Option<usize>) -> [u64; N] {
        let mut sum = [0u64; N];
        let none = [0u64; N];
        let wanted = |pi: usize, d: i32| d == device && process.is_none_or(|p| p == pi);
        // Every (process, device) with driver bytes, then those with tensors only (a trace
        // whose segments were made before recording began); no allocation per call.
        let with_driver = self.by_cat.iter().filter(|((pi, d), _)| wanted(*pi, *d));
        let tensors_only = self
            .tensor_cats
            .keys()
            .filter(|(pi, d)| wanted(*pi, *d) && !self.by_cat.contains_key(&(*pi, *d)))
            .map(|k| (k, &none));
        for (key, driver) in with_driver.chain(tensors_only) {
            let Some(tensors) = self.tensor_cats.get(key) else {
                for (s, x) in sum.iter_mut().zip(driver) {
                    *s = s.saturating_add(*x);
                }
                continue;
            };
            let segments = self.seg_by_cat.get(key).unwrap_or(&none);
            for i in 0..N {
                sum[i] = sum[i]
                    .saturating_add(driver[i].saturating_sub(segments[i]))
                    .saturating_add(tensors[i]);
            }
            let reserve = segments
                .iter()
                .sum::<u64>()
                .saturating_sub(tensors.iter().sum());
            let r = &mut sum[Category::AllocatorReserve.index()];
            *r = r.saturating_add(reserve);
        }
        sum
    }
}

/// The fold: the replay and category books, the devices seen, and time 0.
#[derive(Default)]
pub struct TimelineFold {
    pub(crate) book: Book,
    /// What grows over the run, when asked for ([`TimelineFold::with_growth`]).
    pub(crate) growth: Option<crate::growth::GrowthFold>,
    growth_wanted: bool,
    stacked: BTreeSet<i32>,
    t0: Option<u64>,
    latest_ns: u64,
    events: u64,
}

impl TimelineFold {
    /// An empty fold; time 0 is set by [`TimelineFold::start_at`]. Each tensor and allocation
    /// is categorised as it is made ([`categorise_stack`]).
    pub fn new() -> TimelineFold {
        TimelineFold::default()
    }

    /// An empty fold that puts every tensor and allocation whose process and stack `categories`
    /// names in that category, at any time (offline: the categoriser's verdicts at the report's
    /// moment, [`crate::categoriser::stack_categories`]); other stacks as [`TimelineFold::new`].
    pub fn with_categories(categories: StackCategories) -> TimelineFold {
        let mut f = TimelineFold::default();
        f.book.categories = categories;
        f
    }

    /// Also follows what grows over the run ([`crate::growth`]), for the live view's growth
    /// table.
    pub fn with_growth(mut self) -> TimelineFold {
        self.growth_wanted = true;
        self
    }

    /// A process started at `t_ns` (`CLOCK_MONOTONIC`): time 0 is the earliest start seen.
    pub fn start_at(&mut self, t_ns: u64) {
        self.t0 = Some(self.t0.map_or(t_ns, |t| t.min(t_ns)));
    }

    /// Time 0: the earliest start seen (`CLOCK_MONOTONIC` ns).
    pub fn start_ns(&self) -> Option<u64> {
        self.t0
    }

    /// `CLOCK_MONOTONIC` ns of the latest item folded (0 before any).
    pub fn latest_ns(&self) -> u64 {
        self.latest_ns
    }

    /// Driver events folded so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Allocations live now (the size of the replay's state).
    pub fn live_len(&self) -> usize {
        self.book.replay.live_len()
    }

    /// The devices that have had a sample, in order.
    pub fn devices(&self) -> impl Iterator<Item = i32> + '_ {
        self.stacked.iter().copied()
    }

    /// Seconds from time 0 to `t_ns`.
    pub fn secs(&self, t_ns: u64) -> f64 {
        t_ns.saturating_sub(self.t0.unwrap_or(t_ns)) as f64 / 1e9
    }

    /// Replays a batch of timed items (time, process index, item) in time order and sends
    /// bucketed samples and failures; `process` gives the tables of a process index (an item of
    /// a process without tables yet is skipped). A device seen for the first time gets its
    /// [`Update::Categories`] before its first sample.
    pub fn ingest<'p>(
        &mut self,
        mut batch: Vec<(u64, usize, Item)>,
        process: impl Fn(usize) -> Option<&'p Process>,
        out: &mut Vec<Update>,
    ) {
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
        // Per device touched in this bucket: the highest bytes in use (live bytes less the
        // allocator's reserve: with segments cached the live bytes stand still while tensors
        // come and go), when, and their split.
        let mut high: BTreeMap<i32, (u64, u64, [u64; N])> = BTreeMap::new();
        for (t, pi, item) in batch {
            let b = (t - first) / width;
            if b != bucket {
                self.flush(&mut high, end_t, out);
                bucket = b;
            }
            end_t = t;
            let Some(process) = process(pi) else {
                continue;
            };
            let step = self.book.apply(pi, &item, process);
            if self.growth_wanted {
                self.feed_growth(pi, &item, step.as_ref(), process);
            }
            if let Item::Tensor(te) = &item {
                self.tensor_sample(t, te, process, &mut high, out);
                continue;
            }
            let Item::Event(e) = &item else { continue };
            self.events += 1;
            match step {
                Some(Step::Allocated { pool: Pool::Device }) => {
                    let cats = self.book.device_cats(e.device, None);
                    let total = in_use(&cats);
                    let h = high.entry(e.device).or_insert((0, t, cats));
                    if total >= h.0 {
                        *h = (total, t, cats);
                    }
                }
                Some(Step::Released { freed: Some(f), .. }) if f.pool == Pool::Device => {
                    high.entry(f.event.device).or_insert((0, t, [0; N]));
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
                    high.entry(device).or_insert((0, t, [0; N]));
                }
                _ => {}
            }
        }
        self.flush(&mut high, end_t, out);
        self.latest_ns = self.latest_ns.max(last);
    }

    /// Feeds the growth fold what one item did.
    fn feed_growth(&mut self, pi: usize, item: &Item, step: Option<&Step>, p: &Process) {
        let t0 = self.t0.unwrap_or(item.t_ns());
        let g = self
            .growth
            .get_or_insert_with(|| crate::growth::GrowthFold::new(t0));
        match (item, step) {
            (Item::Event(e), Some(step)) => g.driver_step(p, pi, e, step),
            (Item::Tensor(te), _) => {
                if let Some(step) = self.book.last_tensor.take() {
                    g.tensor_step(p, pi, te, &step);
                }
            }
            _ => {}
        }
    }

    /// What grows over the run so far, with `processes` by index (every one read); `None`
    /// without [`TimelineFold::with_growth`] or before anything was folded.
    pub fn growth(
        &self,
        processes: &[&Process],
        native: &mut dyn FnMut(usize, u32) -> Vec<String>,
    ) -> Option<crate::growth::Growth> {
        self.growth
            .as_ref()?
            .growth(processes, &self.book.replay, &self.book.tensors, native)
    }

    /// A tensor record moves its device's stack (inside cached segments the driver sees
    /// nothing); an allocator refusal is a failure.
    fn tensor_sample(
        &mut self,
        t: u64,
        te: &TensorEvent,
        process: &Process,
        high: &mut BTreeMap<i32, (u64, u64, [u64; N])>,
        out: &mut Vec<Update>,
    ) {
        let cats = self.book.device_cats(te.device, None);
        let total = in_use(&cats);
        let h = high.entry(te.device).or_insert((0, t, cats));
        if total >= h.0 {
            *h = (total, t, cats);
        }
        if te.action == TensorAction::AllocFailed {
            out.push(Update::Failure(FailedAllocation {
                time_s: self.secs(t),
                device: te.device.max(0) as u32,
                pid: process.pid(),
                request_bytes: te.size,
                free_bytes: (te.free != 0).then_some(te.free),
                label: crate::torch_replay::describe(process, te).unwrap_or_default(),
                error: "PyTorch's allocator raised out of memory".into(),
            }));
        }
    }

    fn flush(
        &mut self,
        high: &mut BTreeMap<i32, (u64, u64, [u64; N])>,
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
            }
            let cats = self.book.device_cats(device, None);
            let now = in_use(&cats);
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
}

/// Bytes in use: live bytes less the allocator's reserve.
fn in_use(cats: &[u64; N]) -> u64 {
    cats.iter().sum::<u64>() - cats[Category::AllocatorReserve.index()]
}

/// The whole of `trace` folded: its devices ([`Update::Device`]), then the categories, samples
/// and failures of [`TimelineFold::ingest`] over every item of [`Trace::items`], each stack
/// live at the report's moment in the categoriser's verdict there
/// ([`crate::categoriser::stack_categories`], [`TimelineFold::with_categories`]).
pub fn fold(trace: &Trace) -> Result<Vec<Update>> {
    fold_with(trace, crate::categoriser::stack_categories(trace)?)
}

/// [`fold`] with the verdicts of `categories` ([`TimelineFold::with_categories`]); with none
/// (`StackCategories::default()`), every allocation is categorised as it is made, as the live
/// view does.
pub fn fold_with(trace: &Trace, categories: StackCategories) -> Result<Vec<Update>> {
    let mut out = Vec::new();
    let mut fold = TimelineFold::with_categories(categories);
    let mut devices: BTreeMap<i32, (String, u64)> = BTreeMap::new();
    // Devices in the order the live source meets them: files by path.
    let mut by_path: Vec<&Process> = trace.processes.iter().collect();
    by_path.sort_by(|a, b| a.path.cmp(&b.path));
    for p in by_path {
        fold.start_at(p.header.start_mono_ns);
        for d in &p.devices {
            if d.ordinal >= 0 && devices.get(&d.ordinal) != Some(&(d.name.clone(), d.total_bytes)) {
                devices.insert(d.ordinal, (d.name.clone(), d.total_bytes));
                out.push(Update::Device(DeviceInfo {
                    ordinal: d.ordinal as u32,
                    name: d.name.clone(),
                    total_bytes: d.total_bytes,
                }));
            }
        }
    }
    let batch: Vec<(u64, usize, Item)> =
        trace.items()?.map(|(pi, it)| (it.t_ns(), pi, it)).collect();
    fold.ingest(batch, |pi| trace.processes.get(pi), &mut out);
    Ok(out)
}
