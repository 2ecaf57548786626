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
//! annotation naming it later decides again), once per process, stack and label.

use std::collections::{BTreeMap, BTreeSet};

use vramtrace_format::Event;
use vramtrace_viewer::model::{DeviceInfo, FailedAllocation, TimelinePoint, Update};

use crate::categories::{CATEGORIES, N};
use crate::categoriser::categorise_stack;
use crate::error::Result;
use crate::replay::{FastMap, Pool, Replayer, Step};
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
}

/// The replay plus live bytes by category per process and device.
#[derive(Default)]
pub(crate) struct Book {
    pub(crate) replay: Replayer,
    seq: usize,
    booked: FastMap<(usize, u8, u64), Booked>,
    by_cat: BTreeMap<(usize, i32), [u64; N]>,
    /// The category of an allocation as it is made, by process, stack and label.
    made: FastMap<(usize, u32, u32), u8>,
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
                            let category =
                                *self.made.entry((pi, e.stack, e.label)).or_insert_with(|| {
                                    categorise_stack(p, e.stack, e.size, p.string(e.label), None)
                                        .category
                                        .index() as u8
                                });
                            let b = Booked {
                                device: e.device,
                                category,
                                size: e.size,
                                label: e.label,
                                stack: e.stack,
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
            _ => None,
        }
    }

    /// Live bytes by category on `device`, of one process or of all.
    pub(crate) fn device_cats(&self, device: i32, process: Option<usize>) -> [u64; N] {
        let mut sum = [0u64; N];
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

/// The fold: the replay and category books, the devices seen, and time 0.
#[derive(Default)]
pub struct TimelineFold {
    pub(crate) book: Book,
    stacked: BTreeSet<i32>,
    t0: Option<u64>,
    latest_ns: u64,
    events: u64,
}

impl TimelineFold {
    /// An empty fold; time 0 is set by [`TimelineFold::start_at`].
    pub fn new() -> TimelineFold {
        TimelineFold::default()
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
        // Per device touched in this bucket: the highest live bytes, when, and their split.
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
}

/// The whole of `trace` folded: its devices ([`Update::Device`]), then the categories, samples
/// and failures of [`TimelineFold::ingest`] over every item of [`Trace::items`].
pub fn fold(trace: &Trace) -> Result<Vec<Update>> {
    let mut out = Vec::new();
    let mut fold = TimelineFold::new();
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
