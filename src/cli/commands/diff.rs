//! `vramtrace diff`: peak and live-set differences between two traces.

use std::path::PathBuf;

use vramtrace::diff::{DEFAULT_FRAMES, DiffOptions, diff, render};
use vramtrace::trace::Trace;

/// Arguments of `vramtrace diff`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  vramtrace diff traces/vllm-0.10 traces/vllm-0.20\n  vramtrace diff chunk-4128 chunk-2064 --json\n\nPer device ordinal: each trace's peak (the process with the highest peak on it), the live\nset at each peak grouped by name and label (numbers that index layers and chunks collapsed\nto #) and by the top frames of the stack, with A bytes, B bytes and B - A, largest\ndifferences first; and the failed allocations of each."
)]
pub struct DiffArgs {
    /// The first trace directory or file (A).
    pub a: PathBuf,
    /// The second trace directory or file (B).
    pub b: PathBuf,
    /// Frames of each stack that make its group.
    #[arg(long, default_value_t = DEFAULT_FRAMES)]
    pub frames: usize,
    /// Groups listed per table (JSON lists all).
    #[arg(long, default_value_t = 15)]
    pub top: usize,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Runs `vramtrace diff`.
pub fn run(args: DiffArgs) -> anyhow::Result<i32> {
    let a = Trace::open(&args.a)?;
    vramtrace::trace::warn_unreadable(&a);
    let b = Trace::open(&args.b)?;
    vramtrace::trace::warn_unreadable(&b);
    let d = diff(
        &a,
        &b,
        DiffOptions {
            frames: args.frames,
        },
    )?;
    if args.json {
        let v = serde_json::json!({"a": args.a, "b": args.b, "devices": d.devices});
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!(
            "{}",
            render(
                &d,
                &args.a.display().to_string(),
                &args.b.display().to_string(),
                args.top
            )
        );
    }
    Ok(0)
}
