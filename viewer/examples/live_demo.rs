//! The live view on made-up data, to try the keys in a real terminal:
//! `cargo run -p vramtrace-viewer --example live_demo [-- --panic-after TICKS]`.
//! With `--panic-after` the source panics after that many ticks, to show
//! that the terminal is restored on a panic too.

use vramtrace_viewer::model::{
    BreakdownEntry, DeviceInfo, FailedAllocation, LiveAllocation, LiveSnapshot, NvmlPanel,
    ProcessInfo, SnapshotQuery, TimelinePoint, Update,
};
use vramtrace_viewer::tui::{LiveSource, RunOptions, ViewOptions, run};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// A prefill that climbs chunk by chunk and fails every 60th tick.
struct Demo {
    tick: u64,
    panic_after: Option<u64>,
}

impl Demo {
    fn live(t: u64) -> u64 {
        14 * GIB + (t % 60) * 150 * MIB
    }
}

impl LiveSource for Demo {
    fn poll(&mut self) -> Vec<Update> {
        self.tick += 1;
        if self.panic_after.is_some_and(|n| self.tick > n) {
            panic!("the demo source panicked on purpose at tick {}", self.tick);
        }
        let t = self.tick;
        let mut updates = Vec::new();
        if t == 1 {
            updates.push(Update::Process(ProcessInfo {
                pid: 4242,
                parent: Some(1),
                command: "python prefill.py --tokens 4128".into(),
            }));
            updates.push(Update::Device(DeviceInfo {
                ordinal: 0,
                name: "NVIDIA H200".into(),
                total_bytes: 143_771 * MIB,
            }));
            updates.push(Update::Notice("demo data, not a trace".into()));
        }
        updates.push(Update::Sample {
            device: 0,
            point: TimelinePoint::new(t as f64 * 0.1, Self::live(t)),
        });
        if t % 60 == 59 {
            updates.push(Update::Failure(FailedAllocation {
                time_s: t as f64 * 0.1,
                device: 0,
                pid: 4242,
                request_bytes: 6 * GIB,
                free_bytes: Some(GIB),
                label: "gdn.h".into(),
                error: "CUDA_ERROR_OUT_OF_MEMORY".into(),
            }));
        }
        updates.push(Update::Nvml {
            device: 0,
            panel: NvmlPanel::Unavailable("demo: NVML is not asked".into()),
        });
        updates
    }

    fn snapshot(&mut self, query: &SnapshotQuery) -> Option<LiveSnapshot> {
        let t = (query.time_s / 0.1).round() as u64;
        let act = Self::live(t) - 14 * GIB;
        let stack = |top: &str| {
            vec![
                "cuMemAlloc_v2".into(),
                top.to_string(),
                "main (prefill.py:9)".into(),
            ]
        };
        Some(LiveSnapshot {
            time_s: query.time_s,
            largest: vec![
                LiveAllocation {
                    size_bytes: 10 * GIB,
                    name: "weights".into(),
                    driver_function: "cuMemAlloc_v2".into(),
                    age_s: query.time_s,
                    top_frame: "load (loader.py:12)".into(),
                    stack: stack("load (loader.py:12)"),
                },
                LiveAllocation {
                    size_bytes: 4 * GIB,
                    name: "KV cache".into(),
                    driver_function: "cuMemCreate".into(),
                    age_s: query.time_s,
                    top_frame: "allocate_kv (cache.py:40)".into(),
                    stack: stack("allocate_kv (cache.py:40)"),
                },
                LiveAllocation {
                    size_bytes: act,
                    name: "activations".into(),
                    driver_function: "cuMemAlloc_v2".into(),
                    age_s: (t % 60) as f64 * 0.1,
                    top_frame: "chunk_fwd (chunk.py:77)".into(),
                    stack: stack("chunk_fwd (chunk.py:77)"),
                },
            ],
            breakdown: vec![
                BreakdownEntry {
                    label: "weights".into(),
                    bytes: 10 * GIB,
                },
                BreakdownEntry {
                    label: "KV cache".into(),
                    bytes: 4 * GIB,
                },
                BreakdownEntry {
                    label: "activations".into(),
                    bytes: act,
                },
            ],
            ..Default::default()
        })
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let panic_after = args
        .iter()
        .position(|a| a == "--panic-after")
        .and_then(|i| args.get(i + 1)?.parse().ok());
    let options = RunOptions {
        view: ViewOptions {
            title: "live_demo".into(),
            capacity_bytes: Some(24 * GIB),
            ..ViewOptions::default()
        },
        ..RunOptions::default()
    };
    run(
        &mut Demo {
            tick: 0,
            panic_after,
        },
        &options,
    )?;
    Ok(())
}
