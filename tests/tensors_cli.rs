//! Tensor records through the CLI, on a synthetic version 2 trace written with the format
//! crate's encoder: PyTorch's caching allocator with two segments from the driver, tensors
//! inside them, a free, and an allocator-raised out-of-memory. `summary` places the tensors in
//! their segments (reserved but unallocated bytes, the largest free block against the request)
//! with their Python line, never adding tensor bytes to segment bytes; `events` prints them.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use vramtrace_format::{
    Api, BlockFileWriter, DeviceInfo, Event, EventKind, Header, MemKind, PyFrame, Record,
    TensorAction, TensorEvent,
};

const MIB: u64 = 1 << 20;

fn s(id: u32, text: &str) -> Record {
    Record::String {
        id,
        text: text.into(),
    }
}

fn seg(t: u64, ptr: u64, size: u64) -> Record {
    Record::Event(Event {
        t_ns: t,
        tid: 7,
        device: 0,
        kind: EventKind::Alloc,
        mem: MemKind::Device,
        api: Api::from_name("cuMemAlloc_v2").unwrap(),
        ptr,
        size,
        ..Event::default()
    })
}

fn tensor(t: u64, action: TensorAction, ptr: u64, size: u64, stack: u32) -> Record {
    Record::Tensor(TensorEvent {
        t_ns: t,
        tid: 7,
        device: 0,
        action,
        ptr,
        size,
        stack,
        ..TensorEvent::default()
    })
}

/// The caching-on scenario; returns the trace directory.
pub fn write_trace(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let header = Header {
        pid: 4242,
        ppid: 1,
        start_mono_ns: 1,
        cmdline: vec!["python3".into(), "serve.py".into()],
        ..Header::default()
    };
    let mut w = BlockFileWriter::new(&header, 1 << 16);
    let frames = |line: u32| Record::PyStack {
        stack: 0,
        frames: vec![
            PyFrame {
                file: 3,
                function: 4,
                line: 95,
            },
            PyFrame {
                file: 1,
                function: 2,
                line,
            },
            PyFrame {
                file: 5,
                function: 6,
                line: 42,
            },
        ],
    };
    let mut records = vec![
        Record::Device(DeviceInfo {
            ordinal: 0,
            total_bytes: 24 << 30,
            name: "stand-in".into(),
        }),
        s(1, "/site/fla/ops/common/chunk_o.py"),
        s(2, "chunk_fwd_o"),
        s(3, "/opt/vramtrace/probes/python/vramtrace_torch.py"),
        s(4, "on_alloc"),
        s(5, "/app/model.py"),
        s(6, "forward"),
        seg(100, 0x1000_0000, 20 * MIB),
        seg(110, 0x2000_0000, 2 * MIB),
    ];
    for (id, line) in [(10u32, 565u32), (11, 570), (12, 600)] {
        let Record::PyStack { frames, .. } = frames(line) else {
            unreachable!()
        };
        records.push(Record::PyStack { stack: id, frames });
    }
    records.extend([
        tensor(200, TensorAction::Alloc, 0x1000_0000, 8 * MIB, 10),
        tensor(210, TensorAction::Alloc, 0x1080_0000, 4 * MIB, 11),
        tensor(220, TensorAction::Alloc, 0x2000_0000, MIB, 10),
        tensor(230, TensorAction::Free, 0x1000_0000, 0, 0),
        Record::Tensor(TensorEvent {
            t_ns: 240,
            tid: 7,
            device: 0,
            action: TensorAction::AllocFailed,
            size: 12 * MIB,
            allocated: 5 * MIB,
            reserved: 22 * MIB,
            limit: 22 * MIB,
            free: 1 << 30,
            stack: 12,
            ..TensorEvent::default()
        }),
    ]);
    for r in &records {
        w.push(7, r).unwrap();
    }
    let path = dir.join("4242.vtr");
    std::fs::write(&path, w.finish()).unwrap();
    dir.to_path_buf()
}

fn cli(args: &[&str]) -> String {
    let o = Command::new(vramtrace()).args(args).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn summary_places_tensors_in_segments_and_reports_the_allocator_oom() {
    let dir = write_trace(&scratch("tensors-summary").join("trace"));
    let v: serde_json::Value =
        serde_json::from_str(&cli(&["summary", dir.to_str().unwrap(), "--json"])).unwrap();
    let d = &v["processes"][0]["devices"][0];
    // Driver level: the two segments, and nothing of the tensors added to them.
    assert_eq!(d["peak_bytes"], 22 * MIB);
    assert_eq!(d["live_at_end"], 22 * MIB);
    let t = &d["tensors"];
    assert_eq!(t["allocations"], 3);
    assert_eq!(t["frees"], 1);
    assert_eq!(t["peak_bytes"], 13 * MIB);
    assert_eq!(t["live_at_end"], 5 * MIB);
    let p = &t["at_peak"];
    assert_eq!(p["tensor_bytes"], 13 * MIB);
    assert_eq!(p["segment_bytes"], 22 * MIB);
    assert_eq!(p["unallocated_bytes"], 9 * MIB);
    assert_eq!(
        p["largest_free_block"],
        8 * MIB,
        "20 MiB segment: 8 + 4 used, 8 free"
    );
    assert_eq!(p["tensors"][0]["size"], 8 * MIB);
    assert_eq!(p["tensors"][0]["segment"], "0x10000000");
    assert_eq!(
        p["tensors"][0]["line"], "chunk_o.py:565 chunk_fwd_o",
        "the probe's own frame is skipped"
    );
    assert_eq!(p["tensors"][2]["segment"], "0x20000000");

    assert_eq!(d["failed_allocations"], 1);
    let f = &d["failures"][0];
    assert_eq!(f["api"], "pytorch");
    assert_eq!(f["size"], 12 * MIB);
    assert_eq!(f["torch"]["requested"], 12 * MIB);
    assert_eq!(f["torch"]["allocated"], 5 * MIB);
    assert_eq!(f["torch"]["reserved"], 22 * MIB);
    assert_eq!(f["torch"]["limit"], 22 * MIB);
    assert_eq!(f["total_bytes"], 24u64 << 30);
    assert_eq!(
        f["live_bytes"],
        22 * MIB,
        "the driver's bytes, segments only"
    );
    assert_eq!(f["frames"][0], "chunk_o.py:600 chunk_fwd_o");
    let m = &f["tensors"];
    assert_eq!(m["tensor_count"], 2);
    assert_eq!(m["tensor_bytes"], 5 * MIB, "PyTorch's allocated");
    assert_eq!(
        m["unallocated_bytes"],
        17 * MIB,
        "reserved 22 minus allocated 5"
    );
    assert_eq!(
        m["largest_free_block"],
        8 * MIB,
        "the 4 MiB tensor splits the 20 MiB segment into 8 + 8 free"
    );
    assert_eq!(m["outside_segments_bytes"], 0);
    assert_eq!(m["tensors"][0]["line"], "chunk_o.py:570 chunk_fwd_o");

    let text = cli(&["summary", dir.to_str().unwrap()]);
    assert!(
        text.contains("PyTorch's caching allocator refused 12.00 MiB (allocated 5.00 MiB, reserved 22.00 MiB, limit 22.00 MiB"),
        "{text}"
    );
    assert!(
        text.contains(
            "the request 12.00 MiB against the largest free block 8.00 MiB: no free block holds it"
        ),
        "{text}"
    );
    assert!(text.contains("@ chunk_o.py:570 chunk_fwd_o"), "{text}");
    assert!(!text.contains("vramtrace_torch.py"), "{text}");
}

#[test]
fn events_print_tensor_lines_with_the_freed_size_and_the_refusal() {
    let dir = write_trace(&scratch("tensors-events").join("trace"));
    let out = cli(&["events", dir.to_str().unwrap()]);
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v["mem"] == "tensor")
        .collect();
    let kinds: Vec<&str> = lines.iter().map(|v| v["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "tensor_alloc",
            "tensor_alloc",
            "tensor_alloc",
            "tensor_free",
            "tensor_alloc_failed"
        ]
    );
    assert_eq!(lines[3]["size"], 8 * MIB, "a free carries what it freed");
    assert_eq!(lines[4]["torch"]["reserved"], 22 * MIB);
    let stacks = cli(&["events", dir.to_str().unwrap(), "--stacks"]);
    assert!(stacks.contains("chunk_o.py"), "{stacks}");
    assert!(!stacks.contains("vramtrace_torch.py"), "{stacks}");
}
