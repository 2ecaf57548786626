//! Parquet: the trace as six tables, one file each, for DuckDB, pyarrow, polars or Spark.
//!
//! [`export_parquet`] writes into a directory:
//!
//! | file | one row per | columns |
//! | --- | --- | --- |
//! | `events.parquet` | event, in time order | `pid`, `tid`, `t_ns`, `kind`, `api`, `mem`, `pool`, `device`, `ptr`, `size`, `result`, `stream`, `aux`, `free_bytes`, `total_bytes`, `stack_id`, `label`, `name`, `dtype`, `unmatched`, `category` |
//! | `stacks.parquet` | frame of a recorded stack | `pid`, `stack_id`, `frame` (0 = innermost), `address`, `module`, `symbol`, `file`, `line` |
//! | `processes.parquet` | traced process | `pid`, `ppid`, `command_line`, `host`, `start_unix_ns`, `start_mono_ns`, `driver_version`, `path`, `problems` |
//! | `devices.parquet` | device a process reported | `pid`, `ordinal`, `name`, `total_bytes` |
//! | `growth.parquet` | line of the growth analysis and bucket ([`crate::growth`]) | `pid`, `device`, `where`, `level`, `category`, `line_verdict`, `bytes_per_hour`, `uncertainty_bytes_per_hour`, `t_s` (the bucket's start), `live_bytes` (its low-water mark), and the run's `run_verdict`, `run_bytes_per_hour`, `steady_from_s`, `duration_s` on every row |
//! | `tensors.parquet` | tensor event of PyTorch's caching allocator, in time order | `pid`, `tid`, `t_ns`, `kind`, `device`, `ptr`, `size`, `requested`, `segment`, `category`, `line`, `file`, `line_no`, `function`, `stack_id`, `name`, `label`, `alloc_t_ns`, `free_bytes`, `allocated_bytes`, `reserved_bytes`, `unmatched` |
//!
//! `tensors.parquet` is the tensor level beside the driver's events (see [`crate::torch_replay`]):
//! one row per block PyTorch's allocator handed out (`alloc`), took back (`free`) or refused
//! (`alloc_failed`), from the PyTorch probe or an imported snapshot; empty when the trace has
//! none. `size` is the block (a `free` carries its allocation's), `requested` the bytes asked
//! for; `segment` the base address of the driver allocation holding the block then (for
//! expandable segments, the mapped chunk); `line` the tensor's Python line as the summary
//! names it (`chunk_o.py:565 chunk_fwd_o`: the innermost frame that is the program's own, with
//! `file`, `line_no` and `function`; a `free` carries its allocation's, so bytes group by the
//! line that allocated them); `name` the name given to the tensor (an annotation); `label` the
//! range path open on the thread at the allocation; `category` what the categoriser makes of
//! the allocation's frames, label and name ([`super::category_of_stack`]); `alloc_t_ns` on a `free`, when it was
//! allocated. `free_bytes`, `allocated_bytes` and `reserved_bytes` are the driver's free memory
//! and the allocator's bytes at an `alloc_failed`. Grouping the bytes by line:
//!
//! ```sql
//! SELECT line, count(*) AS tensors, sum(size) AS bytes
//! FROM 'OUT/tensors.parquet' WHERE kind = 'alloc' GROUP BY line ORDER BY bytes DESC
//! ```
//!
//! `growth.parquet` is what a fleet query needs: many servers' traces ranked by growth rate,
//! each exported to its own directory:
//!
//! ```sql
//! SELECT filename, any_value(run_verdict) AS verdict, any_value(run_bytes_per_hour) AS rate,
//!        arg_max("where", bytes_per_hour) AS fastest_line
//! FROM read_parquet('exports/*/growth.parquet', filename = true)
//! GROUP BY filename ORDER BY rate DESC
//! ```
//!
//! Integers are INT64 (INT32 for `device`, `result`, `frame`, `ordinal`, `line`,
//! `driver_version`), text is UTF8, times are INT64 nanoseconds: `t_ns` and `start_mono_ns` are
//! `CLOCK_MONOTONIC` (one clock for every process of a boot), `start_unix_ns` is the wall clock
//! at `start_mono_ns`, so `start_unix_ns + (t_ns - start_mono_ns)` dates an event. Absent values
//! are NULL, never 0: `stream`, `aux` and `stack_id` when the call has none, `free_bytes` and
//! `total_bytes` except on `alloc_failed`.
//!
//! The event rows match `vramtrace events`: a release carries the size, device and memory kind
//! of what it released (`unmatched` when nothing recorded matched it) and the tensor name of a
//! named allocation; a name given through the annotation ABI is an `annotate` row of its own
//! (the allocation's `ptr`, `size` and `device`). `pool` is the accounting bucket (`device`,
//! `managed`, `host`, `address`, `mapped`); buckets are never to be summed together.
//! `category` is, on an allocation and a failed allocation, what the categoriser makes of it
//! when it is made ([`crate::categoriser::categorise_stack`]: its frames and label; the
//! `report --json` key, `kv_cache`), NULL on other rows.
//!
//! Rows are written as [`Trace::items`] streams them, [`ROW_GROUP_ROWS`] to a row group (DuckDB
//! writes 122,880-row groups itself), so a 10 M-event trace exports holding one row group
//! (about 60 MB), the live set and the string table. Pages are Snappy-compressed.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::BufWriter;
use std::path::Path;
use std::sync::Arc;

use ::parquet::basic::Compression;
use ::parquet::data_type::{BoolType, ByteArray, ByteArrayType, DoubleType, Int32Type, Int64Type};
use ::parquet::file::properties::WriterProperties;
use ::parquet::file::writer::SerializedFileWriter;
use ::parquet::schema::parser::parse_message_type;
use vramtrace_format::{EventKind, MemKind, TensorAction};

use super::{ExportError, Progress};
use crate::replay::{Replayer, Step};
use crate::symbolize::StackSymbolizer;
use crate::torch_replay::{PyLocation, TensorReplay, TensorStep, python_locations};
use crate::trace::{Item, Trace};

/// Rows per row group.
pub const ROW_GROUP_ROWS: usize = 256 * 1024;

/// Rows written to each table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParquetTables {
    /// Rows of `events.parquet`.
    pub events: u64,
    /// Rows of `stacks.parquet` (frames).
    pub stacks: u64,
    /// Rows of `processes.parquet`.
    pub processes: u64,
    /// Rows of `devices.parquet`.
    pub devices: u64,
    /// Rows of `tensors.parquet`.
    pub tensors: u64,
    /// Rows of `growth.parquet`.
    pub growth: u64,
}

const EVENTS_SCHEMA: &str = "message events {
  REQUIRED INT64 pid;
  REQUIRED INT64 tid;
  REQUIRED INT64 t_ns;
  REQUIRED BYTE_ARRAY kind (UTF8);
  REQUIRED BYTE_ARRAY api (UTF8);
  REQUIRED BYTE_ARRAY mem (UTF8);
  REQUIRED BYTE_ARRAY pool (UTF8);
  REQUIRED INT32 device;
  REQUIRED INT64 ptr;
  REQUIRED INT64 size;
  REQUIRED INT32 result;
  OPTIONAL INT64 stream;
  OPTIONAL INT64 aux;
  OPTIONAL INT64 free_bytes;
  OPTIONAL INT64 total_bytes;
  OPTIONAL INT64 stack_id;
  OPTIONAL BYTE_ARRAY label (UTF8);
  OPTIONAL BYTE_ARRAY name (UTF8);
  OPTIONAL BYTE_ARRAY dtype (UTF8);
  REQUIRED BOOLEAN unmatched;
  OPTIONAL BYTE_ARRAY category (UTF8);
}";

const STACKS_SCHEMA: &str = "message stacks {
  REQUIRED INT64 pid;
  REQUIRED INT64 stack_id;
  REQUIRED INT32 frame;
  REQUIRED INT64 address;
  REQUIRED BYTE_ARRAY module (UTF8);
  OPTIONAL BYTE_ARRAY symbol (UTF8);
  OPTIONAL BYTE_ARRAY file (UTF8);
  OPTIONAL INT32 line;
}";

const PROCESSES_SCHEMA: &str = "message processes {
  REQUIRED INT64 pid;
  REQUIRED INT64 ppid;
  REQUIRED BYTE_ARRAY command_line (UTF8);
  REQUIRED BYTE_ARRAY host (UTF8);
  REQUIRED INT64 start_unix_ns;
  REQUIRED INT64 start_mono_ns;
  OPTIONAL INT32 driver_version;
  REQUIRED BYTE_ARRAY path (UTF8);
  REQUIRED INT64 problems;
}";

const GROWTH_SCHEMA: &str = "message growth {
  REQUIRED INT64 pid;
  REQUIRED INT32 device;
  REQUIRED BYTE_ARRAY where (UTF8);
  REQUIRED BYTE_ARRAY level (UTF8);
  REQUIRED BYTE_ARRAY category (UTF8);
  REQUIRED BYTE_ARRAY line_verdict (UTF8);
  REQUIRED DOUBLE bytes_per_hour;
  REQUIRED DOUBLE uncertainty_bytes_per_hour;
  REQUIRED DOUBLE t_s;
  REQUIRED INT64 live_bytes;
  REQUIRED BYTE_ARRAY run_verdict (UTF8);
  REQUIRED DOUBLE run_bytes_per_hour;
  REQUIRED DOUBLE steady_from_s;
  REQUIRED DOUBLE duration_s;
}";

const TENSORS_SCHEMA: &str = "message tensors {
  REQUIRED INT64 pid;
  REQUIRED INT64 tid;
  REQUIRED INT64 t_ns;
  REQUIRED BYTE_ARRAY kind (UTF8);
  REQUIRED INT32 device;
  REQUIRED INT64 ptr;
  REQUIRED INT64 size;
  OPTIONAL INT64 requested;
  OPTIONAL INT64 segment;
  REQUIRED BYTE_ARRAY category (UTF8);
  OPTIONAL BYTE_ARRAY line (UTF8);
  OPTIONAL BYTE_ARRAY file (UTF8);
  OPTIONAL INT32 line_no;
  OPTIONAL BYTE_ARRAY function (UTF8);
  OPTIONAL INT64 stack_id;
  OPTIONAL BYTE_ARRAY name (UTF8);
  OPTIONAL BYTE_ARRAY label (UTF8);
  OPTIONAL INT64 alloc_t_ns;
  OPTIONAL INT64 free_bytes;
  OPTIONAL INT64 allocated_bytes;
  OPTIONAL INT64 reserved_bytes;
  REQUIRED BOOLEAN unmatched;
}";

const DEVICES_SCHEMA: &str = "message devices {
  REQUIRED INT64 pid;
  REQUIRED INT32 ordinal;
  REQUIRED BYTE_ARRAY name (UTF8);
  REQUIRED INT64 total_bytes;
}";

/// Writes `events.parquet`, `stacks.parquet`, `processes.parquet`, `devices.parquet`,
/// `tensors.parquet` and `growth.parquet` into `dir` (created if missing; files there of those
/// names are replaced).
pub fn export_parquet(
    trace: &Trace,
    dir: &Path,
    progress: &Progress,
) -> Result<ParquetTables, ExportError> {
    std::fs::create_dir_all(dir).map_err(|e| ExportError::Write(dir.to_path_buf(), e))?;
    let mut n = ParquetTables::default();

    let mut t = Table::create(&dir.join("processes.parquet"), PROCESSES_SCHEMA)?;
    for p in &trace.processes {
        let h = &p.header;
        t.i64(0, h.pid.into());
        t.i64(1, h.ppid.into());
        t.str(2, Some(bytes(&h.cmdline.join(" "))));
        t.str(3, Some(bytes(&h.hostname)));
        t.i64(4, h.start_unix_ns as i64);
        t.i64(5, h.start_mono_ns as i64);
        t.opt_i32(6, p.driver_version);
        t.str(7, Some(bytes(&p.path.to_string_lossy())));
        t.i64(8, p.problems.len() as i64);
        t.end_row()?;
    }
    n.processes = t.close()?;

    let mut t = Table::create(&dir.join("devices.parquet"), DEVICES_SCHEMA)?;
    for p in &trace.processes {
        for d in &p.devices {
            t.i64(0, p.pid().into());
            t.i32(1, d.ordinal);
            t.str(2, Some(bytes(&d.name)));
            t.i64(3, d.total_bytes as i64);
            t.end_row()?;
        }
    }
    n.devices = t.close()?;

    progress.pass("parquet: stacks");
    let mut t = Table::create(&dir.join("stacks.parquet"), STACKS_SCHEMA)?;
    for p in &trace.processes {
        let mut sym = StackSymbolizer::new(p);
        let mut ids: Vec<u32> = p.stacks.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            for (i, f) in sym.stack(id).into_iter().enumerate() {
                let addr = u64::from_str_radix(f.addr.trim_start_matches("0x"), 16).unwrap_or(0);
                t.i64(0, p.pid().into());
                t.i64(1, id.into());
                t.i32(2, i as i32);
                t.i64(3, addr as i64);
                t.str(4, Some(bytes(&f.module)));
                t.str(5, f.function.as_deref().map(bytes));
                t.str(6, f.file.as_deref().map(bytes));
                t.opt_i32(7, f.line.map(|l| l as i32));
                t.end_row()?;
            }
            progress.inc(1);
        }
    }
    n.stacks = t.close()?;

    progress.pass("parquet: events");
    n.events = write_events(trace, &dir.join("events.parquet"), progress)?;
    progress.pass("parquet: tensors");
    n.tensors = write_tensors(trace, &dir.join("tensors.parquet"), progress)?;
    progress.pass("parquet: growth");
    n.growth = write_growth(trace, &dir.join("growth.parquet"))?;
    Ok(n)
}

/// `growth.parquet`: each line of the growth analysis at each bucket.
fn write_growth(trace: &Trace, path: &Path) -> Result<u64, ExportError> {
    let mut t = Table::create(path, GROWTH_SCHEMA)?;
    if let Some(g) = crate::growth::of_trace(trace)? {
        for l in &g.lines {
            for (t_s, live) in g.series.t_s.iter().zip(&l.live_series) {
                t.i64(0, l.pid.into());
                t.i32(1, l.device);
                t.str(2, Some(bytes(&l.place)));
                t.str(3, Some(bytes(l.level)));
                t.str(4, Some(bytes(l.category)));
                t.str(5, Some(bytes(l.verdict.key())));
                t.f64(6, l.bytes_per_hour);
                t.f64(7, l.uncertainty_bytes_per_hour);
                t.f64(8, *t_s);
                t.i64(9, *live as i64);
                t.str(10, Some(bytes(g.verdict.key())));
                t.f64(11, g.rate_bytes_per_hour);
                t.f64(12, g.steady_from_s);
                t.f64(13, g.duration_s);
                t.end_row()?;
            }
        }
    }
    t.close()
}

fn write_events(trace: &Trace, path: &Path, progress: &Progress) -> Result<u64, ExportError> {
    let mut t = Table::create(path, EVENTS_SCHEMA)?;
    // Every string of a row comes from a small set (kinds, driver functions, interned labels
    // and names): each is encoded once and shared, so a buffered row costs no allocation.
    let mut statics: HashMap<&'static str, ByteArray> = HashMap::new();
    let mut stat = |s: &'static str| statics.entry(s).or_insert_with(|| bytes(s)).clone();
    let mut interned: HashMap<(usize, u32), ByteArray> = HashMap::new();
    let mut intern = |pi: usize, id: u32| -> Option<ByteArray> {
        let s = trace.processes[pi].string(id)?;
        Some(interned.entry((pi, id)).or_insert_with(|| bytes(s)).clone())
    };
    let mut categories: HashMap<(usize, u32, u32), ByteArray> = HashMap::new();
    let mut replay = Replayer::new();
    for (seq, (pi, item)) in trace.items()?.enumerate() {
        if seq % 4096 == 0 {
            progress.inc(4096);
        }
        let pid = i64::from(trace.processes[pi].pid());
        match item {
            Item::Annotate(a) => {
                let hit = replay.annotate(pi, &a);
                t.i64(0, pid);
                t.i64(1, a.tid.into());
                t.i64(2, a.t_ns as i64);
                t.str(3, Some(stat("annotate")));
                t.str(4, Some(stat("vramtrace_annotate")));
                t.str(5, Some(stat("device")));
                t.str(6, Some(stat("device")));
                t.i32(7, hit.map_or(-1, |h| h.device));
                t.i64(8, a.ptr as i64);
                t.i64(9, hit.map_or(0, |h| h.size) as i64);
                t.i32(10, 0);
                for c in 11..=15 {
                    t.opt_i64(c, None);
                }
                t.str(16, None);
                t.str(17, intern(pi, a.name));
                t.str(18, intern(pi, a.dtype));
                t.bool(19, hit.is_none());
                t.str(20, None);
                t.end_row()?;
            }
            Item::Event(e) => {
                let (mut size, mut device, mut mem) = (e.size, e.device, e.mem);
                let mut pool = pool_of(e.mem);
                let mut tensor = None;
                let mut unmatched = false;
                match replay.apply(pi, seq, &e) {
                    Step::Released { freed: Some(a), .. } => {
                        size = a.event.size;
                        device = a.event.device;
                        mem = a.event.mem;
                        pool = a.pool.name();
                        tensor = a.annotation;
                    }
                    Step::Released { freed: None, .. } => unmatched = e.result == 0,
                    Step::Allocated { pool: p } => pool = p.name(),
                    Step::Failed | Step::Unchanged => {}
                }
                let failed = e.kind == EventKind::AllocFailed;
                t.i64(0, pid);
                t.i64(1, e.tid.into());
                t.i64(2, e.t_ns as i64);
                t.str(3, Some(stat(e.kind.name())));
                t.str(4, Some(stat(e.api.name())));
                t.str(5, Some(stat(mem.name())));
                t.str(6, Some(stat(pool)));
                t.i32(7, device);
                t.i64(8, e.ptr as i64);
                t.i64(9, size as i64);
                t.i32(10, e.result);
                t.opt_i64(11, nonzero(e.stream));
                t.opt_i64(12, nonzero(e.aux));
                t.opt_i64(13, failed.then_some(e.free_bytes as i64));
                t.opt_i64(14, failed.then_some(e.total_bytes as i64));
                t.opt_i64(15, nonzero(e.stack.into()));
                t.str(16, intern(pi, e.label));
                t.str(17, tensor.as_ref().and_then(|a| intern(pi, a.name)));
                t.str(18, tensor.as_ref().and_then(|a| intern(pi, a.dtype)));
                t.bool(19, unmatched);
                let made = matches!(e.kind, EventKind::Alloc | EventKind::AllocFailed);
                t.str(
                    20,
                    made.then(|| {
                        categories
                            .entry((pi, e.stack, e.label))
                            .or_insert_with(|| {
                                let p = &trace.processes[pi];
                                bytes(
                                    crate::categoriser::categorise_stack(
                                        p,
                                        e.stack,
                                        e.size,
                                        p.string(e.label),
                                        None,
                                    )
                                    .category
                                    .key(),
                                )
                            })
                            .clone()
                    }),
                );
                t.end_row()?;
            }
            _ => {}
        }
    }
    t.close()
}

/// A tensor's allocation, kept until its free: what the free's row repeats.
struct Allocated {
    t_ns: u64,
    label: Option<Arc<str>>,
    name: Option<Arc<str>>,
}

fn write_tensors(trace: &Trace, path: &Path, progress: &Progress) -> Result<u64, ExportError> {
    // Pass 1: the names given to tensors (an annotation comes after the allocation it names,
    // and the allocation's row is written first), by the allocation's replay index.
    let mut live: HashMap<(usize, u64), usize> = HashMap::new();
    let mut names: HashMap<(usize, usize), Arc<str>> = HashMap::new();
    let mut any = false;
    for (seq, (pi, item)) in trace.items()?.enumerate() {
        match item {
            Item::Tensor(t) => {
                any = true;
                match t.action {
                    TensorAction::Alloc => {
                        live.insert((pi, t.ptr), seq);
                    }
                    TensorAction::Free => {
                        live.remove(&(pi, t.ptr));
                    }
                    // Restated after the size budget dropped its allocation: the first
                    // statement stands for it.
                    TensorAction::Live => {
                        live.entry((pi, t.ptr)).or_insert(seq);
                    }
                    TensorAction::AllocFailed => {}
                }
            }
            Item::Annotate(a) => {
                if let Some(&at) = live.get(&(pi, a.ptr)) {
                    let name = trace.processes[pi].tensor_name(&a);
                    names.insert((pi, at), name.into());
                }
            }
            _ => {}
        }
    }
    let mut t = Table::create(path, TENSORS_SCHEMA)?;
    if !any {
        return t.close();
    }
    // Pass 2: the rows.
    let mut replay = Replayer::new();
    let mut tensors = TensorReplay::new();
    let mut segments: HashMap<(usize, i32), BTreeMap<u64, u64>> = HashMap::new();
    let mut ranges = super::RangePaths::default();
    let mut allocated: HashMap<(usize, u64), Allocated> = HashMap::new();
    let mut lines: HashMap<(usize, u32), Option<PyLocation>> = HashMap::new();
    let mut text: HashMap<Arc<str>, ByteArray> = HashMap::new();
    let mut b = |s: &str| -> ByteArray {
        if let Some(v) = text.get(s) {
            return v.clone();
        }
        let v = bytes(s);
        text.insert(s.into(), v.clone());
        v
    };
    for (seq, (pi, item)) in trace.items()?.enumerate() {
        if seq % 4096 == 0 {
            progress.inc(4096);
        }
        let p = &trace.processes[pi];
        let e = match item {
            Item::Event(e) => {
                match replay.apply(pi, seq, &e) {
                    Step::Allocated { .. } if super::is_segment(&e) => {
                        segments
                            .entry((pi, e.device))
                            .or_default()
                            .insert(e.ptr, e.size);
                    }
                    Step::Released { freed: Some(a), .. } if super::is_segment(&a.event) => {
                        if let Some(s) = segments.get_mut(&(pi, a.event.device)) {
                            s.remove(&a.event.ptr);
                        }
                    }
                    _ => {}
                }
                continue;
            }
            Item::RangePush { .. } | Item::RangePop { .. } => {
                ranges.follow(trace, pi, &item);
                continue;
            }
            Item::Tensor(e) => e,
            _ => continue,
        };
        let step = tensors.apply(pi, seq, &e);
        if step == TensorStep::Restated(false) {
            continue; // already live here: nothing new to say
        }
        let kind = match step {
            TensorStep::Allocated => "alloc",
            // Stated live by the recorder after the size budget dropped its allocation.
            TensorStep::Restated(_) => "live",
            TensorStep::Released(_) => "free",
            TensorStep::Refused => "alloc_failed",
        };
        // What the row describes: the record itself, or for a free the allocation it freed.
        let (of, unmatched) = match &step {
            TensorStep::Released(Some(f)) => (f.event.clone(), false),
            TensorStep::Released(None) => (e.clone(), true),
            _ => (e.clone(), false),
        };
        let info = match step {
            TensorStep::Allocated | TensorStep::Restated(_) => {
                let label = ranges.label(pi, e.tid).map(Arc::from);
                let a = Allocated {
                    t_ns: e.t_ns,
                    label,
                    name: names.get(&(pi, seq)).cloned(),
                };
                let row = (a.label.clone(), a.name.clone(), None);
                allocated.insert((pi, e.ptr), a);
                row
            }
            TensorStep::Released(_) => match allocated.remove(&(pi, e.ptr)) {
                Some(a) => (a.label, a.name, Some(a.t_ns)),
                None => (None, None, None),
            },
            TensorStep::Refused => (ranges.label(pi, e.tid).map(Arc::from), None, None),
        };
        let (label, name, alloc_t) = info;
        let loc = lines
            .entry((pi, of.stack))
            .or_insert_with(|| python_locations(p, of.stack).into_iter().next())
            .clone();
        let segment = segments.get(&(pi, of.device)).and_then(|s| {
            let (&base, &size) = s.range(..=of.ptr).next_back()?;
            (of.ptr < base + size).then_some(base)
        });
        let failed = kind == "alloc_failed";
        t.i64(0, p.pid().into());
        t.i64(1, e.tid.into());
        t.i64(2, e.t_ns as i64);
        t.str(3, Some(b(kind)));
        t.i32(4, of.device);
        t.i64(5, of.ptr as i64);
        t.i64(6, of.size as i64);
        t.opt_i64(
            7,
            (!failed && of.requested != 0).then_some(of.requested as i64),
        );
        t.opt_i64(8, segment.map(|s| s as i64));
        t.str(
            9,
            Some(b(super::category_of_stack(
                p,
                of.stack,
                of.size,
                label.as_deref(),
                name.as_deref(),
            ))),
        );
        t.str(10, loc.as_ref().map(|l| b(&l.to_string())));
        t.str(11, loc.as_ref().map(|l| b(&l.file)));
        t.opt_i32(12, loc.as_ref().map(|l| l.line as i32));
        t.str(13, loc.as_ref().map(|l| b(&l.function)));
        t.opt_i64(14, nonzero(of.stack.into()));
        t.str(15, name.as_deref().map(&mut b));
        t.str(16, label.as_deref().map(&mut b));
        t.opt_i64(17, alloc_t.map(|t| t as i64));
        t.opt_i64(18, failed.then_some(e.free as i64));
        t.opt_i64(19, failed.then_some(e.allocated as i64));
        t.opt_i64(20, failed.then_some(e.reserved as i64));
        t.bool(21, unmatched);
        t.end_row()?;
    }
    t.close()
}

/// The accounting bucket of an event's memory kind (as the replay counts it).
fn pool_of(mem: MemKind) -> &'static str {
    match mem {
        MemKind::Device | MemKind::Array => "device",
        MemKind::Managed => "managed",
        MemKind::Host => "host",
        MemKind::Address => "address",
        MemKind::Mapping => "mapped",
        MemKind::Imported => "imported",
    }
}

fn nonzero(v: u64) -> Option<i64> {
    (v != 0).then_some(v as i64)
}

fn bytes(s: &str) -> ByteArray {
    ByteArray::from(s)
}

/// One buffered column: the present values, and for an optional column one definition level
/// per row (1 present, 0 NULL).
enum Column {
    I64(Vec<i64>, Option<Vec<i16>>),
    I32(Vec<i32>, Option<Vec<i16>>),
    Str(Vec<ByteArray>, Option<Vec<i16>>),
    Bool(Vec<bool>),
    F64(Vec<f64>),
}

/// A Parquet file being written row by row: rows are buffered column by column and written as
/// a row group every [`ROW_GROUP_ROWS`] rows.
struct Table {
    writer: SerializedFileWriter<BufWriter<File>>,
    columns: Vec<Column>,
    buffered: usize,
    rows: u64,
}

impl Table {
    fn create(path: &Path, schema: &str) -> Result<Table, ExportError> {
        let schema = Arc::new(parse_message_type(schema)?);
        let columns = schema
            .get_fields()
            .iter()
            .map(|f| {
                let optional = f.is_optional();
                let defs = || optional.then(Vec::new);
                match f.get_physical_type() {
                    ::parquet::basic::Type::INT64 => Column::I64(Vec::new(), defs()),
                    ::parquet::basic::Type::INT32 => Column::I32(Vec::new(), defs()),
                    ::parquet::basic::Type::BOOLEAN => Column::Bool(Vec::new()),
                    ::parquet::basic::Type::DOUBLE => Column::F64(Vec::new()),
                    _ => Column::Str(Vec::new(), defs()),
                }
            })
            .collect();
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_created_by(format!("vramtrace {}", env!("CARGO_PKG_VERSION")))
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .build();
        let file = File::create(path).map_err(|e| ExportError::Write(path.to_path_buf(), e))?;
        let writer = SerializedFileWriter::new(BufWriter::new(file), schema, Arc::new(props))?;
        Ok(Table {
            writer,
            columns,
            buffered: 0,
            rows: 0,
        })
    }

    fn i64(&mut self, c: usize, v: i64) {
        self.opt_i64(c, Some(v));
    }

    fn opt_i64(&mut self, c: usize, v: Option<i64>) {
        if let Column::I64(vals, defs) = &mut self.columns[c] {
            push(vals, defs, v);
        } else {
            unreachable!("column {c} is not INT64");
        }
    }

    fn i32(&mut self, c: usize, v: i32) {
        self.opt_i32(c, Some(v));
    }

    fn opt_i32(&mut self, c: usize, v: Option<i32>) {
        if let Column::I32(vals, defs) = &mut self.columns[c] {
            push(vals, defs, v);
        } else {
            unreachable!("column {c} is not INT32");
        }
    }

    fn str(&mut self, c: usize, v: Option<ByteArray>) {
        if let Column::Str(vals, defs) = &mut self.columns[c] {
            push(vals, defs, v);
        } else {
            unreachable!("column {c} is not BYTE_ARRAY");
        }
    }

    fn f64(&mut self, c: usize, v: f64) {
        if let Column::F64(vals) = &mut self.columns[c] {
            vals.push(v);
        } else {
            unreachable!("column {c} is not DOUBLE");
        }
    }

    fn bool(&mut self, c: usize, v: bool) {
        if let Column::Bool(vals) = &mut self.columns[c] {
            vals.push(v);
        } else {
            unreachable!("column {c} is not BOOLEAN");
        }
    }

    fn end_row(&mut self) -> Result<(), ExportError> {
        self.buffered += 1;
        if self.buffered >= ROW_GROUP_ROWS {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), ExportError> {
        if self.buffered == 0 {
            return Ok(());
        }
        let mut rg = self.writer.next_row_group()?;
        for col in &mut self.columns {
            let mut w = rg
                .next_column()?
                .expect("the schema has a column for every buffer");
            match col {
                Column::I64(v, d) => {
                    w.typed::<Int64Type>().write_batch(v, d.as_deref(), None)?;
                    clear(v, d);
                }
                Column::I32(v, d) => {
                    w.typed::<Int32Type>().write_batch(v, d.as_deref(), None)?;
                    clear(v, d);
                }
                Column::Str(v, d) => {
                    w.typed::<ByteArrayType>()
                        .write_batch(v, d.as_deref(), None)?;
                    clear(v, d);
                }
                Column::Bool(v) => {
                    w.typed::<BoolType>().write_batch(v, None, None)?;
                    v.clear();
                }
                Column::F64(v) => {
                    w.typed::<DoubleType>().write_batch(v, None, None)?;
                    v.clear();
                }
            }
            w.close()?;
        }
        rg.close()?;
        self.rows += self.buffered as u64;
        self.buffered = 0;
        Ok(())
    }

    /// Writes what is buffered and the footer; returns the rows written.
    fn close(mut self) -> Result<u64, ExportError> {
        self.flush()?;
        self.writer.close()?;
        Ok(self.rows)
    }
}

fn push<T>(vals: &mut Vec<T>, defs: &mut Option<Vec<i16>>, v: Option<T>) {
    match defs {
        Some(d) => {
            d.push(i16::from(v.is_some()));
            vals.extend(v);
        }
        None => vals.push(v.expect("a required column is given a value")),
    }
}

fn clear<T>(v: &mut Vec<T>, d: &mut Option<Vec<i16>>) {
    v.clear();
    if let Some(d) = d {
        d.clear();
    }
}
