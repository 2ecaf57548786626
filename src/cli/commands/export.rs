//! `vramtrace export`: a trace in a format another tool opens.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use vramtrace::export::{
    FlamegraphOptions, SnapshotOptions, Weight, export_flamegraph, export_parquet, export_perfetto,
    export_pytorch, has_items,
};
use vramtrace::trace::Trace;

/// The export formats.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Parquet tables in the directory OUT: events, stacks, processes, devices.
    Parquet,
    /// A PyTorch memory snapshot pickle, for torch.cuda._memory_viz and pytorch.org/memory_viz.
    Pytorch,
    /// Chrome trace event JSON, for ui.perfetto.dev and chrome://tracing.
    Perfetto,
    /// A flamegraph SVG of device memory by native stack (folded text with --folded).
    Flamegraph,
}

/// How the flamegraph weighs stacks.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightArg {
    /// Bytes live at each process's and device's peak.
    Peak,
    /// Bytes live at each process's and device's first failed allocation.
    Oom,
    /// Every byte allocated over the trace.
    Allocated,
}

/// Arguments of `vramtrace export`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Formats, and what opens them:
  parquet     OUT is a directory (created if missing) that gets six files: events.parquet (one
              row per driver event: pid, tid, t_ns, kind, api, mem, pool, device, ptr, size,
              result, stream, aux, free_bytes, total_bytes, stack_id, label, name, dtype,
              unmatched), tensors.parquet (one row per tensor PyTorch's allocator handed out,
              took back or refused: pid, tid, t_ns, kind, device, ptr, size, requested, segment,
              category, line, file, line_no, function, stack_id, name, label, alloc_t_ns,
              free_bytes, allocated_bytes, reserved_bytes, unmatched; empty without PyTorch's
              tensors), stacks.parquet (pid, stack_id, frame 0 = innermost, address, module,
              symbol, file, line), processes.parquet (pid, ppid, command_line, host,
              start_unix_ns, start_mono_ns, driver_version, path, problems), devices.parquet
              (pid, ordinal, name, total_bytes) and growth.parquet (the growth analysis of
              `report`: one row per line and time bucket: pid, device, where, level, category,
              line_verdict, bytes_per_hour, uncertainty_bytes_per_hour, t_s, live_bytes, and the
              run's run_verdict, run_bytes_per_hour, steady_from_s, duration_s). Integers are INT64/INT32, text UTF8, times INT64
              nanoseconds (t_ns is CLOCK_MONOTONIC, like start_mono_ns). Opens in DuckDB,
              pyarrow, polars:
                duckdb -c \"SELECT kind, count(*), sum(size) FROM 'OUT/events.parquet' GROUP BY kind\"
                duckdb -c \"SELECT line, sum(size) FROM 'OUT/tensors.parquet' WHERE kind = 'alloc' GROUP BY line\"
              Many servers' traces, each exported to exports/NAME, ranked by growth rate:
                duckdb -c \"SELECT filename, any_value(run_verdict), any_value(run_bytes_per_hour) AS rate FROM read_parquet('exports/*/growth.parquet', filename = true) GROUP BY filename ORDER BY rate DESC\"
  pytorch     OUT is the pickled dict torch.cuda.memory._snapshot() returns. With PyTorch's
              tensors recorded (the PyTorch probe, or an imported snapshot), segments are split
              into the tensors' blocks and the free gaps, and the device trace has alloc,
              free_requested, free_completed, segment_alloc, segment_free and oom entries with
              the tensors' Python frames; otherwise each driver allocation is a segment with one
              block. One process per snapshot (--pid; default: the one with the highest device
              peak); the state at the end, or at --until SECONDS; each device trace keeps its
              newest --max-entries entries (default 100000). Open it on pytorch.org/memory_viz,
              or: python -m torch.cuda._memory_viz trace_plot OUT -o out.html
  perfetto    OUT is Chrome trace event JSON: a live-bytes counter per process and device, a
              slice per allocation lifetime (named by tensor, label or driver function), with
              PyTorch's tensors a tensor-bytes counter per device by category and a slice per
              tensor (named by its name or Python line), an instant per failed allocation,
              ranges and marks. Open it on ui.perfetto.dev or in
              chrome://tracing.
  flamegraph  OUT is an SVG (any browser) of device memory by allocating native stack, weighed
              by --weight: peak (bytes live at each process's and device's peak, the default),
              oom (bytes live at the first failed allocation) or allocated (every byte ever
              allocated). --folded writes the folded stacks instead (inferno, flamegraph.pl,
              speedscope).

An existing OUT is only replaced with --force. Progress goes to stderr when it is a terminal.
Examples:
  vramtrace export trace-dir --format parquet -o tables/
  vramtrace export trace-dir --format pytorch -o snapshot.pickle
  vramtrace export trace-dir --format flamegraph --weight oom -o oom.svg")]
pub struct ExportArgs {
    /// A trace directory (every process in it) or one trace file.
    pub trace: PathBuf,
    /// The output format.
    #[arg(long, short = 'f', value_enum)]
    pub format: Format,
    /// Where to write: a file, or for parquet a directory.
    #[arg(long, short = 'o', value_name = "OUT")]
    pub output: PathBuf,
    /// Replace OUT (for parquet: the six table files in it) if it exists.
    #[arg(long)]
    pub force: bool,
    /// pytorch: the process to snapshot (default: the one with the highest device peak).
    #[arg(long)]
    pub pid: Option<u32>,
    /// pytorch: keep only the newest N entries of each device trace, as PyTorch's own history
    /// does (0: keep all; each entry repeats its stack, so a long trace makes a large file).
    #[arg(long, value_name = "N", default_value_t = vramtrace::export::pytorch::DEFAULT_MAX_ENTRIES)]
    pub max_entries: u64,
    /// pytorch: the snapshot as of this moment (what `_snapshot()` taken then would show), not
    /// the trace's end: SECONDS into the trace, or @TIME_US, microseconds since the Unix epoch
    /// as a snapshot's `time_us` (the moment is included).
    #[arg(long, value_name = "SECONDS|@TIME_US")]
    pub until: Option<String>,
    /// flamegraph: how stacks are weighed.
    #[arg(long, value_enum, default_value = "peak")]
    pub weight: WeightArg,
    /// flamegraph: write folded stacks (text) instead of an SVG.
    #[arg(long)]
    pub folded: bool,
}

const PARQUET_FILES: [&str; 6] = [
    "events.parquet",
    "tensors.parquet",
    "stacks.parquet",
    "processes.parquet",
    "devices.parquet",
    "growth.parquet",
];

/// Runs `vramtrace export`.
pub fn run(args: ExportArgs) -> anyhow::Result<i32> {
    let trace = Trace::open(&args.trace)?;
    vramtrace::trace::warn_dropped(&trace);
    for p in &trace.processes {
        for prob in &p.problems {
            eprintln!("vramtrace: warning: {}: {prob}", p.path.display());
        }
    }
    if !has_items(&trace)? {
        bail!(
            "{} holds {} process(es) but no recorded event: nothing to export (did the program \
             allocate device memory while recording?)",
            args.trace.display(),
            trace.processes.len()
        );
    }
    let out = &args.output;
    if args.format == Format::Parquet {
        if out.exists() && !out.is_dir() {
            bail!(
                "{} exists and is not a directory: parquet writes six files into a directory",
                out.display()
            );
        }
        let taken: Vec<String> = PARQUET_FILES
            .iter()
            .map(|f| out.join(f))
            .filter(|p| p.exists())
            .map(|p| p.display().to_string())
            .collect();
        if !taken.is_empty() && !args.force {
            bail!(
                "{} already exist(s): pass --force to replace",
                taken.join(", ")
            );
        }
        let progress = crate::progress::stderr("parquet");
        let n = export_parquet(&trace, out, &progress)
            .with_context(|| format!("exporting to {}", out.display()))?;
        progress.finish();
        eprintln!(
            "vramtrace: wrote {} events, {} tensor events, {} stack frames, {} processes, {} \
             devices, {} growth samples into {}",
            n.events,
            n.tensors,
            n.stacks,
            n.processes,
            n.devices,
            n.growth,
            out.display()
        );
        return Ok(0);
    }
    if out.is_dir() {
        bail!("{} is a directory: give a file name", out.display());
    }
    if out.exists() && !args.force {
        bail!(
            "{} already exists: pass --force to replace it",
            out.display()
        );
    }
    let mut w = create(out)?;
    let what = match args.format {
        Format::Parquet => unreachable!("handled above"),
        Format::Pytorch => {
            let progress = crate::progress::stderr("pytorch");
            let until_ns = args
                .until
                .as_deref()
                .map(|s| until_ns(&trace, s))
                .transpose()?;
            let opts = SnapshotOptions {
                pid: args.pid,
                max_entries: (args.max_entries > 0).then_some(args.max_entries),
                until_ns,
            };
            let n = export_pytorch(&trace, &opts, &mut w, &progress);
            progress.finish();
            let n = n.with_context(|| format!("exporting to {}", out.display()));
            let n = remove_on_error(out, n)?;
            if !n.others.is_empty() && args.pid.is_none() {
                let others: Vec<String> = n.others.iter().map(u32::to_string).collect();
                eprintln!(
                    "vramtrace: the snapshot is of process {}; {} also allocated device \
                     memory (export each with --pid)",
                    n.pid,
                    others.join(", ")
                );
            }
            let level = if n.tensor_level {
                "PyTorch's tensors"
            } else {
                "driver allocations (no PyTorch tensor recorded)"
            };
            format!(
                "process {}, {level}: {} segments holding {} blocks, {} trace entries ({} alloc, \
                 {} oom)",
                n.pid, n.segments, n.blocks, n.entries, n.allocs, n.ooms
            )
        }
        Format::Perfetto => {
            let progress = crate::progress::stderr("perfetto");
            let n = export_perfetto(&trace, &mut w, &progress);
            progress.finish();
            let n = remove_on_error(
                out,
                n.with_context(|| format!("exporting to {}", out.display())),
            )?;
            format!(
                "{} counter samples, {} allocation slices, {} tensor counter samples, {} tensor \
                 slices, {} failures",
                n.counters, n.slices, n.tensor_counters, n.tensor_slices, n.failures
            )
        }
        Format::Flamegraph => {
            let opts = FlamegraphOptions {
                weight: match args.weight {
                    WeightArg::Peak => Weight::Peak,
                    WeightArg::Oom => Weight::Oom,
                    WeightArg::Allocated => Weight::Allocated,
                },
                folded: args.folded,
                title: None,
            };
            let progress = crate::progress::stderr("flamegraph");
            let n = export_flamegraph(&trace, &opts, &mut w, &progress);
            progress.finish();
            let n = remove_on_error(
                out,
                n.with_context(|| format!("exporting to {}", out.display())),
            )?;
            format!("{} weighed", vramtrace_models::units::fmt_bytes(n))
        }
    };
    w.flush()
        .with_context(|| format!("cannot write {}", out.display()))?;
    eprintln!("vramtrace: wrote {}: {what}", out.display());
    Ok(0)
}

/// `--until`: seconds into the trace, or `@TIME_US` (wall clock, µs since the Unix epoch, the
/// clock of a snapshot's `time_us`; read through the first process's start times, the moment
/// itself included), as the trace's `CLOCK_MONOTONIC` ns.
fn until_ns(trace: &Trace, s: &str) -> anyhow::Result<u64> {
    if let Some(us) = s.strip_prefix('@') {
        let us: u64 = us.parse().with_context(|| {
            format!("--until {s}: {us:?} is not a whole number of microseconds")
        })?;
        let Some(h) = trace.processes.first().map(|p| &p.header) else {
            bail!("--until {s}: the trace has no process");
        };
        let wall_ns = (us as i128 + 1) * 1000 - 1;
        let mono = wall_ns - h.start_unix_ns as i128 + h.start_mono_ns as i128;
        return Ok(mono.clamp(0, u64::MAX as i128) as u64);
    }
    match s.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs >= 0.0 => {
            Ok(trace.start_ns().saturating_add((secs * 1e9) as u64))
        }
        _ => bail!(
            "--until {s}: give the seconds into the trace (0 or more, e.g. 29.5) or @TIME_US \
             (microseconds since the Unix epoch, as a snapshot's time_us)"
        ),
    }
}

fn create(path: &Path) -> anyhow::Result<BufWriter<File>> {
    let f = File::create(path).with_context(|| {
        format!(
            "cannot create {} (does its directory exist, and is it writable?)",
            path.display()
        )
    })?;
    Ok(BufWriter::new(f))
}

/// A failed export leaves no half-written file behind.
fn remove_on_error<T>(path: &Path, r: anyhow::Result<T>) -> anyhow::Result<T> {
    if r.is_err() {
        let _ = std::fs::remove_file(path);
    }
    r
}
