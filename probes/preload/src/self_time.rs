//! Native tensor capture timing its own steps, for a cost that a benchmark shows but does not
//! explain (`VRAMTRACE_SELF_TIME=1`; docs/performance.md). Each step is timed with two clock
//! readings and summed process-wide; `vramtrace_self_time` hands the sums to the Python probe,
//! whose `VRAMTRACE_TORCH_PROBE_STATS` line prints them. Off, a step costs one relaxed load.

use std::sync::atomic::{AtomicU64, Ordering};

/// The steps timed.
#[derive(Clone, Copy)]
pub(crate) enum Step {
    /// PyTorch's trace tracker calling into the preload (`torch_tracker::on_trace`).
    Tracker = 0,
    /// libc10's own `reportMemoryUsageToProfiler`, which the preload's stands in front of.
    Libc10 = 1,
    /// The preload's part of a report: the tensor record, frames and write included.
    Report = 2,
    /// Of that, the Python frames (`stacks::capture_python`).
    Frames = 3,
    /// Of that, encoding the record and writing it into the trace's mapping.
    Write = 4,
    /// Of that, keeping the live-tensor table in step (under a size budget).
    Table = 5,
    /// Of the frames, a stack the thread's memo did not hold: the checked walk, the description
    /// of every frame and the stack table.
    Miss = 6,
}

const STEPS: usize = 7;
static NS: [AtomicU64; STEPS] = [const { AtomicU64::new(0) }; STEPS];
static COUNT: [AtomicU64; STEPS] = [const { AtomicU64::new(0) }; STEPS];

/// Times one step until dropped (nothing when `VRAMTRACE_SELF_TIME` is off).
pub(crate) struct Timer(Option<(Step, u64)>);

#[inline]
pub(crate) fn start(step: Step) -> Timer {
    Timer(crate::config::self_time().then(|| (step, crate::clock::now_ns())))
}

impl Drop for Timer {
    // Inlined: off, a timer's end is one test (as a call it was 0.6% of the stand-in bench's
    // samples under `perf`).
    #[inline]
    fn drop(&mut self) {
        if let Some((step, t0)) = self.0 {
            add(step, t0);
        }
    }
}

#[cold]
fn add(step: Step, t0: u64) {
    let dt = crate::clock::now_ns().saturating_sub(t0);
    NS[step as usize].fetch_add(dt, Ordering::Relaxed);
    COUNT[step as usize].fetch_add(1, Ordering::Relaxed);
}

/// `uint32_t vramtrace_self_time(uint64_t *out, uint32_t n)`: writes up to `n` pairs
/// (nanoseconds, count), one per step in [`Step`]'s order (tracker, libc10, report, frames,
/// write, table, miss);
/// returns the number of steps.
///
/// # Safety
/// `out` must have room for `2 * n` values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramtrace_self_time(out: *mut u64, n: u32) -> u32 {
    if !out.is_null() {
        for i in 0..STEPS.min(n as usize) {
            // Safety: the caller gives room for 2 * n values.
            unsafe {
                *out.add(2 * i) = NS[i].load(Ordering::Relaxed);
                *out.add(2 * i + 1) = COUNT[i].load(Ordering::Relaxed);
            }
        }
    }
    STEPS as u32
}
