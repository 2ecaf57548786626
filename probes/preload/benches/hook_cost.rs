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
//! Then the targets of the performance issue, each as target, measured value, ratio and
//! verdict: hook overhead per pair without stacks and with a 32-frame native stack
//! (`bench_loop.c` at that depth, bare against recording; stacks are captured for the
//! allocation, not the release, as by default), recording throughput from 1 and 8 threads,
//! and trace bytes per event (file size over events, from the 1-thread throughput run with
//! stacks).
//!
//! Throughput runs `throughput.c` (T threads × N pairs, started together, wall time from the
//! start to the last thread's end) bare and traced, alternating. Two figures per
//! configuration, each against the target: the rate traced end to end (events / traced wall
//! time: program, stand-in driver and recorder together, so never above the bare driver's own
//! rate, printed beside it), and the recorder's capacity, events / (traced − bare wall time):
//! the rate the recorder itself keeps up with. Every traced trial must read back every event
//! it made (`FileReader::timed`), or neither figure is met.
//!
//! `VRAMTRACE_BENCH_TRIALS=N` runs N trials instead of 3 (a busy machine needs more).

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Command;

use common::*;
use vramtrace_format::FileReader;

const PAIRS: &str = "20000";
const ROUNDS: &str = "5";
const DEFAULT_TRIALS: usize = 3;
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
    let trials = std::env::var("VRAMTRACE_BENCH_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(DEFAULT_TRIALS);
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
    for _ in 0..trials {
        best[0] = best[0].min(run(bare()));
        best[1] = best[1].min(run(passthrough()));
        best[2] = best[2].min(run(recording(false)));
        best[3] = best[3].min(run(recording(true)));
        best[4] = best[4].min(run_deep(recording(false), DEEP));
        best[5] = best[5].min(run_deep(recording(true), DEEP));
    }
    let [b, p, r, st, deep_r, deep_st] = best;
    println!(
        "cuMemAlloc_v2 + cuMemFree_v2 (1 MiB) on the stand-in driver, best of {trials} trials:"
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
        "  native stack capture (allocations only, by default): {:.1} ns per stack at the \
         loop's own depth (about 8 frames), {:.1} ns with {DEEP} more frames",
        st - r,
        deep_st - deep_r
    );

    // The issue's targets.
    let mut bare32 = f64::MAX;
    let mut st32 = f64::MAX;
    let mut free32 = f64::MAX;
    for _ in 0..trials {
        bare32 = bare32.min(run_deep(bare(), TARGET_DEPTH));
        st32 = st32.min(run_deep(recording(true), TARGET_DEPTH));
        let mut c = recording(true);
        c.env("VRAMTRACE_FREE_STACKS", "1");
        free32 = free32.min(run_deep(c, TARGET_DEPTH));
    }
    // Throughput: the same program bare and traced, alternating, each keeping its shortest
    // wall time. The traced rate is end to end (the program, the stand-in driver and the
    // recorder together); the recorder's capacity is events / (traced time - bare time), the
    // rate it could keep up with if the driver cost nothing.
    let throughput = |threads: u32, stacks: bool| -> Throughput {
        let made = threads as u64 * THROUGHPUT_PAIRS * 2;
        let args = [threads.to_string(), THROUGHPUT_PAIRS.to_string()];
        let mut t = Throughput {
            made,
            bare_ns: f64::MAX,
            traced_ns: f64::MAX,
            read: made,
            bytes: 0,
        };
        for _ in 0..trials {
            let mut c = Command::new(&throughput_exe);
            c.env("LD_LIBRARY_PATH", driver_dir())
                .env_remove("LD_PRELOAD")
                .args(&args);
            t.bare_ns = t.bare_ns.min(run_ok(c).trim().parse().expect("ns"));
            let mut c = recording_of(&throughput_exe, stacks);
            c.args(&args);
            let ns: f64 = run_ok(c).trim().parse().expect("ns");
            let (read, bytes) = read_back(&s.trace_dir());
            // Every trial must read back every event, not only the fastest.
            t.read = t.read.min(read);
            if ns < t.traced_ns {
                t.traced_ns = ns;
                t.bytes = bytes;
            }
        }
        t
    };
    let t1 = throughput(1, true);
    let t1n = throughput(1, false);
    let t8 = throughput(8, false);
    let per_event = t1.bytes as f64 / t1.read as f64;
    println!();
    println!(
        "Targets (issue 12), best of {trials} trials each. Ratio: measured / target for costs, \
         target / measured for rates; at or below 1 meets the target."
    );
    println!(
        "  {:<78} {:>10} {:>11} {:>6}  verdict",
        "what", "target", "measured", "ratio"
    );
    let row = |name: &str, target: &str, measured: String, ratio: f64, met: bool| {
        println!(
            "  {:<78} {:>10} {:>11} {:>6.2}  {}",
            name,
            target,
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
        "hook overhead per pair, 32-frame stack (allocation's)",
        "<= 1000 ns",
        format!("{over32:.1} ns"),
        over32 / 1000.0,
        over32 <= 1000.0,
    );
    let overf = free32 - bare32;
    row(
        "hook overhead per pair, 32-frame stacks on both (VRAMTRACE_FREE_STACKS=1)",
        "<= 1000 ns",
        format!("{overf:.1} ns"),
        overf / 1000.0,
        overf <= 1000.0,
    );
    for (name, t, target) in [
        ("1 thread, no stacks", &t1n, 5e6),
        ("1 thread, stacks", &t1, 5e6),
        ("8 threads, no stacks", &t8, 10e6),
    ] {
        let lossless = t.read == t.made;
        row(
            &format!(
                "traced end to end, {name} (bare driver {:.2} M/s), {}/{} read back",
                t.made as f64 / t.bare_ns * 1e3,
                t.read,
                t.made
            ),
            &format!(">= {} M/s", target / 1e6),
            format!("{:.2} M/s", t.rate() / 1e6),
            target / t.rate(),
            t.rate() >= target && lossless,
        );
        row(
            &format!("recorder capacity, {name}: events / (traced - bare time)"),
            &format!(">= {} M/s", target / 1e6),
            format!("{:.2} M/s", t.capacity() / 1e6),
            target / t.capacity(),
            t.capacity() >= target && lossless,
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

/// One throughput configuration: events made per run, the shortest bare and traced wall
/// times, the fewest events read back from a traced run, and the trace's size.
struct Throughput {
    made: u64,
    bare_ns: f64,
    traced_ns: f64,
    read: u64,
    bytes: u64,
}

impl Throughput {
    /// Events per second, end to end under the recorder.
    fn rate(&self) -> f64 {
        self.made as f64 / self.traced_ns * 1e9
    }

    /// Events per second of the recorder's own time: what it adds over the bare run.
    fn capacity(&self) -> f64 {
        let extra = self.traced_ns - self.bare_ns;
        if extra <= 0.0 {
            f64::INFINITY
        } else {
            self.made as f64 / extra * 1e9
        }
    }
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
