//! `vramtrace import`: PyTorch memory snapshots as traces. A hand-made pickle in the exact shape
//! of `torch.cuda.memory._snapshot()` (tests/data/make_torch_snapshot.py, frame dicts shared
//! between entries as PyTorch shares them), a round trip through our own `export --format
//! pytorch`, and pickles that are not snapshots (refused with a sentence, nothing run).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

const MIB: u64 = 1 << 20;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn cli(args: &[&str]) -> std::process::Output {
    Command::new(vramtrace()).args(args).output().unwrap()
}

fn ok(args: &[&str]) -> String {
    let o = cli(args);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    String::from_utf8(o.stdout).unwrap()
}

fn json(args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&ok(args)).unwrap()
}

#[test]
fn a_pytorch_snapshot_becomes_segments_tensors_frames_and_an_oom() {
    let out = scratch("import-fixture").join("trace");
    ok(&[
        "import",
        data("torch_snapshot.pickle").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    let v = json(&["summary", out.to_str().unwrap(), "--json", "--frames", "2"]);
    let d = &v["processes"][0]["devices"][0];
    assert_eq!(
        d["peak_bytes"],
        22 * MIB,
        "the two segments, tensors not added"
    );
    let t = &d["tensors"];
    assert_eq!(
        t["allocations"], 3,
        "two in the history, one live before it"
    );
    assert_eq!(t["frees"], 1);
    assert_eq!(t["peak_bytes"], 12 * MIB + MIB / 2);
    let at = &t["at_peak"]["tensors"];
    assert_eq!(
        at[0]["line"],
        "chunk_delta_h.py:240 chunk_gated_delta_rule_fwd_h"
    );
    assert_eq!(at[1]["line"], "chunk_o.py:565 chunk_fwd_o");
    assert_eq!(at[2]["line"], "model.py:12 __init__");
    let f = &d["failures"][0];
    assert_eq!(f["api"], "pytorch");
    assert_eq!(f["torch"]["requested"], 12 * MIB);
    assert_eq!(f["torch"]["allocated"], 4 * MIB + MIB / 2);
    assert_eq!(f["torch"]["reserved"], 22 * MIB);
    assert_eq!(f["torch"]["free"], 1u64 << 30);
    assert_eq!(f["frames"][0], "chunk_o.py:570 chunk_fwd_o");
    assert_eq!(f["tensors"]["largest_free_block"], 8 * MIB);
    assert_eq!(f["tensors"]["unallocated_bytes"], 17 * MIB + MIB / 2);
}

/// (ptr, size) of every allocation of `kind` and mem in `events` output, and the failures'
/// sizes.
fn sets(events: &str, alloc: &str, failed: &str) -> (BTreeSet<(String, u64)>, Vec<u64>) {
    let mut allocs = BTreeSet::new();
    let mut fails = Vec::new();
    for l in events.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        if v["kind"] == alloc && (v["mem"] == "device" || v["mem"] == "tensor") {
            allocs.insert((
                v["ptr"].as_str().unwrap().to_string(),
                v["size"].as_u64().unwrap(),
            ));
        }
        if v["kind"] == failed && v["result"] != 801 {
            fails.push(v["size"].as_u64().unwrap());
        }
    }
    (allocs, fails)
}

#[test]
fn export_then_import_gives_the_same_tensors_and_failures() {
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/h200/prefill-18gib");
    let dir = scratch("import-round-trip");
    let pickle = dir.join("snapshot.pickle");
    ok(&[
        "export",
        sample.to_str().unwrap(),
        "--format",
        "pytorch",
        "-o",
        pickle.to_str().unwrap(),
        "--force",
    ]);
    let out = dir.join("trace");
    ok(&[
        "import",
        pickle.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    let (before, failed_before) = sets(
        &ok(&["events", sample.to_str().unwrap()]),
        "alloc",
        "alloc_failed",
    );
    let (after, failed_after) = sets(
        &ok(&["events", out.to_str().unwrap()]),
        "tensor_alloc",
        "tensor_alloc_failed",
    );
    assert!(!before.is_empty());
    assert_eq!(
        before, after,
        "every allocation is a tensor of the same address and size"
    );
    assert_eq!(failed_before, failed_after);
    let a = json(&["summary", sample.to_str().unwrap(), "--json"]);
    let b = json(&["summary", out.to_str().unwrap(), "--json"]);
    let (da, db) = (
        &a["processes"][0]["devices"][0],
        &b["processes"][0]["devices"][0],
    );
    assert_eq!(da["peak_bytes"], db["peak_bytes"]);
    assert_eq!(da["peak_bytes"], db["tensors"]["peak_bytes"]);
    assert_eq!(da["failed_allocations"], db["failed_allocations"]);
    assert_eq!(
        da["failures"][0]["free_bytes"],
        db["failures"][0]["free_bytes"]
    );
}

#[test]
fn what_is_not_a_snapshot_is_refused_and_nothing_in_it_runs() {
    let dir = scratch("import-refused");
    let marker = dir.join("ran");
    // A pickle whose loading would run a command (os.system) names a global: refused.
    let evil = dir.join("evil.pickle");
    let cmd = format!("touch {}", marker.display());
    let mut b = b"\x80\x02cposix\nsystem\nq\x00X".to_vec();
    b.extend((cmd.len() as u32).to_le_bytes());
    b.extend(cmd.as_bytes());
    b.extend(b"q\x01\x85q\x02Rq\x03.");
    std::fs::write(&evil, b).unwrap();
    // A pickle of a plain list, and a file that is no pickle at all.
    let list = dir.join("list.pickle");
    std::fs::write(&list, b"\x80\x02]q\x00(K\x01K\x02e.").unwrap();
    let text = dir.join("notes.txt");
    std::fs::write(&text, "not a pickle\n").unwrap();
    for (f, want) in [
        (&evil, "would name or build a Python object"),
        (
            &list,
            "is not a PyTorch memory snapshot: the pickle holds no dict",
        ),
        (&text, "is not a pickle that can be read safely"),
    ] {
        let o = cli(&[
            "import",
            f.to_str().unwrap(),
            "-o",
            dir.join("out").to_str().unwrap(),
        ]);
        assert_ne!(o.status.code(), Some(0));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{}: {err}", f.display());
    }
    assert!(!marker.exists(), "nothing in the pickle ran");
}

/// Our exporter writes a tensor's name and its label as frames of file "vramtrace"; import
/// turns them back into annotations (name, dtype, shape; the label when there is no name), so
/// the names survive export then import.
#[test]
fn export_then_import_keeps_tensor_and_label_names() {
    use vramtrace_format::{
        Annotation, Api, BlockFileWriter, DeviceInfo, Event, EventKind, Header, MemKind, Record,
    };
    let dir = scratch("import-names");
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let header = Header {
        pid: 77,
        ppid: 1,
        start_mono_ns: 1,
        cmdline: vec!["python3".into(), "prefill.py".into()],
        ..Header::default()
    };
    let alloc = |t: u64, ptr: u64, size: u64, label: u32| {
        Record::Event(Event {
            t_ns: t,
            tid: 7,
            device: 0,
            kind: EventKind::Alloc,
            mem: MemKind::Device,
            api: Api::from_name("cuMemAlloc_v2").unwrap(),
            ptr,
            size,
            label,
            ..Event::default()
        })
    };
    let free = |t: u64, ptr: u64| {
        Record::Event(Event {
            t_ns: t,
            tid: 7,
            device: 0,
            kind: EventKind::Free,
            mem: MemKind::Device,
            api: Api::from_name("cuMemFree_v2").unwrap(),
            ptr,
            ..Event::default()
        })
    };
    let s = |id: u32, text: &str| Record::String {
        id,
        text: text.into(),
    };
    let records = vec![
        Record::Device(DeviceInfo {
            ordinal: 0,
            total_bytes: 24 << 30,
            name: "stand-in".into(),
        }),
        s(1, "o"),
        s(2, "bf16"),
        s(3, "prefill/layer.3/gdn"),
        s(4, "h"),
        alloc(100, 0x1000_0000, 8 * MIB, 3),
        Record::Annotate(Annotation {
            t_ns: 101,
            tid: 7,
            ptr: 0x1000_0000,
            name: 1,
            dtype: 2,
            shape: vec![1, 4128, 48, 128],
            op: false,
        }),
        alloc(110, 0x2000_0000, 4 * MIB, 3),
        alloc(120, 0x3000_0000, 2 * MIB, 0),
        Record::Annotate(Annotation {
            t_ns: 121,
            tid: 7,
            ptr: 0x3000_0000,
            name: 4,
            dtype: 0,
            shape: Vec::new(),
            op: false,
        }),
        free(130, 0x3000_0000),
    ];
    let mut w = BlockFileWriter::new(&header, 1 << 16);
    for r in &records {
        w.push(7, r).unwrap();
    }
    std::fs::write(src.join("77.vtr"), w.finish()).unwrap();
    let pickle = dir.join("snapshot.pickle");
    ok(&[
        "export",
        src.to_str().unwrap(),
        "--format",
        "pytorch",
        "-o",
        pickle.to_str().unwrap(),
        "--force",
    ]);
    let out = dir.join("trace");
    ok(&[
        "import",
        pickle.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    let v = json(&["summary", out.to_str().unwrap(), "--json"]);
    let at = &v["processes"][0]["devices"][0]["tensors"]["at_peak"]["tensors"];
    let names: Vec<(u64, String)> = at
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["size"].as_u64().unwrap(),
                t["tensor"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        names,
        vec![
            (8 * MIB, "o bf16[1, 4128, 48, 128]".to_string()),
            (4 * MIB, "prefill/layer.3/gdn".to_string()),
            (2 * MIB, "h".to_string()),
        ],
        "the named tensor keeps name, dtype and shape; the labelled one its label; the freed one its name"
    );
    // The names are annotations of the imported trace: events prints them.
    let ev = ok(&["events", out.to_str().unwrap()]);
    assert!(ev.contains("\"o\""), "{ev}");
}
