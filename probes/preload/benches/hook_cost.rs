//! What the preload costs per `cuMemAlloc_v2` + `cuMemFree_v2` pair on the stand-in driver,
//! side by side with the bare driver call, in one run:
//!
//! ```text
//! cargo bench -p vramtrace-preload
//! ```
//!
//! Each configuration runs the same C loop (`tests/c/bench_loop.c`) in its own process: bare,
//! preloaded with recording off (pass-through only), preloaded recording without native stacks
//! (`VRAMTRACE_STACKS=0`), and recording with stacks (the default). The last two give the cost
//! of capturing a stack per event.
//! The configurations alternate over several trials and each keeps its best, so a noisy moment
//! of the machine does not land on one side only.
//!
//! Then the targets of the performance issue, each as target, measured value and verdict:
//! hook overhead per pair without stacks and with a 32-frame native stack (`bench_loop.c` at
//! that depth, bare against recording), recording throughput from 1 and 8 threads
//! (`throughput.c`; the events read back from the trace must equal the events made), and
//! trace bytes per event (file size over events, from the 1-thread throughput run with
//! stacks).

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Command;

use common::*;
use vramtrace_format::FileReader;

const PAIRS: &str = "20000";
const ROUNDS: &str = "5";
const TRIALS: usize = 3;
/// Extra frames for the deep-stack measurement (PyTorch's allocation stacks are 40 to 60 deep).
const DEEP: u32 = 40;
/// Extra frames for the 32-frame target: the loop itself sits about 3 frames above `_start`
/// (`_start`, `__libc_start_main`, `main`), the hook adds its own below.
const TARGET_DEPTH: u32 = 29;
/// Pairs per thread in the throughput runs.
const THROUGHPUT_PAIRS: u64 = 500_000;

fn run(cmd: Command) -> f64 {
    run_deep(cmd, 0)
}

fn run_deep(mut cmd: Command, depth: u32) -> f64 {
    cmd.args([PAIRS, ROUNDS, &depth.to_string()]);
    run_ok(cmd).trim().parse().expect("ns per pair")
}

fn main() {
    let s = Scratch::new("bench");
    let exe = compile(&s, "bench_loop", true);
    let throughput_exe = compile(&s, "throughput", true);
    let bare = || {
        let mut c = Command::new(&exe);
        c.env("LD_LIBRARY_PATH", driver_dir())
            .env_remove("LD_PRELOAD");
        c
    };
    let passthrough = || {
        let mut c = traced(&exe, &s.trace_dir());
        c.env_remove("VRAMTRACE_DIR");
        c
    };
    let recording_of = |exe: &std::path::Path, stacks: bool| {
        let _ = std::fs::remove_dir_all(s.trace_dir());
        let mut c = traced(exe, &s.trace_dir());
        c.env("VRAMTRACE_STACKS", if stacks { "1" } else { "0" });
        c
    };
    let recording = |stacks: bool| recording_of(&exe, stacks);

    let mut best = [f64::MAX; 6];
    for _ in 0..TRIALS {
        best[0] = best[0].min(run(bare()));
        best[1] = best[1].min(run(passthrough()));
        best[2] = best[2].min(run(recording(false)));
        best[3] = best[3].min(run(recording(true)));
        best[4] = best[4].min(run_deep(recording(false), DEEP));
        best[5] = best[5].min(run_deep(recording(true), DEEP));
    }
    let [b, p, r, st, deep_r, deep_st] = best;
    println!(
        "cuMemAlloc_v2 + cuMemFree_v2 (1 MiB) on the stand-in driver, best of {TRIALS} trials:"
    );
    println!("  bare driver                 {b:>9.1} ns/pair");
    println!(
        "  preload, recording off      {p:>9.1} ns/pair  ({:.2}x, {:+.1} ns)",
        p / b,
        p - b
    );
    println!(
        "  preload, recording, no stacks {r:>7.1} ns/pair  ({:.2}x, {:+.1} ns; {:.1} ns per event)",
        r / b,
        r - b,
        (r - b) / 2.0
    );
    println!(
        "  preload, recording, stacks  {st:>9.1} ns/pair  ({:.2}x, {:+.1} ns; {:.1} ns per event)",
        st / b,
        st - b,
        (st - b) / 2.0
    );
    println!(
        "  native stack capture: {:.1} ns per event at the loop's own depth (about 8 frames), \
         {:.1} ns with {DEEP} more frames",
        (st - r) / 2.0,
        (deep_st - deep_r) / 2.0
    );

    // The issue's targets.
    let mut bare32 = f64::MAX;
    let mut st32 = f64::MAX;
    for _ in 0..TRIALS {
        bare32 = bare32.min(run_deep(bare(), TARGET_DEPTH));
        st32 = st32.min(run_deep(recording(true), TARGET_DEPTH));
    }
    let throughput = |threads: u32, stacks: bool| -> (f64, u64, u64, u64) {
        let mut best = (0.0, 0, 0, 0);
        for _ in 0..TRIALS {
            let mut c = recording_of(&throughput_exe, stacks);
            c.args([threads.to_string(), THROUGHPUT_PAIRS.to_string()]);
            let ns: f64 = run_ok(c).trim().parse().expect("ns");
            let made = threads as u64 * THROUGHPUT_PAIRS * 2;
            let (read, bytes) = read_back(&s.trace_dir());
            let rate = made as f64 / ns * 1e9;
            if rate > best.0 {
                best = (rate, made, read, bytes);
            }
        }
        best
    };
    let (rate1, made1, read1, bytes1) = throughput(1, true);
    let (rate1n, made1n, read1n, _) = throughput(1, false);
    let (rate8, made8, read8, _) = throughput(8, false);
    let per_event = bytes1 as f64 / read1 as f64;
    println!();
    println!("Targets (issue 12), best of {TRIALS} trials each:");
    println!(
        "  {:<52} {:>12} {:>16}  verdict",
        "target", "measured", "ratio"
    );
    let row = |name: &str, target: &str, measured: String, ratio: f64, met: bool| {
        println!(
            "  {:<52} {:>12} {:>15.2}x  {}",
            format!("{name} ({target})"),
            measured,
            ratio,
            if met { "met" } else { "NOT MET" }
        );
    };
    let over = r - b;
    row(
        "hook overhead per pair, no stacks",
        "<= 100 ns",
        format!("{over:.1} ns"),
        over / 100.0,
        over <= 100.0,
    );
    let over32 = st32 - bare32;
    row(
        "hook overhead per pair, 32-frame stack",
        "<= 1000 ns",
        format!("{over32:.1} ns"),
        over32 / 1000.0,
        over32 <= 1000.0,
    );
    for (name, rate, made, read, target) in [
        (
            "throughput, 1 thread, no stacks",
            rate1n,
            made1n,
            read1n,
            5e6,
        ),
        ("throughput, 1 thread, stacks", rate1, made1, read1, 5e6),
        (
            "throughput, 8 threads, no stacks",
            rate8,
            made8,
            read8,
            10e6,
        ),
    ] {
        row(
            &format!("{name}, {read}/{made} events read back"),
            &format!(">= {} M/s", target / 1e6),
            format!("{:.2} M/s", rate / 1e6),
            rate / target,
            rate >= target && read == made,
        );
    }
    row(
        "trace bytes per event (1 thread, stacks)",
        "<= 32 B",
        format!("{per_event:.1} B"),
        per_event / 32.0,
        per_event <= 32.0,
    );
}

/// The events in the one trace of `dir` (read back by streaming) and the file's size.
fn read_back(dir: &std::path::Path) -> (u64, u64) {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("trace directory")
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "one trace file");
    let path = files.pop().unwrap();
    let f = FileReader::open(&path).expect("trace");
    let mut timed = f.timed().expect("trace");
    let events = timed
        .by_ref()
        .filter(|r| matches!(r, vramtrace_format::Record::Event(_)))
        .count() as u64;
    assert!(timed.problems().is_empty(), "{:?}", timed.problems());
    (events, std::fs::metadata(&path).unwrap().len())
}
