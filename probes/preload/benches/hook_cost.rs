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

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Command;

use common::*;

const PAIRS: &str = "20000";
const ROUNDS: &str = "5";
const TRIALS: usize = 3;
/// Extra frames for the deep-stack measurement (PyTorch's allocation stacks are 40 to 60 deep).
const DEEP: u32 = 40;

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
    let recording = |stacks: bool| {
        let _ = std::fs::remove_dir_all(s.trace_dir());
        let mut c = traced(&exe, &s.trace_dir());
        c.env("VRAMTRACE_STACKS", if stacks { "1" } else { "0" });
        c
    };

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
}
