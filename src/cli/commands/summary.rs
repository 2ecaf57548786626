//! `vramtrace summary`: peaks, the live set at each peak, and every failed allocation.

use std::path::PathBuf;

use vramtrace::summary::{SummaryOptions, render, summarize};
use vramtrace::trace::Trace;

/// Arguments of `vramtrace summary`.
#[derive(clap::Args, Debug)]
pub struct SummaryArgs {
    /// A trace directory (every process in it) or one trace file.
    pub trace: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// How many of the largest live allocations to list at a peak or failure.
    #[arg(long, default_value_t = vramtrace::summary::DEFAULT_TOP)]
    pub top: usize,
    /// How many symbolised frames to show per listed allocation (0: none).
    #[arg(long, default_value_t = 8)]
    pub frames: usize,
}

/// Runs `vramtrace summary`.
pub fn run(args: SummaryArgs) -> anyhow::Result<i32> {
    let trace = Trace::open(&args.trace)?;
    let s = summarize(
        &trace,
        SummaryOptions {
            top: args.top,
            frames: args.frames,
        },
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", render(&s, true));
    }
    Ok(0)
}
