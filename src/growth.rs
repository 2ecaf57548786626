//! Growth over a run: what grows, where, how fast, and what never comes back.
//!
//! A fold over the same pass as the summary ([`crate::summary::summarize`] feeds it every
//! allocation and release its replays see), so it costs no pass of its own and its memory is
//! bounded whatever the trace's length: every value is kept on one shared time grid of at most
//! [`series::MAX_BUCKETS`] buckets whose width doubles as the trace goes on
//! ([`series::Grid`]).
//!
//! # What is followed
//! - **Lines**: the live bytes of each allocating place, by process, device, level and stack:
//!   a PyTorch tensor's stack (its Python line) or a driver allocation's (its Python line, else
//!   its native function). A bucket keeps a line's low-water mark: what stayed live through it,
//!   so traffic that comes and goes within a bucket leaves the floor where it was and a leak
//!   raises it. Segments of PyTorch's caching allocator are not lines where the process
//!   recorded tensors: the tensors in them are.
//! - **The allocator's reserve**: the bytes of those segments (their low-water mark) and,
//!   sampled at bucket boundaries, the largest free block among them against the bytes no
//!   tensor holds, so a reserve that creeps is told apart from tensors that grow.
//! - **Categories**: the live bytes of each category ([`crate::categoriser::categorise_stack`],
//!   decided when a stack first allocates) at each bucket's end, for the plot.
//!
//! # The verdict
//! The run's start-up (everything up to the bucket after its first release: loading, the
//! first buffers) is set aside. The warm-up is then found, not configured: the breakpoint of a
//! two-line fit of the bytes in use ([`fit::warmup_end`]). Over the steady state after it,
//! each line gets its growth rate by least squares with the slope's standard error. A line
//! **leaks** when it grows by at least [`MATERIAL_BYTES`], at least 5 standard errors above
//! zero, and still grows over the last third of the steady state (at least half the rate, 3
//! standard errors), rising in at least [`MIN_RISES`] buckets (and one in 16): growth without
//! bound across the run. It is a **plateau** when it rose by at least [`MATERIAL_BYTES`] after
//! start-up and then stopped, or grew in fewer steps than a leak rises in (a larger shape met
//! now and then). The run's verdict is `leak`
//! when a line leaks or the reserve creeps (grows as a line that leaks would), else `plateau`
//! when something rose and stopped, else `none`. The method, and the runs that check it, are
//! in `docs/architecture.md` ("Growth over days") and `docs/validation.md`.

pub mod fit;
pub mod series;

use std::collections::HashMap;

use serde::Serialize;
use vramtrace_format::{Event, TensorEvent};

use crate::categories::N;
use crate::categoriser::{Category, categorise_stack};
use crate::replay::{FastMap, LiveAlloc, Pool, Replayer, Step};
use crate::symbolize::StackSymbolizer;
use crate::torch_replay::{LiveTensor, TensorReplay, TensorStep};
use crate::trace::{Process, Trace};
use series::{Grid, Keep, Series};

/// The least growth (bytes over the steady state, or a rise after start-up) a verdict rests
/// on: 1 MiB.
pub const MATERIAL_BYTES: f64 = 1_048_576.0;
/// Lines shown, ranked by rate.
pub const LINES_SHOWN: usize = 20;
/// The fewest buckets of the steady state a leak rises in (and at least one in 16): growth in
/// fewer steps is a plateau that has not settled yet.
pub const MIN_RISES: usize = 4;
/// The fewest buckets a growth can be told from (fewer: the verdict says the trace is too
/// short).
pub const MIN_BUCKETS: usize = 8;
/// The fewest steps over the steady state for the steps to be the x axis.
pub const MIN_STEPS: u64 = 8;
/// Oldest live allocations kept per line.
pub const OLDEST_SHOWN: usize = 3;
/// Lines symbolised to find their place (the fastest growing and the largest at the end):
/// symbolising is the costly part, and a line outside these cannot rank.
const CANDIDATES: usize = 64;

/// The run's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Something grows without bound across the run.
    Leak,
    /// Something grew and stopped.
    Plateau,
    /// Nothing grew after start-up.
    None,
}

impl Verdict {
    /// The word `report --json` writes.
    pub fn key(self) -> &'static str {
        match self {
            Verdict::Leak => "leak",
            Verdict::Plateau => "plateau",
            Verdict::None => "none",
        }
    }
}

/// What one line did over the steady state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LineVerdict {
    /// Grows without bound.
    Leak,
    /// Rose after start-up, then stopped.
    Plateau,
    /// Neither.
    Steady,
}

impl LineVerdict {
    /// The word `report --json`, the live view and the exports write.
    pub fn key(self) -> &'static str {
        match self {
            LineVerdict::Leak => "leak",
            LineVerdict::Plateau => "plateau",
            LineVerdict::Steady => "steady",
        }
    }
}

/// One allocating place and its growth.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GrowthLine {
    /// The Python line (`file.py:LINE function`), else the native function.
    #[serde(rename = "where")]
    pub place: String,
    /// Process id.
    pub pid: u32,
    /// Device ordinal.
    pub device: i32,
    /// `tensor` (PyTorch's tensors) or `driver` (driver allocations).
    pub level: &'static str,
    /// Its category (`report --json` key).
    pub category: &'static str,
    /// Growth rate of its live bytes over the steady state.
    pub bytes_per_hour: f64,
    /// The rate's standard error.
    pub uncertainty_bytes_per_hour: f64,
    /// Growth per step of the engine's loop (a forward), fitted against the steps counted,
    /// when the trace shows them ([`Growth::x_axis`] `steps`).
    pub bytes_per_step: Option<f64>,
    /// Bytes it grew by over the steady state (rate × its length).
    pub growth_bytes: f64,
    /// Bytes it holds at the end.
    pub live_bytes: u64,
    /// Allocations it holds at the end.
    pub live_allocations: u64,
    /// When its oldest allocation still live at the end was made, ns since the trace began
    /// (for a restated one, when it was restated: it was made before).
    pub oldest_t_ns: Option<u64>,
    /// Its oldest allocations still live at the end.
    pub oldest: Vec<HeldAllocation>,
    /// Leak, plateau or steady.
    pub verdict: LineVerdict,
    /// Its live bytes at each bucket of [`GrowthSeries::t_s`] (the bucket's low-water mark):
    /// what the Parquet and Perfetto exports carry; not in `report --json`.
    #[serde(skip)]
    pub live_series: Vec<u64>,
}

/// An allocation still live at the end.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HeldAllocation {
    /// When it was made, seconds since the trace began.
    pub t_s: f64,
    /// Bytes.
    pub bytes: u64,
    /// Known only from a restatement (its allocation record was dropped): made before `t_s`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub restated: bool,
}

/// PyTorch's reserve in one process and device.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReserveGrowth {
    /// Process id.
    pub pid: u32,
    /// Device ordinal.
    pub device: i32,
    /// Growth rate of the segments' bytes over the steady state.
    pub bytes_per_hour: f64,
    /// Its standard error.
    pub uncertainty_bytes_per_hour: f64,
    /// Growth rate of the live tensors' bytes over the same buckets.
    pub tensor_bytes_per_hour: f64,
    /// Segment bytes at the end.
    pub segment_bytes: u64,
    /// Segment bytes no tensor held at the end.
    pub unallocated_bytes: u64,
    /// The largest free block at the end (0 when never sampled).
    pub largest_free_block: u64,
    /// `creeps` (grows as a leak would, faster than its tensors), `follows its tensors` (grows
    /// with the tensors in it), `settled` (rose after start-up, then stopped) or `flat`.
    pub verdict: &'static str,
}

/// One category's growth, every process and device together.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CategoryGrowth {
    /// `report --json` key.
    pub category: &'static str,
    /// Growth rate over the steady state (of the bytes at each bucket's end).
    pub bytes_per_hour: f64,
    /// Bytes at the end.
    pub live_bytes: u64,
}

/// The values behind the growth plot: one point per bucket.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GrowthSeries {
    /// Each bucket's start, seconds since the trace began.
    pub t_s: Vec<f64>,
    /// Per category (`report --json` key), the bytes at each bucket's end, every process and
    /// device together; categories never live left out.
    pub by_category: Vec<(&'static str, Vec<u64>)>,
    /// Bytes the processes held from the driver, each bucket's low-water mark.
    pub held: Vec<u64>,
}

/// The growth of a whole trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Growth {
    /// `leak`, `plateau` or `none`.
    pub verdict: Verdict,
    /// Growth rate of the bytes the processes hold from the driver over the steady state.
    pub rate_bytes_per_hour: f64,
    /// Its standard error.
    pub rate_uncertainty_bytes_per_hour: f64,
    /// The x axis: `steps` when the engine's loop shows its steps (forwards, counted by their
    /// embedding outputs: a decode loop's steps, a server's batches), then `bytes_per_step`
    /// is fitted against them beside the hourly rates; else `time`.
    pub x_axis: &'static str,
    /// Steps counted over the steady state (0 without any).
    pub steady_steps: u64,
    /// Growth of the bytes held per step over the steady state, with steps.
    pub rate_bytes_per_step: Option<f64>,
    /// Seconds the trace covers.
    pub duration_s: f64,
    /// When start-up ended (the bucket after the first release), seconds.
    pub startup_end_s: f64,
    /// When the steady state began (the warm-up's end, found by the two-line fit), seconds.
    pub steady_from_s: f64,
    /// Width of one bucket, seconds.
    pub bucket_s: f64,
    /// On what detail the verdict rests.
    pub rests_on: String,
    /// Why the verdict is what it is, one sentence each.
    pub evidence: Vec<String>,
    /// The lines, fastest growing first.
    pub lines: Vec<GrowthLine>,
    /// PyTorch's reserve per process and device that had one.
    pub reserve: Vec<ReserveGrowth>,
    /// Per category.
    pub categories: Vec<CategoryGrowth>,
    /// The plot's values.
    pub series: GrowthSeries,
}

impl Growth {
    /// One line: the verdict, the line it rests on and the rate of the bytes held
    /// (`vramtrace summary`'s last line).
    pub fn headline(&self) -> String {
        if self.series.t_s.len() < MIN_BUCKETS {
            return format!(
                "{}: {}",
                self.verdict.key(),
                self.evidence.first().map_or("", String::as_str)
            );
        }
        let what = match self.verdict {
            Verdict::Leak => self
                .lines
                .iter()
                .find(|l| l.verdict == LineVerdict::Leak)
                .map(|l| {
                    format!(
                        "{} grows {}/h ± {} and holds {}",
                        l.place,
                        bytes_text(l.bytes_per_hour),
                        bytes_text(l.uncertainty_bytes_per_hour),
                        bytes_text(l.live_bytes as f64)
                    )
                })
                .unwrap_or_else(|| "PyTorch's reserve creeps".to_string()),
            Verdict::Plateau => self
                .lines
                .iter()
                .find(|l| l.verdict == LineVerdict::Plateau)
                .map(|l| {
                    format!(
                        "{} rose and stopped at {}",
                        l.place,
                        bytes_text(l.live_bytes as f64)
                    )
                })
                .unwrap_or_else(|| "risen during the warm-up, then held".to_string()),
            Verdict::None => "nothing grows after start-up".to_string(),
        };
        format!(
            "{}: {what}; held bytes {}/h ± {} over the steady state ({:.1} s to {:.1} s)",
            self.verdict.key(),
            bytes_text(self.rate_bytes_per_hour),
            bytes_text(self.rate_uncertainty_bytes_per_hour),
            self.steady_from_s,
            self.duration_s
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct LineKey {
    process: u32,
    device: i32,
    tensor: bool,
    stack: u32,
}

struct Line {
    key: LineKey,
    floor: Series,
    count: u64,
    category: Category,
    /// A segment of PyTorch's caching allocator (a driver line).
    segment: bool,
    /// Tensors made here are a forward's input hidden states (PyTorch's `embedding`): each one
    /// is a step of the engine's loop.
    step: bool,
}

/// Per process and device: the reserve and categories.
#[derive(Default)]
struct DeviceBooks {
    held: Series,
    segments: Series,
    tensors: Series,
    by_cat: Vec<Series>,
    any_tensor: bool,
    /// (largest free block, unallocated bytes) at the latest sample.
    free: Option<(u64, u64)>,
}

/// The fold. Feed it from a replay in time order; [`GrowthFold::finish`] computes the
/// [`Growth`].
pub struct GrowthFold {
    grid: Grid,
    started: bool,
    lines: Vec<Line>,
    index: FastMap<LineKey, u32>,
    books: FastMap<(usize, i32), DeviceBooks>,
    /// Per process and stack: whether a driver allocation there is a PyTorch segment.
    segment_stacks: FastMap<(usize, u32), bool>,
    first_release_ns: Option<u64>,
    first_ns: Option<u64>,
    last_ns: u64,
    /// Per process: the latest restatement of a live tensor (a ring's drop): its lines are
    /// whole only after it.
    restated_ns: FastMap<usize, u64>,
    /// Steps of the engine's loop so far (forwards: embedding outputs), every process together,
    /// at each bucket's end.
    steps: Series,
}

impl GrowthFold {
    /// An empty fold whose time 0 is `t0` (`CLOCK_MONOTONIC` ns, the trace's start).
    pub fn new(t0: u64) -> GrowthFold {
        GrowthFold {
            grid: Grid::new(t0),
            started: false,
            lines: Vec::new(),
            index: FastMap::default(),
            books: FastMap::default(),
            segment_stacks: FastMap::default(),
            first_release_ns: None,
            first_ns: None,
            last_ns: t0,
            restated_ns: FastMap::default(),
            steps: Series::default(),
        }
    }

    /// Moves the grid to `t_ns`; true when a new bucket began (a moment to sample what only a
    /// scan of the live set tells: [`GrowthFold::sample_free`]).
    pub fn tick(&mut self, t_ns: u64) -> bool {
        self.started = true;
        self.first_ns.get_or_insert(t_ns);
        self.last_ns = self.last_ns.max(t_ns);
        let before = self.grid.current;
        let mut doubled = false;
        while self.grid.advance(t_ns) {
            doubled = true;
            for l in &mut self.lines {
                l.floor.halve(Keep::Low);
            }
            self.steps.halve(Keep::Last);
            for b in self.books.values_mut() {
                b.held.halve(Keep::Low);
                b.segments.halve(Keep::Low);
                b.tensors.halve(Keep::Last);
                b.by_cat.iter_mut().for_each(|s| s.halve(Keep::Last));
            }
        }
        doubled || self.grid.current != before
    }

    fn books(&mut self, pi: usize, device: i32) -> &mut DeviceBooks {
        self.books
            .entry((pi, device))
            .or_insert_with(|| DeviceBooks {
                by_cat: vec![Series::default(); N],
                ..Default::default()
            })
    }

    fn line(&mut self, p: &Process, key: LineKey, bytes: u64, label: u32) -> usize {
        if let Some(&i) = self.index.get(&key) {
            return i as usize;
        }
        let segment = !key.tensor
            && *self
                .segment_stacks
                .entry((key.process as usize, key.stack))
                .or_insert_with(|| crate::categoriser::is_segment_stack(p, key.stack));
        let category = categorise_stack(p, key.stack, bytes, p.string(label), None).category;
        let step = key.tensor
            && crate::categoriser::py_frames(p, key.stack)
                .first()
                .is_some_and(crate::categoriser::is_embedding);
        let i = self.lines.len();
        self.lines.push(Line {
            key,
            floor: Series::default(),
            count: 0,
            category,
            segment,
            step,
        });
        self.index.insert(key, i as u32);
        i
    }

    /// What one driver event did in the replay (`step`): a device allocation made live or
    /// released is followed; anything else changes nothing here.
    pub fn driver_step(&mut self, p: &Process, pi: usize, e: &Event, step: &Step) {
        match step {
            Step::Allocated { pool: Pool::Device } => self.driver_alloc(p, pi, e),
            Step::Released { freed: Some(f), .. } if f.pool == Pool::Device => {
                self.driver_free(f, e.t_ns)
            }
            _ => {}
        }
    }

    /// What one tensor record did in the tensor replay (`step`).
    pub fn tensor_step(&mut self, p: &Process, pi: usize, t: &TensorEvent, step: &TensorStep) {
        match step {
            TensorStep::Allocated => self.tensor_alloc(p, pi, t, false),
            TensorStep::Restated(true) => self.tensor_alloc(p, pi, t, true),
            TensorStep::Released(Some(freed)) => self.tensor_free(freed, t.t_ns),
            _ => {}
        }
    }

    /// A device allocation the driver replay made live.
    fn driver_alloc(&mut self, p: &Process, pi: usize, e: &Event) {
        self.tick(e.t_ns);
        let key = LineKey {
            process: pi as u32,
            device: e.device,
            tensor: false,
            stack: e.stack,
        };
        let i = self.line(p, key, e.size, e.label);
        let b = self.grid.current;
        let (segment, cat) = {
            let l = &mut self.lines[i];
            l.floor.add(b, e.size, Keep::Low);
            l.count += 1;
            (l.segment, l.category.index())
        };
        let books = self.books(pi, e.device);
        books.held.add(b, e.size, Keep::Low);
        if segment {
            books.segments.add(b, e.size, Keep::Low);
        } else {
            books.by_cat[cat].add(b, e.size, Keep::Last);
        }
    }

    /// A device allocation the driver replay released.
    fn driver_free(&mut self, a: &LiveAlloc, t_ns: u64) {
        self.tick(t_ns);
        self.first_release_ns.get_or_insert(t_ns);
        let key = LineKey {
            process: a.process as u32,
            device: a.event.device,
            tensor: false,
            stack: a.event.stack,
        };
        let Some(&i) = self.index.get(&key) else {
            // Made before recording began (a seeded live set is recorded as allocations).
            return;
        };
        let b = self.grid.current;
        let l = &mut self.lines[i as usize];
        l.floor.sub(b, a.event.size, Keep::Low);
        l.count = l.count.saturating_sub(1);
        let (segment, cat) = (l.segment, l.category.index());
        let books = self.books(a.process, a.event.device);
        books.held.sub(b, a.event.size, Keep::Low);
        if segment {
            books.segments.sub(b, a.event.size, Keep::Low);
        } else {
            books.by_cat[cat].sub(b, a.event.size, Keep::Last);
        }
    }

    /// A tensor made live: handed out, or `restated` after the ring dropped its record.
    fn tensor_alloc(&mut self, p: &Process, pi: usize, t: &TensorEvent, restated: bool) {
        self.tick(t.t_ns);
        if restated {
            let r = self.restated_ns.entry(pi).or_default();
            *r = (*r).max(t.t_ns);
        }
        let key = LineKey {
            process: pi as u32,
            device: t.device,
            tensor: true,
            stack: t.stack,
        };
        let i = self.line(p, key, t.size, 0);
        let b = self.grid.current;
        let (cat, step) = {
            let l = &mut self.lines[i];
            l.floor.add(b, t.size, Keep::Low);
            l.count += 1;
            (l.category.index(), l.step)
        };
        if step && !restated {
            self.steps.add(b, 1, Keep::Last);
        }
        let books = self.books(pi, t.device);
        books.any_tensor = true;
        books.tensors.add(b, t.size, Keep::Last);
        books.by_cat[cat].add(b, t.size, Keep::Last);
    }

    /// A live tensor taken back.
    fn tensor_free(&mut self, lt: &LiveTensor, t_ns: u64) {
        self.tick(t_ns);
        self.first_release_ns.get_or_insert(t_ns);
        let key = LineKey {
            process: lt.process as u32,
            device: lt.event.device,
            tensor: true,
            stack: lt.event.stack,
        };
        let Some(&i) = self.index.get(&key) else {
            return;
        };
        let b = self.grid.current;
        let l = &mut self.lines[i as usize];
        l.floor.sub(b, lt.event.size, Keep::Low);
        l.count = l.count.saturating_sub(1);
        let cat = l.category.index();
        let books = self.books(lt.process, lt.event.device);
        books.tensors.sub(b, lt.event.size, Keep::Last);
        books.by_cat[cat].sub(b, lt.event.size, Keep::Last);
    }

    /// The processes and devices whose reserve a sample of the live set would describe.
    pub fn reserves(&self) -> Vec<(usize, i32)> {
        let mut v: Vec<(usize, i32)> = self
            .books
            .iter()
            .filter(|(_, b)| b.any_tensor && b.segments.now > 0)
            .map(|(k, _)| *k)
            .collect();
        v.sort_unstable();
        v
    }

    /// The largest free block and the unallocated bytes of one process and device's reserve,
    /// sampled now.
    pub fn sample_free(&mut self, pi: usize, device: i32, largest: u64, unallocated: u64) {
        self.books(pi, device).free = Some((largest, unallocated));
    }

    /// The growth of a whole trace, at its end; `None` when nothing was folded.
    pub fn finish(
        &self,
        trace: &Trace,
        replay: &Replayer,
        tensors: &TensorReplay,
        syms: &mut [StackSymbolizer<'_>],
    ) -> Option<Growth> {
        let processes: Vec<&Process> = trace.processes.iter().collect();
        self.growth(&processes, replay, tensors, &mut |pi, stack| {
            syms.get_mut(pi)
                .map(|s| s.stack(stack).iter().map(|f| f.to_string()).collect())
                .unwrap_or_default()
        })
    }

    /// The growth so far: `processes` by index (`None` for one not read yet), the replays the
    /// fold was fed from, and `native` the symbolised frames (innermost first) of a process's
    /// stack; `None` when nothing was folded. The live view asks as the run goes.
    pub fn growth(
        &self,
        processes: &[&Process],
        replay: &Replayer,
        tensors: &TensorReplay,
        native: &mut dyn FnMut(usize, u32) -> Vec<String>,
    ) -> Option<Growth> {
        if !self.started {
            return None;
        }
        Some(Finisher::new(self, processes).run(replay, tensors, native))
    }
}

/// The growth of `trace` in a pass of its own (a driver and a tensor replay feeding a
/// [`GrowthFold`]), for the readers that do not summarise: the exports and the growth plot.
/// The same analysis as the summary's ([`crate::summary::Summary::growth`]).
pub fn of_trace(trace: &Trace) -> crate::Result<Option<Growth>> {
    let mut fold = GrowthFold::new(trace.start_ns());
    let mut replay = Replayer::new();
    let mut tensors = TensorReplay::new();
    let mut budget = 0usize;
    let mut seq = 0usize;
    let names = FastMap::default();
    trace.for_each_item(|pi, it| {
        budget += 1;
        if fold.tick(it.t_ns()) {
            sample_reserves(&mut fold, trace, &replay, &tensors, &names, &mut budget);
        }
        let p = &trace.processes[pi];
        match &it {
            crate::trace::Item::Event(e) => {
                let step = replay.apply(pi, seq, e);
                fold.driver_step(p, pi, e, &step);
            }
            crate::trace::Item::Tensor(t) => {
                let step = tensors.apply(pi, seq, t);
                fold.tensor_step(p, pi, t, &step);
            }
            crate::trace::Item::Annotate(a) => {
                replay.annotate(pi, a);
            }
            _ => {}
        }
        seq += 1;
        std::ops::ControlFlow::Continue(())
    })?;
    replay.check_overflow()?;
    let mut syms: Vec<StackSymbolizer> = trace.processes.iter().map(StackSymbolizer::new).collect();
    Ok(fold.finish(trace, &replay, &tensors, &mut syms))
}

/// At a new bucket: the largest free block of each PyTorch reserve, within `budget` (the scans
/// together cost at most the items read; what one costs is taken from it).
pub(crate) fn sample_reserves(
    fold: &mut GrowthFold,
    trace: &Trace,
    replay: &Replayer,
    tensors: &TensorReplay,
    names: &FastMap<(usize, u64), String>,
    budget: &mut usize,
) {
    for (pi, dev) in fold.reserves() {
        let cost = tensors.live_len() + replay.live_len();
        if cost > *budget {
            return;
        }
        *budget -= cost;
        let m = crate::torch_replay::moment(
            trace,
            &tensors.live_set(pi, dev),
            &crate::torch_replay::segments_of(replay, pi, dev),
            0,
            0,
            names,
        );
        fold.sample_free(pi, dev, m.largest_free_block, m.unallocated_bytes);
    }
}

/// The verdict's arithmetic, once the pass is over.
struct Finisher<'t> {
    fold: &'t GrowthFold,
    processes: &'t [&'t Process],
    n: usize,
    /// x of each bucket: its start, hours.
    x: Vec<f64>,
    startup: usize,
    steady: usize,
    /// Per process: the first bucket whose tensor detail is whole (after the last range the
    /// ring dropped).
    tensor_from: Vec<usize>,
}

impl<'t> Finisher<'t> {
    fn new(fold: &'t GrowthFold, processes: &'t [&'t Process]) -> Finisher<'t> {
        let n = fold.grid.len();
        let x: Vec<f64> = (0..n).map(|i| fold.grid.start_s(i) / 3600.0).collect();
        let first = fold
            .first_release_ns
            .or(fold.first_ns)
            .unwrap_or(fold.grid.t0);
        let startup = (fold.grid.bucket(first) + 1).min(n.saturating_sub(1));
        // A ring drops a block after its last record and restates the tensors still live in it
        // then: detail is whole after both.
        let tensor_from = processes
            .iter()
            .enumerate()
            .map(|(pi, p)| {
                p.dropped
                    .iter()
                    .map(|d| d.2)
                    .chain(fold.restated_ns.get(&pi).copied())
                    .max()
                    .map_or(0, |to| fold.grid.bucket(to) + 1)
            })
            .collect();
        Finisher {
            fold,
            processes,
            n,
            x,
            startup,
            steady: startup,
            tensor_from,
        }
    }

    /// Whether line `l` is one of the lines: a segment is not where its process recorded
    /// tensors on that device (the tensors in it are).
    fn counted(&self, l: &Line) -> bool {
        !(l.segment
            && self
                .fold
                .books
                .get(&(l.key.process as usize, l.key.device))
                .is_some_and(|b| b.any_tensor))
    }

    /// The first bucket a series of this line may be fitted from.
    fn valid_from(&self, key: &LineKey) -> usize {
        if key.tensor {
            self.tensor_from
                .get(key.process as usize)
                .copied()
                .unwrap_or(0)
        } else {
            0
        }
    }

    fn fit(&self, y: &[u64], from: usize) -> Option<fit::Fit> {
        fit::line((from.max(self.steady)..self.n).map(|i| (self.x[i], y[i] as f64)))
    }

    /// The growth of one floor series over the steady state and what it did; `from` is the
    /// first bucket whose detail is whole.
    fn judge(&self, y: &[u64], from: usize) -> (Option<fit::Fit>, LineVerdict) {
        let last = self.n - 1;
        let window = from.max(self.steady).min(last);
        let Some(f) = self.fit(y, window) else {
            return (None, LineVerdict::Steady);
        };
        let span = self.x[last] - self.x[window];
        let growth = f.slope * span;
        let tail_from = window + (self.n - window) * 2 / 3;
        let tail = fit::line((tail_from..self.n).map(|i| (self.x[i], y[i] as f64)));
        let end = y[last] as f64;
        let continuing = tail.is_none_or(|t| t.n < 3 || (t.slope >= 0.5 * f.slope && t.t() >= 3.0));
        // A leak rises bucket after bucket; growth in a few steps (a larger shape met now and
        // then, as a decode loop's reserve grows with its longest prompt so far) is a plateau
        // that has not settled yet.
        let rises = (window + 1..self.n).filter(|&i| y[i] > y[i - 1]).count();
        let stepwise = rises < MIN_RISES.max((self.n - window) / 16);
        if f.slope > 0.0
            && f.t() >= 5.0
            && growth >= MATERIAL_BYTES
            && continuing
            && end >= growth / 2.0
        {
            if !stepwise {
                return (Some(f), LineVerdict::Leak);
            }
            return (Some(f), LineVerdict::Plateau);
        }
        // A plateau: risen from start-up (or from where the detail became whole), held, and
        // not growing at the end.
        let base_at = self.startup.max(from).min(last);
        let base = y[base_at] as f64;
        let top = y[base_at..].iter().copied().max().unwrap_or(0) as f64;
        let rise = top - base;
        let flat_now = tail.is_none_or(|t| {
            t.n < 3 || t.t() < 3.0 || t.slope * (self.x[last] - self.x[tail_from]) < MATERIAL_BYTES
        });
        if rise >= MATERIAL_BYTES && end - base >= rise / 2.0 && flat_now {
            return (Some(f), LineVerdict::Plateau);
        }
        (Some(f), LineVerdict::Steady)
    }

    fn run(
        mut self,
        replay: &Replayer,
        tensors: &TensorReplay,
        native: &mut dyn FnMut(usize, u32) -> Vec<String>,
    ) -> Growth {
        let n = self.n;
        let floors: Vec<Vec<u64>> = self.fold.lines.iter().map(|l| l.floor.values(n)).collect();
        let counted: Vec<bool> = self.fold.lines.iter().map(|l| self.counted(l)).collect();
        let mut in_use = vec![0f64; n];
        for (y, _) in floors.iter().zip(&counted).filter(|(_, c)| **c) {
            for (s, v) in in_use.iter_mut().zip(y) {
                *s += *v as f64;
            }
        }
        // The warm-up on the steps when the loop shows them (a rate per step holds when the
        // load changes speed), else on the clock.
        let steps = self.steps_at_start();
        let after_startup = steps[n - 1].saturating_sub(steps[self.startup]);
        self.steady = if after_startup >= MIN_STEPS {
            let x: Vec<f64> = steps.iter().map(|v| *v as f64).collect();
            fit::warmup_end_at(&x, &in_use, self.startup)
        } else {
            fit::warmup_end(&in_use, self.startup)
        }
        .min(n.saturating_sub(1));

        // Every counted line judged; the candidates placed.
        let mut judged: Vec<(usize, fit::Fit, LineVerdict)> = Vec::new();
        for (i, l) in self.fold.lines.iter().enumerate() {
            if !counted[i] {
                continue;
            }
            let (f, v) = self.judge(&floors[i], self.valid_from(&l.key));
            if let Some(f) = f {
                judged.push((i, f, v));
            }
        }
        let mut by_rate: Vec<usize> = (0..judged.len()).collect();
        by_rate.sort_by(|&a, &b| judged[b].1.slope.total_cmp(&judged[a].1.slope));
        let mut by_live: Vec<usize> = (0..judged.len()).collect();
        by_live.sort_by_key(|&j| std::cmp::Reverse(self.fold.lines[judged[j].0].floor.now));
        let mut candidates: Vec<usize> = by_rate
            .iter()
            .take(CANDIDATES)
            .chain(by_live.iter().take(CANDIDATES / 4))
            .map(|&j| judged[j].0)
            .collect();
        candidates.sort_unstable();
        candidates.dedup();

        // Candidates merged by place: one Python line reached through several stacks is one.
        let mut places: Vec<(String, LineKey, Vec<usize>)> = Vec::new();
        let mut at: HashMap<(u32, i32, bool, String), usize> = HashMap::new();
        for &i in &candidates {
            let key = self.fold.lines[i].key;
            let place = self.place(&key, native);
            let k = (key.process, key.device, key.tensor, place.clone());
            match at.get(&k) {
                Some(&j) => places[j].2.push(i),
                None => {
                    at.insert(k, places.len());
                    places.push((place, key, vec![i]));
                }
            }
        }
        let oldest = self.oldest(replay, tensors, &candidates);
        let t0 = self.fold.grid.t0;
        let mut lines: Vec<GrowthLine> = Vec::new();
        for (place, key, members) in places {
            let mut y = vec![0u64; n];
            for &i in &members {
                for (s, v) in y.iter_mut().zip(&floors[i]) {
                    *s += v;
                }
            }
            let (f, verdict) = self.judge(&y, self.valid_from(&key));
            let Some(f) = f else { continue };
            let per_step = self.per_step(&y, self.valid_from(&key));
            let span = self.x[n - 1] - self.x[self.steady.min(n - 1)];
            let mut held: Vec<(u64, u64, bool)> = members
                .iter()
                .flat_map(|i| oldest.get(i).cloned().unwrap_or_default())
                .collect();
            held.sort_unstable();
            held.truncate(OLDEST_SHOWN);
            let first = &self.fold.lines[members[0]];
            lines.push(GrowthLine {
                place,
                pid: self.pid(key.process as usize),
                device: key.device,
                level: if key.tensor { "tensor" } else { "driver" },
                category: first.category.key(),
                bytes_per_hour: f.slope,
                uncertainty_bytes_per_hour: f.se,
                bytes_per_step: per_step,
                growth_bytes: f.slope * span,
                live_bytes: members.iter().map(|&i| self.fold.lines[i].floor.now).sum(),
                live_allocations: members.iter().map(|&i| self.fold.lines[i].count).sum(),
                oldest_t_ns: held.first().map(|h| h.0.saturating_sub(t0)),
                oldest: held
                    .iter()
                    .map(|&(t, bytes, restated)| HeldAllocation {
                        t_s: t.saturating_sub(t0) as f64 / 1e9,
                        bytes,
                        restated,
                    })
                    .collect(),
                verdict,
                live_series: y,
            });
        }
        // A line that holds nothing at the end and neither grew nor rose says nothing.
        lines.retain(|l| {
            l.live_bytes > 0
                || l.verdict != LineVerdict::Steady
                || l.growth_bytes.abs() >= MATERIAL_BYTES
        });
        lines.sort_by(|a, b| b.bytes_per_hour.total_cmp(&a.bytes_per_hour));
        lines.truncate(LINES_SHOWN);

        let reserve = self.reserve();
        let held_total = self.sum_books(|b| b.held.values(n));
        let rate = self.fit(&held_total, self.steady);
        let categories = self.categories();
        let series = self.series(&held_total);
        let steady_steps = self.steady_steps();
        let mut growth = Growth {
            verdict: Verdict::None,
            rate_bytes_per_hour: rate.map_or(0.0, |f| f.slope),
            rate_uncertainty_bytes_per_hour: rate.map_or(0.0, |f| f.se),
            x_axis: if self.step_axis().is_some() {
                "steps"
            } else {
                "time"
            },
            steady_steps,
            rate_bytes_per_step: self.per_step(&held_total, 0),
            duration_s: self.fold.last_ns.saturating_sub(t0) as f64 / 1e9,
            startup_end_s: self.fold.grid.start_s(self.startup),
            steady_from_s: self.fold.grid.start_s(self.steady),
            bucket_s: self.fold.grid.width_ns as f64 / 1e9,
            rests_on: self.rests_on(),
            evidence: Vec::new(),
            lines,
            reserve,
            categories,
            series,
        };
        let rise = in_use[self.steady] - in_use[self.startup];
        judge_run(&mut growth, rise, n);
        growth
    }

    /// Where a line allocates: its Python line, else its first native frame past the
    /// allocation machinery.
    fn place(&self, key: &LineKey, native: &mut dyn FnMut(usize, u32) -> Vec<String>) -> String {
        let pi = key.process as usize;
        if let Some(p) = self.processes.get(pi)
            && let Some(l) = crate::torch_replay::python_locations(p, key.stack).first()
        {
            return l.to_string();
        }
        if key.stack == 0 {
            return "(no stack recorded)".into();
        }
        let frames = native(pi, key.stack);
        crate::symbolize::first_user_frame(&frames)
            .or_else(|| frames.first().cloned())
            .unwrap_or_else(|| format!("stack {}", key.stack))
    }

    /// Steps counted before each bucket (a bucket's low-water mark is at its start).
    fn steps_at_start(&self) -> Vec<u64> {
        let end = self.fold.steps.values(self.n);
        std::iter::once(0).chain(end).take(self.n).collect()
    }

    /// [`Finisher::steps_at_start`], when the steady state holds at least [`MIN_STEPS`].
    fn step_axis(&self) -> Option<Vec<u64>> {
        (self.steady_steps() >= MIN_STEPS).then(|| self.steps_at_start())
    }

    fn steady_steps(&self) -> u64 {
        let v = self.fold.steps.values(self.n);
        let before = self.steady.checked_sub(1).map_or(0, |i| v[i]);
        v[self.n - 1].saturating_sub(before)
    }

    /// The growth of `y` per step over the steady state (from `from`), fitted against the steps
    /// counted before each bucket; `None` without a step axis.
    fn per_step(&self, y: &[u64], from: usize) -> Option<f64> {
        let steps = self.step_axis()?;
        let window = from.max(self.steady).min(self.n - 1);
        fit::line((window..self.n).map(|i| (steps[i] as f64, y[i] as f64))).map(|f| f.slope)
    }

    fn pid(&self, pi: usize) -> u32 {
        self.processes.get(pi).map_or(0, |p| p.header.pid)
    }

    /// The oldest live allocations of each candidate line at the end: (made, bytes, restated).
    fn oldest(
        &self,
        replay: &Replayer,
        tensors: &TensorReplay,
        candidates: &[usize],
    ) -> HashMap<usize, Vec<(u64, u64, bool)>> {
        let wanted: HashMap<LineKey, usize> = candidates
            .iter()
            .map(|&i| (self.fold.lines[i].key, i))
            .collect();
        let mut out: HashMap<usize, Vec<(u64, u64, bool)>> = HashMap::new();
        let mut keep = |i: usize, item: (u64, u64, bool)| {
            let v = out.entry(i).or_default();
            v.push(item);
            if v.len() > 4 * OLDEST_SHOWN {
                v.sort_unstable();
                v.truncate(OLDEST_SHOWN);
            }
        };
        let mut devices: Vec<(usize, i32)> = self.fold.books.keys().copied().collect();
        devices.sort_unstable();
        for (pi, dev) in devices {
            for a in replay.live_set(pi, dev, Pool::Device) {
                let key = LineKey {
                    process: pi as u32,
                    device: dev,
                    tensor: false,
                    stack: a.event.stack,
                };
                if let Some(&i) = wanted.get(&key) {
                    keep(i, (a.event.t_ns, a.event.size, false));
                }
            }
            for t in tensors.live_set(pi, dev) {
                let key = LineKey {
                    process: pi as u32,
                    device: dev,
                    tensor: true,
                    stack: t.event.stack,
                };
                if let Some(&i) = wanted.get(&key) {
                    keep(i, (t.event.t_ns, t.event.size, t.restated));
                }
            }
        }
        for v in out.values_mut() {
            v.sort_unstable();
            v.truncate(OLDEST_SHOWN);
        }
        out
    }

    fn sum_books(&self, f: impl Fn(&DeviceBooks) -> Vec<u64>) -> Vec<u64> {
        let mut total = vec![0u64; self.n];
        for b in self.fold.books.values() {
            for (s, v) in total.iter_mut().zip(f(b)) {
                *s = s.saturating_add(v);
            }
        }
        total
    }

    fn reserve(&self) -> Vec<ReserveGrowth> {
        let n = self.n;
        let mut keys: Vec<(usize, i32)> = self
            .fold
            .books
            .iter()
            .filter(|(_, b)| b.any_tensor)
            .map(|(k, _)| *k)
            .collect();
        keys.sort_unstable();
        keys.into_iter()
            .filter_map(|(pi, dev)| {
                let b = &self.fold.books[&(pi, dev)];
                let segs = b.segments.values(n);
                if segs.iter().all(|v| *v == 0) {
                    return None;
                }
                let (f, v) = self.judge(&segs, 0);
                let f = f?;
                let tensor_rate = self.fit(&b.tensors.values(n), 0).map_or(0.0, |t| t.slope);
                let (largest, unallocated) = b
                    .free
                    .unwrap_or((0, b.segments.now.saturating_sub(b.tensors.now)));
                Some(ReserveGrowth {
                    pid: self.pid(pi),
                    device: dev,
                    bytes_per_hour: f.slope,
                    uncertainty_bytes_per_hour: f.se,
                    tensor_bytes_per_hour: tensor_rate,
                    segment_bytes: b.segments.now,
                    unallocated_bytes: unallocated,
                    largest_free_block: largest,
                    verdict: match v {
                        // Segments that grow with the tensors in them are the tensors' growth.
                        LineVerdict::Leak if f.slope - tensor_rate < 0.5 * f.slope => {
                            "follows its tensors"
                        }
                        LineVerdict::Leak => "creeps",
                        LineVerdict::Plateau => "settled",
                        LineVerdict::Steady => "flat",
                    },
                })
            })
            .collect()
    }

    fn categories(&self) -> Vec<CategoryGrowth> {
        let n = self.n;
        Category::ALL
            .iter()
            .filter_map(|c| {
                let y = self.sum_books(|b| b.by_cat[c.index()].values(n));
                let y = if *c == Category::AllocatorReserve {
                    self.reserve_bytes()
                } else {
                    y
                };
                if y.iter().all(|v| *v == 0) {
                    return None;
                }
                Some(CategoryGrowth {
                    category: c.key(),
                    bytes_per_hour: self.fit(&y, 0).map_or(0.0, |f| f.slope),
                    live_bytes: y[n - 1],
                })
            })
            .collect()
    }

    /// Segment bytes no tensor holds, at each bucket's end (segments' low-water less the
    /// tensors at the end: the reserve as the plot stacks it).
    fn reserve_bytes(&self) -> Vec<u64> {
        let n = self.n;
        let mut total = vec![0u64; n];
        for b in self.fold.books.values().filter(|b| b.any_tensor) {
            let s = b.segments.values(n);
            let t = b.tensors.values(n);
            for i in 0..n {
                total[i] = total[i].saturating_add(s[i].saturating_sub(t[i]));
            }
        }
        total
    }

    fn series(&self, held: &[u64]) -> GrowthSeries {
        let n = self.n;
        let by_category = Category::ALL
            .iter()
            .filter_map(|c| {
                let y = if *c == Category::AllocatorReserve {
                    self.reserve_bytes()
                } else {
                    self.sum_books(|b| b.by_cat[c.index()].values(n))
                };
                y.iter().any(|v| *v > 0).then_some((c.key(), y))
            })
            .collect();
        GrowthSeries {
            t_s: (0..n).map(|i| self.fold.grid.start_s(i)).collect(),
            by_category,
            held: held.to_vec(),
        }
    }

    fn rests_on(&self) -> String {
        let whole_from = |pi: usize| self.fold.grid.start_s(self.tensor_from[pi]);
        let t0 = self.fold.grid.t0;
        let mut parts = Vec::new();
        let tensor_processes = self
            .fold
            .books
            .iter()
            .filter(|(_, b)| b.any_tensor)
            .map(|((pi, _), _)| *pi)
            .collect::<std::collections::BTreeSet<_>>();
        if tensor_processes.is_empty() {
            parts.push("driver allocations, by native function (no tensor records)".to_string());
        } else {
            parts.push(format!(
                "PyTorch's tensors by Python line in {} process{} and driver allocations outside its segments",
                tensor_processes.len(),
                if tensor_processes.len() == 1 { "" } else { "es" }
            ));
        }
        for (pi, p) in self.processes.iter().enumerate() {
            if !p.dropped.is_empty() {
                parts.push(format!(
                    "process {}'s tensor detail only from {:.1} s on (the size budget dropped earlier tensor records, the last at {:.1} s, and restated the live set; lines are fitted from there, driver allocations over the whole run)",
                    p.header.pid,
                    whole_from(pi),
                    p.dropped.iter().map(|d| d.2).max().unwrap_or(0).saturating_sub(t0) as f64 / 1e9
                ));
            }
        }
        parts.join("; ")
    }
}

/// Bytes (or bytes an hour) as a person reads them, with their sign; `—` for a figure that
/// cannot be had (a standard error from too few points).
fn bytes_text(b: f64) -> String {
    if !b.is_finite() {
        return "—".into();
    }
    vramtrace_models::units::format_bytes(
        b.round() as i128,
        vramtrace_models::units::ByteStyle::Torch,
    )
}

/// The run's verdict from its lines and reserve, with the evidence.
fn judge_run(g: &mut Growth, in_use_rise: f64, buckets: usize) {
    let mb = bytes_text;
    if buckets < MIN_BUCKETS {
        g.evidence.push(format!(
            "the trace covers {buckets} bucket(s) of {:.3} s: too short to tell growth from start-up",
            g.bucket_s
        ));
        return;
    }
    let leaks: Vec<&GrowthLine> = g
        .lines
        .iter()
        .filter(|l| l.verdict == LineVerdict::Leak)
        .collect();
    let creeping: Vec<&ReserveGrowth> =
        g.reserve.iter().filter(|r| r.verdict == "creeps").collect();
    for l in &leaks {
        g.evidence.push(format!(
            "{} (pid {}, device {}) grows {}/h ± {} over the steady state and still holds {} in {} allocation(s), the oldest from {:.1} s",
            l.place,
            l.pid,
            l.device,
            mb(l.bytes_per_hour),
            mb(l.uncertainty_bytes_per_hour),
            mb(l.live_bytes as f64),
            l.live_allocations,
            l.oldest_t_ns.unwrap_or(0) as f64 / 1e9
        ));
    }
    for r in &creeping {
        g.evidence.push(format!(
            "PyTorch's reserve (pid {}, device {}) creeps {}/h while its tensors grow {}/h: the allocator holds segments it cannot reuse (largest free block {} of {} unallocated)",
            r.pid,
            r.device,
            mb(r.bytes_per_hour),
            mb(r.tensor_bytes_per_hour),
            mb(r.largest_free_block as f64),
            mb(r.unallocated_bytes as f64)
        ));
    }
    if leaks.is_empty() && creeping.is_empty() {
        // Segments (driver allocations: never dropped) that grow as a leak would, with the
        // tensors in them, where no line's detail was long enough to judge (a ring's drops).
        let following: Vec<&ReserveGrowth> = g
            .reserve
            .iter()
            .filter(|r| r.verdict == "follows its tensors")
            .collect();
        for r in &following {
            let first = g.lines.first().map_or(String::new(), |l| {
                format!(
                    "; the fastest-growing line over the detail there is: {} ({}/h)",
                    l.place,
                    bytes_text(l.bytes_per_hour)
                )
            });
            g.evidence.push(format!(
                "PyTorch's segments (pid {}, device {}) grow {}/h ± {} over the steady state as a leak would, with its tensors ({}/h){first}",
                r.pid,
                r.device,
                bytes_text(r.bytes_per_hour),
                bytes_text(r.uncertainty_bytes_per_hour),
                bytes_text(r.tensor_bytes_per_hour)
            ));
        }
        if following.is_empty() {
            // Fall through to the plateau and none checks below.
        } else {
            g.verdict = Verdict::Leak;
            return;
        }
    } else {
        g.verdict = Verdict::Leak;
        return;
    }
    for l in g.lines.iter().filter(|l| l.verdict == LineVerdict::Plateau) {
        g.evidence.push(format!(
            "{} (pid {}, device {}) rose after start-up and stopped: {} held at the end (a cache filling, or a pool per new shape)",
            l.place,
            l.pid,
            l.device,
            mb(l.live_bytes as f64)
        ));
    }
    for r in g.reserve.iter().filter(|r| r.verdict == "settled") {
        g.evidence.push(format!(
            "PyTorch's reserve (pid {}, device {}) rose after start-up and settled at {}",
            r.pid,
            r.device,
            mb(r.segment_bytes as f64)
        ));
    }
    if in_use_rise >= MATERIAL_BYTES && g.evidence.is_empty() {
        g.evidence.push(format!(
            "the bytes in use rose {} during the warm-up ({:.1} s to {:.1} s) and then held",
            mb(in_use_rise),
            g.startup_end_s,
            g.steady_from_s
        ));
    }
    if !g.evidence.is_empty() {
        g.verdict = Verdict::Plateau;
        return;
    }
    g.evidence.push(format!(
        "nothing rose by {} after start-up ({:.1} s); the bytes held grow {}/h ± {}",
        mb(MATERIAL_BYTES),
        g.startup_end_s,
        mb(g.rate_bytes_per_hour),
        mb(g.rate_uncertainty_bytes_per_hour)
    ));
}

#[cfg(test)]
mod tests;
