//! `vramtrace events`: the trace as JSON lines.

use std::path::PathBuf;

use vramtrace::events::write_events;
use vramtrace::trace::Trace;

/// Arguments of `vramtrace events`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Each line is one JSON object with at least t_ns, pid, tid, device, kind, mem, api, ptr, size and\nresult; failed allocations add free_bytes and total_bytes; a release carries the size it released.\nExample: vramtrace events trace-dir | jq 'select(.kind == \"alloc_failed\")'"
)]
pub struct EventsArgs {
    /// A trace directory (every process in it) or one trace file.
    pub trace: PathBuf,
    /// Add the symbolised native stack of each event (`frames`, innermost first).
    #[arg(long)]
    pub stacks: bool,
}

/// Runs `vramtrace events`.
pub fn run(args: EventsArgs) -> anyhow::Result<i32> {
    let trace = Trace::open(&args.trace)?;
    vramtrace::trace::warn_unreadable(&trace);
    for p in &trace.processes {
        for prob in &p.problems {
            eprintln!("vramtrace: warning: {}: {prob}", p.path.display());
        }
    }
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    write_events(&trace, args.stacks, &mut out)?;
    Ok(0)
}
