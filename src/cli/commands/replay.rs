//! `vramtrace replay`: would this trace have fitted on another card?

use std::fmt::Write as _;
use std::path::PathBuf;

use vramtrace_models::units::{fmt_bytes, fmt_secs, parse_bytes};

use vramtrace::symbolize::StackSymbolizer;
use vramtrace::trace::Trace;
use vramtrace::whatif::{WhatIf, WhatIfOptions, what_if};

/// Arguments of `vramtrace replay`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  vramtrace replay oom-trace --capacity 24GiB --resident 1.4GiB\n  vramtrace replay h200-trace --capacity 23.5GiB --json\n\nEvery process's device allocations are replayed in time order and summed per device, as if\nthey shared one card of --capacity bytes with --resident bytes already taken outside the\ntrace (the CUDA context and modules: about 0.5 GiB per process; `nvidia-smi` shows it as the\ndifference between a process's used memory and what it allocated). The first allocation that\nwould not fit is where the program would have stopped. A caching allocator's retry after\nfreeing its cache is not modelled.\n\nExit status: 0 when everything fits, 1 when an allocation would fail, 2 on an error."
)]
pub struct ReplayArgs {
    /// A trace directory (every process in it) or one trace file.
    pub trace: PathBuf,
    /// Device memory of the card to replay against, e.g. `24GiB` or `23.5GiB`.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub capacity: u64,
    /// Bytes held outside the trace on each device (context, modules, other programs).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, default_value = "0")]
    pub resident: u64,
    /// The driver's allocation granularity: each allocation of at least this size counts as
    /// its size rounded up to a multiple of it (`2MiB` on the H200; `0` for the sizes as
    /// requested).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, default_value = "2MiB")]
    pub granularity: u64,
    /// Symbolised frames to show for the first allocation that would fail.
    #[arg(long, default_value_t = 8)]
    pub frames: usize,
    /// Points of the live-bytes-over-time series per device (it keeps each span's maximum).
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u16).range(2..=1000))]
    pub points: u16,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `vramtrace replay`: exit code 0 when everything fits, 1 when an allocation would fail.
pub fn run(args: ReplayArgs) -> anyhow::Result<i32> {
    if args.resident >= args.capacity {
        anyhow::bail!(
            "--resident ({}) leaves nothing of --capacity ({}) for the traced allocations",
            fmt_bytes(args.resident),
            fmt_bytes(args.capacity)
        );
    }
    let trace = Trace::open(&args.trace)?;
    let w = what_if(
        &trace,
        WhatIfOptions {
            capacity: args.capacity,
            resident: args.resident,
            granularity: args.granularity,
            points: usize::from(args.points) / 2,
        },
    )?;
    if args.json {
        let mut v = serde_json::to_value(&w)?;
        for (d, dv) in w
            .devices
            .iter()
            .zip(v["devices"].as_array_mut().into_iter().flatten())
        {
            if let Some(f) = &d.first_failure {
                dv["first_failure"]["frames"] =
                    serde_json::to_value(frames(&trace, f.process, f.stack, args.frames))?;
            }
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", render(&trace, &w, args.frames));
    }
    Ok(i32::from(
        w.devices.iter().any(|d| d.first_failure.is_some()),
    ))
}

fn frames(trace: &Trace, process: usize, stack: u32, n: usize) -> Vec<String> {
    if n == 0 || stack == 0 {
        return Vec::new();
    }
    StackSymbolizer::new(&trace.processes[process])
        .stack(stack)
        .iter()
        .take(n)
        .map(ToString::to_string)
        .collect()
}

/// The replay as text.
fn render(trace: &Trace, w: &WhatIf, n_frames: usize) -> String {
    let mut out = String::new();
    let budget = w.capacity - w.resident;
    let _ = writeln!(
        out,
        "replayed on a {} card with {} resident outside the trace: {} for the traced allocations",
        fmt_bytes(w.capacity),
        fmt_bytes(w.resident),
        fmt_bytes(budget)
    );
    if w.devices.is_empty() {
        out.push_str("no device allocation in the trace\n");
    }
    for d in &w.devices {
        let _ = writeln!(
            out,
            "\ndevice {}: traced peak {} at {}",
            d.device,
            fmt_bytes(d.peak_bytes),
            fmt_secs(d.peak_t_s)
        );
        match &d.first_failure {
            None => {
                let _ = writeln!(
                    out,
                    "  fits: the lowest headroom is {} (at the peak)",
                    fmt_bytes(d.min_headroom as u64)
                );
            }
            Some(f) => {
                let process = &trace.processes[f.process];
                let _ = writeln!(
                    out,
                    "  WOULD FAIL at {}: {} of {} by {}{}",
                    fmt_secs(f.t_s),
                    f.api,
                    fmt_bytes(f.size),
                    process.display_name(),
                    f.label
                        .as_deref()
                        .map(|l| format!(" in {l}"))
                        .unwrap_or_default()
                );
                let _ = writeln!(
                    out,
                    "  {} live then, {} free for it; the peak needs {} more than this card has",
                    fmt_bytes(f.live_before),
                    fmt_bytes(f.free_before),
                    fmt_bytes((-d.min_headroom) as u64)
                );
                for fr in frames(trace, f.process, f.stack, n_frames) {
                    let _ = writeln!(out, "      at {fr}");
                }
                if d.would_fail > 1 {
                    let _ = writeln!(
                        out,
                        "  {} allocations in all would not fit (a program that survives the first meets the others)",
                        d.would_fail
                    );
                }
            }
        }
        let _ = writeln!(out, "  live bytes over time (highest in each span):");
        for &(t, live) in &d.live_over_time {
            let room = budget as i128 - live as i128;
            let room = if room < 0 {
                format!("over by {}", fmt_bytes((-room) as u64))
            } else {
                format!("headroom {}", fmt_bytes(room as u64))
            };
            let _ = writeln!(out, "    {t:>10.3} s  {:>12}  {room}", fmt_bytes(live));
        }
    }
    out
}
