//! The live source over a directory that grows while the test writes into it.

#[path = "common/live_writer.rs"]
mod live_writer;

use std::path::{Path, PathBuf};

use live_writer::LiveWriter;
use vramtrace::live::{DirSource, LiveOptions};
use vramtrace_format::{Annotation, Api, DeviceInfo, Event, EventKind, Header, MemKind, Record};
use vramtrace_view_model::{LiveSource, SnapshotQuery, Update};

const T0: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vramtrace-live-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn source(dir: &Path) -> DirSource {
    DirSource::new(
        dir,
        LiveOptions {
            nvml: false,
            rescan: std::time::Duration::ZERO,
            ..LiveOptions::default()
        },
    )
}

fn writer(dir: &Path, pid: u32) -> LiveWriter {
    let h = Header {
        pid,
        ppid: 1,
        start_mono_ns: T0,
        cmdline: vec![format!("worker-{pid}")],
        ..Header::default()
    };
    let mut w = LiveWriter::create(&dir.join(format!("{pid}.vtr")), &h, pid).unwrap();
    w.record(
        &Record::Device(DeviceInfo {
            ordinal: 0,
            total_bytes: 24 << 30,
            name: "test card".into(),
        }),
        T0,
    )
    .unwrap();
    w
}

fn alloc(t_ms: u64, ptr: u64, size: u64, label: u32) -> Event {
    Event {
        t_ns: T0 + t_ms * MS,
        kind: EventKind::Alloc,
        mem: MemKind::Device,
        api: Api::from_name("cuMemAlloc_v2").unwrap(),
        ptr,
        size,
        label,
        ..Event::default()
    }
}

fn free(t_ms: u64, ptr: u64) -> Event {
    Event {
        t_ns: T0 + t_ms * MS,
        kind: EventKind::Free,
        mem: MemKind::Device,
        api: Api::from_name("cuMemFree_v2").unwrap(),
        ptr,
        ..Event::default()
    }
}

/// The last sample of device 0 in `updates`: (time, live bytes, split by category).
fn last_sample(updates: &[Update]) -> Option<(f64, u64, Vec<u64>)> {
    updates.iter().rev().find_map(|u| match u {
        Update::Sample { device: 0, point } => {
            Some((point.time_s, point.live_bytes, point.by_category.clone()))
        }
        _ => None,
    })
}

#[test]
fn follows_a_growing_directory_and_new_files() {
    let dir = scratch("grow");
    let mut src = source(&dir);
    let first = src.poll();
    assert!(
        first
            .iter()
            .any(|u| matches!(u, Update::Notice(n) if n.contains("waiting for traces"))),
        "{first:?}"
    );

    let mut a = writer(&dir, 100);
    a.record(
        &Record::String {
            id: 1,
            text: "model/weights".into(),
        },
        T0,
    )
    .unwrap();
    a.events(&[alloc(1, 0x1000, 1 << 30, 1), alloc(2, 0x2000, 256 << 20, 0)])
        .unwrap();
    let u = src.poll();
    assert!(
        u.iter()
            .any(|u| matches!(u, Update::Process(p) if p.pid == 100 && p.command == "worker-100"))
    );
    assert!(
        u.iter()
            .any(|u| matches!(u, Update::Device(d) if d.name == "test card"))
    );
    assert!(
        u.iter()
            .any(|u| matches!(u, Update::Categories { device: 0, names } if names[0] == "weights"))
    );
    let (t, live, cats) = last_sample(&u).expect("a sample");
    assert_eq!(live, (1 << 30) + (256 << 20));
    assert_eq!(cats[0], 1 << 30, "the labelled one is weights");
    assert_eq!(
        cats[vramtrace::categories::Category::Unnamed.index()],
        256 << 20,
        "the other one is unnamed"
    );
    assert!((t - 0.002).abs() < 1e-9, "{t}");

    // The file grows: a free, later.
    a.events(&[free(50, 0x2000)]).unwrap();
    let (t, live, _) = last_sample(&src.poll()).expect("a sample after the free");
    assert_eq!(live, 1 << 30);
    assert!((t - 0.050).abs() < 1e-9);

    // A second process appears (a worker, a rank) and allocates on the same device.
    let mut b = writer(&dir, 200);
    b.events(&[alloc(60, 0x1000, 2 << 30, 0)]).unwrap();
    let u = src.poll();
    assert!(
        u.iter()
            .any(|u| matches!(u, Update::Process(p) if p.pid == 200))
    );
    assert_eq!(last_sample(&u).unwrap().1, 3 << 30, "both processes summed");

    // Nothing new, nothing sent (beyond NVML, which is off).
    assert!(
        src.poll()
            .iter()
            .all(|u| !matches!(u, Update::Sample { .. }))
    );

    // Snapshot at the live edge: the largest first, named by label.
    let snap = src
        .snapshot(&SnapshotQuery {
            device: 0,
            pid: None,
            time_s: src.latest_s(),
        })
        .unwrap();
    assert_eq!(snap.largest.len(), 2);
    assert_eq!(snap.largest[0].size_bytes, 2 << 30);
    assert_eq!(snap.largest[1].name, "model/weights");
    assert_eq!(snap.largest[1].driver_function, "cuMemAlloc_v2");

    // One process only.
    let snap = src
        .snapshot(&SnapshotQuery {
            device: 0,
            pid: Some(100),
            time_s: src.latest_s(),
        })
        .unwrap();
    assert_eq!(snap.largest.len(), 1);

    // An earlier time is read again from the start: the 256 MiB one was still live at 10 ms.
    let past = src
        .snapshot(&SnapshotQuery {
            device: 0,
            pid: None,
            time_s: 0.010,
        })
        .unwrap();
    let sizes: Vec<u64> = past.largest.iter().map(|a| a.size_bytes).collect();
    assert_eq!(sizes, vec![1 << 30, 256 << 20]);
    assert!((past.largest[0].age_s - 0.009).abs() < 1e-6);
    assert_eq!(
        past.breakdown.iter().map(|b| b.bytes).sum::<u64>(),
        (1 << 30) + (256 << 20)
    );
}

#[test]
fn annotations_move_bytes_between_categories_and_failures_are_sent() {
    let dir = scratch("annotate");
    let mut src = source(&dir);
    let mut a = writer(&dir, 300);
    a.record(
        &Record::String {
            id: 7,
            text: "layer.0.kv_cache".into(),
        },
        T0,
    )
    .unwrap();
    a.events(&[alloc(1, 0x5000, 64 << 20, 0)]).unwrap();
    a.record(
        &Record::Annotate(Annotation {
            t_ns: T0 + 2 * MS,
            tid: 300,
            ptr: 0x5000,
            name: 7,
            dtype: 0,
            shape: vec![],
            op: false,
        }),
        T0 + 2 * MS,
    )
    .unwrap();
    a.events(&[Event {
        t_ns: T0 + 3 * MS,
        kind: EventKind::AllocFailed,
        mem: MemKind::Device,
        api: Api::from_name("cuMemAlloc_v2").unwrap(),
        size: 40 << 30,
        result: 2,
        free_bytes: 1 << 30,
        total_bytes: 24 << 30,
        ..Event::default()
    }])
    .unwrap();
    let u = src.poll();
    let (_, live, cats) = last_sample(&u).unwrap();
    assert_eq!(live, 64 << 20);
    assert_eq!(cats[1], 64 << 20, "named layer.0.kv_cache: KV cache");
    let f = u
        .iter()
        .find_map(|u| match u {
            Update::Failure(f) => Some(f.clone()),
            _ => None,
        })
        .expect("the failure");
    assert_eq!(f.request_bytes, 40 << 30);
    assert_eq!(f.free_bytes, Some(1 << 30));
    assert_eq!(f.error, "CUDA_ERROR_OUT_OF_MEMORY");
    assert_eq!(f.pid, 300);
}

#[test]
fn damaged_and_foreign_files_are_notices() {
    let dir = scratch("damaged");
    std::fs::write(
        dir.join("junk.vtr"),
        b"this is not a trace file at all, not even close",
    )
    .unwrap();
    std::fs::write(dir.join("notes.txt"), b"ignored: not a .vtr").unwrap();
    let mut good = writer(&dir, 400);
    good.events(&[alloc(1, 0x1000, 4096, 0)]).unwrap();
    let mut src = source(&dir);
    let u = src.poll();
    assert!(
        u.iter().any(
            |u| matches!(u, Update::Notice(n) if n.contains("junk.vtr") && n.contains("skipped"))
        ),
        "{u:?}"
    );
    assert!(
        !u.iter()
            .any(|u| matches!(u, Update::Notice(n) if n.contains("notes.txt")))
    );
    assert_eq!(
        last_sample(&u).unwrap().1,
        4096,
        "the good file is still read"
    );
    // Said once.
    good.events(&[alloc(2, 0x2000, 4096, 0)]).unwrap();
    let u = src.poll();
    assert!(
        !u.iter()
            .any(|u| matches!(u, Update::Notice(n) if n.contains("junk.vtr")))
    );
    assert_eq!(last_sample(&u).unwrap().1, 8192);
}

#[test]
fn a_finished_sample_trace_replays_to_its_end() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/h200/prefill-18gib");
    let updates = vramtrace::live::read_all(&dir);
    let samples: Vec<_> = updates
        .iter()
        .filter_map(|u| match u {
            Update::Sample { point, .. } => Some(point),
            _ => None,
        })
        .collect();
    assert!(
        samples.len() > 100 && samples.len() < 2000,
        "{}",
        samples.len()
    );
    let peak = samples.iter().map(|p| p.live_bytes).max().unwrap();
    // summary.txt: peak 138.97 GiB, 0 B live at the end, one failure.
    assert!(
        (peak as f64 / (1u64 << 30) as f64 - 138.97).abs() < 0.01,
        "{peak}"
    );
    assert_eq!(samples.last().unwrap().live_bytes, 0);
    assert_eq!(
        updates
            .iter()
            .filter(|u| matches!(u, Update::Failure(_)))
            .count(),
        1
    );
    assert!(
        samples.windows(2).all(|w| w[0].time_s <= w[1].time_s),
        "in time order"
    );
}

/// The timeline plot folds a whole trace (`timeline::fold_with`, categorised as made) as the
/// live source folds what it reads: the same devices, categories, samples and failures, update
/// for update, on samples with one process, several processes, and failures; with the
/// categories of the report's moment (`timeline::fold`), the same samples' times and totals.
#[test]
fn the_timeline_fold_matches_the_live_source() {
    for name in [
        "prefill-18gib",
        "nvtx-multiprocess",
        "torch-oom",
        "nccl-stages",
        "v2-torch-expandable",
        "torch-async",
    ] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("samples/h200")
            .join(name);
        let keep = |u: &Update| {
            matches!(
                u,
                Update::Device(_)
                    | Update::Categories { .. }
                    | Update::Sample { .. }
                    | Update::Failure(_)
            )
        };
        let live: Vec<Update> = vramtrace::live::read_all(&dir)
            .into_iter()
            .filter(keep)
            .collect();
        let trace = vramtrace::Trace::open(&dir).unwrap();
        let folded: Vec<Update> = vramtrace::timeline::fold_with(&trace, Default::default())
            .unwrap()
            .into_iter()
            .filter(keep)
            .collect();
        assert!(
            live.iter().any(|u| matches!(u, Update::Sample { .. })),
            "{name}: no samples"
        );
        assert_eq!(folded, live, "{name}");
        let totals = |us: Vec<Update>| {
            us.into_iter()
                .filter_map(|u| match u {
                    Update::Sample { device, point } => {
                        Some((device, point.time_s, point.by_category.iter().sum::<u64>()))
                    }
                    _ => None,
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            totals(vramtrace::timeline::fold(&trace).unwrap()),
            totals(live),
            "{name}"
        );
    }
}
