//! `vramtrace export` on a small synthetic trace whose every value is known: each format is
//! read back by a real reader (the parquet crate's, serde-pickle, serde_json) and compared
//! value by value; the CLI's errors for bad input.
//!
//! The trace (pid 77, one device): at t=1000 a 1 MiB `cuMemAlloc_v2` (A); at 2000 a 4 MiB
//! `cuMemAllocAsync` on stream 0x50 (B) under the label `prefill` with a two-frame stack; at
//! 2500 B is named `h bf16[2, 3]`; at 3000 A is freed; at 4000 an 8 MiB allocation fails with
//! 2 MiB free of 24 GiB; at 5000 1 KiB of pinned host memory (C).

mod common;

use std::path::{Path, PathBuf};

use common::*;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::{Field, Row};
use serde_pickle::{HashableValue as H, Value as V};
use vramtrace::Trace;
use vramtrace::export::{
    FlamegraphOptions, Progress, SnapshotOptions, Weight, export_flamegraph, export_parquet,
    export_perfetto, export_pytorch,
};
use vramtrace_format::{Annotation, Api, DeviceInfo, Event, EventKind, Header, MemKind, Record};

const MIB: u64 = 1 << 20;
const A: u64 = 0x7f00_0000_0000;
const B: u64 = 0x7f00_1000_0000;
const C: u64 = 0x5500_0000_1000;
const START_MONO: u64 = 500;
const START_UNIX: u64 = 1_700_000_000_000_000_000;

fn api(name: &str) -> Api {
    Api::from_name(name).unwrap()
}

fn write_trace(dir: &Path) {
    let mut bytes = Vec::new();
    Header {
        version: 1,
        pid: 77,
        ppid: 1,
        start_unix_ns: START_UNIX,
        start_mono_ns: START_MONO,
        hostname: "h200".into(),
        cmdline: vec!["python3".into(), "train.py".into()],
    }
    .encode(&mut bytes);
    let mut buf = vec![0u8; 512];
    let mut push = |r: Record| bytes.extend_from_slice(r.encode(&mut buf));
    let ev = |t_ns, kind, mem, name: &str, ptr, size| Event {
        t_ns,
        tid: 9,
        device: 0,
        kind,
        mem,
        api: api(name),
        ptr,
        size,
        ..Event::default()
    };
    push(Record::Device(DeviceInfo {
        ordinal: 0,
        total_bytes: 24 << 30,
        name: "NVIDIA H200".into(),
    }));
    push(Record::String {
        id: 1,
        text: "prefill".into(),
    });
    push(Record::String {
        id: 2,
        text: "h".into(),
    });
    push(Record::String {
        id: 3,
        text: "bf16".into(),
    });
    push(Record::Stack {
        id: 5,
        frames: vec![0x1111, 0x2222],
    });
    push(Record::Event(ev(
        1000,
        EventKind::Alloc,
        MemKind::Device,
        "cuMemAlloc_v2",
        A,
        MIB,
    )));
    push(Record::Event(Event {
        stream: 0x50,
        stack: 5,
        label: 1,
        ..ev(
            2000,
            EventKind::Alloc,
            MemKind::Device,
            "cuMemAllocAsync",
            B,
            4 * MIB,
        )
    }));
    push(Record::Annotate(Annotation {
        t_ns: 2500,
        tid: 9,
        ptr: B,
        name: 2,
        dtype: 3,
        shape: vec![2, 3],
        op: false,
    }));
    push(Record::Event(ev(
        3000,
        EventKind::Free,
        MemKind::Device,
        "cuMemFree_v2",
        A,
        0,
    )));
    push(Record::Event(Event {
        result: 2,
        free_bytes: 2 * MIB,
        total_bytes: 24 << 30,
        ..ev(
            4000,
            EventKind::AllocFailed,
            MemKind::Device,
            "cuMemAlloc_v2",
            0,
            8 * MIB,
        )
    }));
    push(Record::Event(Event {
        device: -1,
        ..ev(
            5000,
            EventKind::Alloc,
            MemKind::Host,
            "cuMemAllocHost_v2",
            C,
            1024,
        )
    }));
    std::fs::write(dir.join("77.vtr"), bytes).unwrap();
}

fn trace_dir(name: &str) -> PathBuf {
    let dir = scratch(name);
    write_trace(&dir);
    dir
}

fn rows(path: &Path) -> Vec<Row> {
    let r = SerializedFileReader::new(std::fs::File::open(path).unwrap()).unwrap();
    r.get_row_iter(None).unwrap().map(|r| r.unwrap()).collect()
}

/// A row as (column name, value) pairs, NULLs included.
fn fields(r: &Row) -> Vec<(String, Field)> {
    r.get_column_iter()
        .map(|(n, f)| (n.clone(), f.clone()))
        .collect()
}

fn get<'a>(r: &'a [(String, Field)], name: &str) -> &'a Field {
    &r.iter().find(|(n, _)| n == name).unwrap().1
}

fn s(v: &str) -> Field {
    Field::Str(v.into())
}

#[test]
fn parquet_tables_hold_every_value() {
    let dir = trace_dir("export-parquet");
    let trace = Trace::open(&dir).unwrap();
    let out = dir.join("tables");
    let n = export_parquet(&trace, &out, &Progress::hidden()).unwrap();
    assert_eq!((n.events, n.stacks, n.processes, n.devices), (6, 2, 1, 1));

    let ev: Vec<Vec<(String, Field)>> = rows(&out.join("events.parquet"))
        .iter()
        .map(fields)
        .collect();
    let names: Vec<&str> = ev[0].iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "pid",
            "tid",
            "t_ns",
            "kind",
            "api",
            "mem",
            "pool",
            "device",
            "ptr",
            "size",
            "result",
            "stream",
            "aux",
            "free_bytes",
            "total_bytes",
            "stack_id",
            "label",
            "name",
            "dtype",
            "unmatched",
            "category"
        ]
    );
    let col = |c: &str| ev.iter().map(|r| get(r, c).clone()).collect::<Vec<_>>();
    let long = |v: &[i64]| v.iter().map(|x| Field::Long(*x)).collect::<Vec<_>>();
    assert_eq!(col("pid"), long(&[77; 6]));
    assert_eq!(col("t_ns"), long(&[1000, 2000, 2500, 3000, 4000, 5000]));
    assert_eq!(
        col("kind"),
        [
            "alloc",
            "alloc",
            "annotate",
            "free",
            "alloc_failed",
            "alloc"
        ]
        .map(s)
    );
    assert_eq!(
        col("api"),
        [
            "cuMemAlloc_v2",
            "cuMemAllocAsync",
            "vramtrace_annotate",
            "cuMemFree_v2",
            "cuMemAlloc_v2",
            "cuMemAllocHost_v2"
        ]
        .map(s)
    );
    assert_eq!(
        col("pool"),
        ["device", "device", "device", "device", "device", "host"].map(s)
    );
    assert_eq!(col("device"), [0, 0, 0, 0, 0, -1].map(Field::Int).to_vec());
    assert_eq!(
        col("ptr"),
        long(&[A as i64, B as i64, B as i64, A as i64, 0, C as i64])
    );
    // The release carries what it released; the annotation the size of what it named.
    assert_eq!(
        col("size"),
        long(&[
            MIB as i64,
            4 * MIB as i64,
            4 * MIB as i64,
            MIB as i64,
            8 * MIB as i64,
            1024
        ])
    );
    assert_eq!(col("result"), [0, 0, 0, 0, 2, 0].map(Field::Int).to_vec());
    let null = Field::Null;
    assert_eq!(
        col("stream"),
        [
            null.clone(),
            Field::Long(0x50),
            null.clone(),
            null.clone(),
            null.clone(),
            null.clone()
        ]
    );
    assert_eq!(get(&ev[4], "free_bytes"), &Field::Long(2 * MIB as i64));
    assert_eq!(get(&ev[4], "total_bytes"), &Field::Long(24 << 30));
    assert_eq!(get(&ev[0], "free_bytes"), &null);
    assert_eq!(get(&ev[1], "stack_id"), &Field::Long(5));
    assert_eq!(get(&ev[0], "stack_id"), &null);
    assert_eq!(get(&ev[1], "label"), &s("prefill"));
    assert_eq!(get(&ev[2], "name"), &s("h"));
    assert_eq!(get(&ev[2], "dtype"), &s("bf16"));
    assert_eq!(get(&ev[3], "name"), &null, "A was never named");
    assert_eq!(col("unmatched"), [false; 6].map(Field::Bool).to_vec());
    // What the categoriser makes of each allocation when it is made: the labelled one by its
    // label; annotations and frees have none.
    assert_eq!(
        col("category"),
        [
            s("unnamed"),
            s("activations"),
            null.clone(),
            null.clone(),
            s("unnamed"),
            s("unnamed")
        ]
    );

    let st: Vec<_> = rows(&out.join("stacks.parquet"))
        .iter()
        .map(fields)
        .collect();
    assert_eq!(st.len(), 2);
    assert_eq!(get(&st[0], "stack_id"), &Field::Long(5));
    assert_eq!(get(&st[0], "frame"), &Field::Int(0));
    assert_eq!(get(&st[0], "address"), &Field::Long(0x1111));
    assert_eq!(get(&st[1], "frame"), &Field::Int(1));
    assert_eq!(get(&st[1], "address"), &Field::Long(0x2222));
    assert_eq!(get(&st[1], "module"), &s("?"));
    assert_eq!(get(&st[1], "symbol"), &null);

    let pr: Vec<_> = rows(&out.join("processes.parquet"))
        .iter()
        .map(fields)
        .collect();
    assert_eq!(get(&pr[0], "pid"), &Field::Long(77));
    assert_eq!(get(&pr[0], "ppid"), &Field::Long(1));
    assert_eq!(get(&pr[0], "command_line"), &s("python3 train.py"));
    assert_eq!(get(&pr[0], "host"), &s("h200"));
    assert_eq!(
        get(&pr[0], "start_unix_ns"),
        &Field::Long(START_UNIX as i64)
    );
    assert_eq!(
        get(&pr[0], "start_mono_ns"),
        &Field::Long(START_MONO as i64)
    );

    let dv: Vec<_> = rows(&out.join("devices.parquet"))
        .iter()
        .map(fields)
        .collect();
    assert_eq!(
        dv[0],
        vec![
            ("pid".to_string(), Field::Long(77)),
            ("ordinal".to_string(), Field::Int(0)),
            ("name".to_string(), s("NVIDIA H200")),
            ("total_bytes".to_string(), Field::Long(24 << 30)),
        ]
    );
}

fn key<'a>(d: &'a V, k: &str) -> &'a V {
    match d {
        V::Dict(m) => m
            .get(&H::String(k.into()))
            .unwrap_or_else(|| panic!("no key {k} in {d:?}")),
        _ => panic!("not a dict: {d:?}"),
    }
}

fn list(v: &V) -> &Vec<V> {
    match v {
        V::List(l) => l,
        _ => panic!("not a list: {v:?}"),
    }
}

fn int(v: &V) -> i64 {
    match v {
        V::I64(i) => *i,
        _ => panic!("not an int: {v:?}"),
    }
}

fn text(v: &V) -> &str {
    match v {
        V::String(s) => s,
        _ => panic!("not a str: {v:?}"),
    }
}

#[test]
fn pytorch_snapshot_has_the_fields_memory_viz_reads() {
    let dir = trace_dir("export-pytorch");
    let trace = Trace::open(&dir).unwrap();
    let mut out = Vec::new();
    let n = export_pytorch(
        &trace,
        &SnapshotOptions::default(),
        &mut out,
        &Progress::hidden(),
    )
    .unwrap();
    assert_eq!((n.pid, n.segments, n.entries, n.ooms), (77, 1, 8, 1));
    let snap: V = serde_pickle::value_from_slice(&out, Default::default()).unwrap();

    // At the end only B is allocated: one segment, one active block, named.
    let segs = list(key(&snap, "segments"));
    assert_eq!(segs.len(), 1);
    let seg = &segs[0];
    assert_eq!(int(key(seg, "device")), 0);
    assert_eq!(int(key(seg, "address")), B as i64);
    for k in [
        "total_size",
        "allocated_size",
        "active_size",
        "requested_size",
    ] {
        assert_eq!(int(key(seg, k)), 4 * MIB as i64, "{k}");
    }
    assert_eq!(int(key(seg, "stream")), 0x50);
    assert_eq!(text(key(seg, "segment_type")), "large");
    assert_eq!(key(seg, "is_expandable"), &V::Bool(false));
    assert_eq!(
        key(seg, "segment_pool_id"),
        &V::Tuple(vec![V::I64(0), V::I64(0)])
    );
    let blocks = list(key(seg, "blocks"));
    assert_eq!(blocks.len(), 1);
    assert_eq!(int(key(&blocks[0], "address")), B as i64);
    assert_eq!(int(key(&blocks[0], "size")), 4 * MIB as i64);
    assert_eq!(int(key(&blocks[0], "requested_size")), 4 * MIB as i64);
    assert_eq!(text(key(&blocks[0], "state")), "active_allocated");
    let frames: Vec<(String, i64, String)> = list(key(&blocks[0], "frames"))
        .iter()
        .map(|f| {
            (
                text(key(f, "filename")).to_string(),
                int(key(f, "line")),
                text(key(f, "name")).to_string(),
            )
        })
        .collect();
    assert_eq!(
        frames,
        [
            ("?".to_string(), 0, "? 0x1111".to_string()),
            ("?".to_string(), 0, "? 0x2222".to_string()),
            (
                "vramtrace".to_string(),
                0,
                "tensor h bf16[2, 3]".to_string()
            ),
            ("vramtrace".to_string(), 0, "label prefill".to_string()),
        ]
    );

    // One device, its events in order; host memory is not in a device trace.
    let traces = list(key(&snap, "device_traces"));
    assert_eq!(traces.len(), 1);
    let t = list(&traces[0]);
    let summary: Vec<(&str, i64, i64)> = t
        .iter()
        .map(|e| {
            (
                text(key(e, "action")),
                int(key(e, "addr")),
                int(key(e, "size")),
            )
        })
        .collect();
    let (a, b, m) = (A as i64, B as i64, MIB as i64);
    assert_eq!(
        summary,
        [
            ("segment_alloc", a, m),
            ("alloc", a, m),
            ("segment_alloc", b, 4 * m),
            ("alloc", b, 4 * m),
            ("free_requested", a, m),
            ("free_completed", a, m),
            ("segment_free", a, m),
            ("oom", 0, 8 * m),
        ]
    );
    assert_eq!(int(key(&t[7], "device_free")), 2 * m);
    assert_eq!(int(key(&t[2], "stream")), 0x50);
    // time_us is the wall clock: start_unix + (t - start_mono), in µs.
    assert_eq!(
        int(key(&t[0], "time_us")),
        ((START_UNIX + 1000 - START_MONO) / 1000) as i64
    );
    assert_eq!(
        list(key(&t[3], "frames")).len(),
        3,
        "two native frames and the label"
    );
    assert_eq!(
        list(key(&t[4], "frames")).len(),
        0,
        "free_requested carries none"
    );

    // Only the newest 4 entries: the release of A and the failure.
    let opts = SnapshotOptions {
        pid: Some(77),
        max_entries: Some(4),
        until_ns: None,
    };
    let mut out = Vec::new();
    let n = export_pytorch(&trace, &opts, &mut out, &Progress::hidden()).unwrap();
    assert_eq!((n.entries, n.segments), (4, 1));
    let snap: V = serde_pickle::value_from_slice(&out, Default::default()).unwrap();
    let kept: Vec<&str> = list(&list(key(&snap, "device_traces"))[0])
        .iter()
        .map(|e| text(key(e, "action")))
        .collect();
    assert_eq!(
        kept,
        ["free_requested", "free_completed", "segment_free", "oom"]
    );
}

#[test]
fn perfetto_json_has_counters_slices_and_failures() {
    let dir = trace_dir("export-perfetto");
    let trace = Trace::open(&dir).unwrap();
    let mut out = Vec::new();
    let n = export_perfetto(&trace, &mut out, &Progress::hidden()).unwrap();
    assert_eq!((n.counters, n.slices, n.failures), (4, 3, 1));
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["displayTimeUnit"], "ns");
    let evs = v["traceEvents"].as_array().unwrap();
    let of = |ph: &str| evs.iter().filter(|e| e["ph"] == ph).collect::<Vec<_>>();

    let dev: Vec<(f64, u64)> = of("C")
        .iter()
        .filter(|e| e["name"] == "live bytes: device 0")
        .map(|e| {
            (
                e["ts"].as_f64().unwrap(),
                e["args"]["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    // ts: µs since the process started (t_ns - 500).
    assert_eq!(dev, [(0.5, MIB), (1.5, 5 * MIB), (2.5, 4 * MIB)]);
    let peak = dev.iter().map(|d| d.1).max().unwrap();
    assert_eq!(peak, 5 * MIB);
    let host: Vec<u64> = of("C")
        .iter()
        .filter(|e| e["name"] == "live bytes: host")
        .map(|e| e["args"]["bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(host, [1024]);

    let slices = of("X");
    let a = slices
        .iter()
        .find(|e| e["args"]["ptr"] == format!("{A:#x}"))
        .unwrap();
    assert_eq!(a["name"], "cuMemAlloc_v2");
    assert_eq!(
        (a["ts"].as_f64(), a["dur"].as_f64()),
        (Some(0.5), Some(2.0))
    );
    assert_eq!(a["args"]["size"], MIB);
    let b = slices
        .iter()
        .find(|e| e["args"]["ptr"] == format!("{B:#x}"))
        .unwrap();
    assert_eq!(b["name"], "h bf16[2, 3]");
    assert_eq!(b["args"]["label"], "prefill");
    assert_eq!(b["args"]["live_at_end"], true);
    assert_eq!(
        (b["ts"].as_f64(), b["dur"].as_f64()),
        (Some(1.5), Some(3.0))
    );
    // A and B overlap, so they sit on different lanes (pseudo threads).
    assert_ne!(a["tid"], b["tid"]);

    // The failures' instants (the growth analysis adds one of its own, `growth: none`).
    let fail: Vec<_> = of("i")
        .into_iter()
        .filter(|e| {
            e["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("alloc failed"))
        })
        .collect();
    assert_eq!(fail.len(), 1);
    assert_eq!(fail[0]["name"], "alloc failed: 8.00 MiB");
    assert_eq!(fail[0]["args"]["free_bytes"], 2 * MIB);
    assert_eq!(fail[0]["ts"].as_f64(), Some(3.5));
    let names: Vec<&serde_json::Value> = of("M")
        .into_iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| &e["args"]["name"])
        .collect();
    assert_eq!(names, ["python3[77] python3 train.py"]);
}

#[test]
fn flamegraph_weighs_stacks_by_bytes() {
    let dir = trace_dir("export-flamegraph");
    let trace = Trace::open(&dir).unwrap();
    let folded = |weight| {
        let mut out = Vec::new();
        let opts = FlamegraphOptions {
            weight,
            folded: true,
            title: None,
        };
        export_flamegraph(&trace, &opts, &mut out, &Progress::hidden()).unwrap();
        String::from_utf8(out).unwrap()
    };
    // At the peak (5 MiB, after B) both A and B are live, B with its final name.
    assert_eq!(
        folded(Weight::Peak),
        "python3[77];device 0;<no stack> 1048576\n\
         python3[77];device 0;? 0x2222;? 0x1111;h bf16[2, 3] 4194304\n"
    );
    // At the failure only B is.
    assert_eq!(
        folded(Weight::Oom),
        "python3[77];device 0;failed 8.00 MiB (2.00 MiB free);? 0x2222;? 0x1111;h bf16[2, 3] 4194304\n"
    );
    // Allocated: names come later than allocations, so the label is the leaf.
    assert_eq!(
        folded(Weight::Allocated),
        "python3[77];device 0;<no stack> 1048576\n\
         python3[77];device 0;? 0x2222;? 0x1111;[prefill] 4194304\n"
    );
    let mut svg = Vec::new();
    let opts = FlamegraphOptions::default();
    let total = export_flamegraph(&trace, &opts, &mut svg, &Progress::hidden()).unwrap();
    assert_eq!(total, 5 * MIB);
    let svg = String::from_utf8(svg).unwrap();
    assert!(svg.starts_with("<?xml"), "{}", &svg[..100]);
    assert!(svg.contains("h bf16[2, 3]") && svg.contains("python3[77]"));
}

fn export(dir: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(vramtrace())
        .arg("export")
        .arg(dir)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn cli_writes_each_format_and_refuses_bad_input() {
    let dir = trace_dir("export-cli");
    for (format, file) in [
        ("parquet", "tables"),
        ("pytorch", "snap.pickle"),
        ("perfetto", "trace.json"),
        ("flamegraph", "peak.svg"),
    ] {
        let out = dir.join(file);
        let o = export(&dir, &["--format", format, "-o", out.to_str().unwrap()]);
        assert!(o.status.success(), "{format}: {}", describe(&o));
        assert!(out.exists());
        // A second export onto it needs --force.
        let o = export(&dir, &["--format", format, "-o", out.to_str().unwrap()]);
        assert!(!o.status.success(), "{format} overwrote without --force");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("--force"),
            "{}",
            describe(&o)
        );
        let o = export(
            &dir,
            &["--format", format, "-o", out.to_str().unwrap(), "--force"],
        );
        assert!(o.status.success(), "{format} --force: {}", describe(&o));
    }

    let o = export(&dir, &["--format", "csv", "-o", "x"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("parquet") && err.contains("pytorch") && err.contains("perfetto"),
        "{err}"
    );

    let o = export(
        &dir,
        &["--format", "perfetto", "-o", "/nonexistent-dir/trace.json"],
    );
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("cannot create"),
        "{}",
        describe(&o)
    );

    // A trace with a process but no event.
    let empty = scratch("export-empty");
    let mut bytes = Vec::new();
    Header {
        version: 1,
        pid: 5,
        ..Header::default()
    }
    .encode(&mut bytes);
    std::fs::write(empty.join("5.vtr"), bytes).unwrap();
    let o = export(
        &empty,
        &[
            "--format",
            "perfetto",
            "-o",
            empty.join("t.json").to_str().unwrap(),
        ],
    );
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no recorded event"),
        "{}",
        describe(&o)
    );
    assert!(!empty.join("t.json").exists());

    let help = std::process::Command::new(vramtrace())
        .args(["export", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for opener in ["DuckDB", "memory_viz", "ui.perfetto.dev", "inferno"] {
        assert!(help.contains(opener), "--help does not mention {opener}");
    }
}

#[test]
fn parquet_splits_a_long_trace_into_row_groups() {
    use parquet::file::reader::FileReader as _;
    let dir = scratch("export-parquet-groups");
    let mut bytes = Vec::new();
    Header {
        version: 1,
        pid: 3,
        ..Header::default()
    }
    .encode(&mut bytes);
    let mut buf = vec![0u8; 256];
    // 150,000 allocate/free pairs: 300,000 rows, more than one row group.
    let pairs = 150_000u64;
    for i in 0..pairs {
        for (k, kind, name) in [
            (0, EventKind::Alloc, "cuMemAlloc_v2"),
            (1, EventKind::Free, "cuMemFree_v2"),
        ] {
            let e = Event {
                t_ns: 10 + 2 * i + k,
                kind,
                api: api(name),
                ptr: 0x1000 + (i % 7) * 0x100_0000,
                size: if k == 0 { 512 * (i % 5 + 1) } else { 0 },
                ..Event::default()
            };
            bytes.extend_from_slice(Record::Event(e).encode(&mut buf));
        }
    }
    std::fs::write(dir.join("3.vtr"), bytes).unwrap();
    let trace = Trace::open(&dir).unwrap();
    let n = export_parquet(&trace, &dir.join("t"), &Progress::hidden()).unwrap();
    assert_eq!(n.events, 2 * pairs);
    let r = SerializedFileReader::new(std::fs::File::open(dir.join("t/events.parquet")).unwrap())
        .unwrap();
    let groups: Vec<i64> = r
        .metadata()
        .row_groups()
        .iter()
        .map(|g| g.num_rows())
        .collect();
    let full = vramtrace::export::parquet::ROW_GROUP_ROWS as i64;
    assert_eq!(groups, [full, 2 * pairs as i64 - full]);
    // Every release carries the size it released: allocated bytes == released bytes.
    let (mut alloc, mut freed) = (0i64, 0i64);
    for row in r.get_row_iter(None).unwrap() {
        let row = row.unwrap();
        let f = fields(&row);
        let Field::Long(size) = get(&f, "size") else {
            panic!()
        };
        match get(&f, "kind") {
            Field::Str(k) if k == "alloc" => alloc += size,
            Field::Str(k) if k == "free" => freed += size,
            k => panic!("{k:?}"),
        }
    }
    let expect: i64 = (0..pairs).map(|i| 512 * (i as i64 % 5 + 1)).sum();
    assert_eq!((alloc, freed), (expect, expect));
}

/// DuckDB, as a user would, reads the Parquet export of a real H200 trace: the counts and byte
/// sums per event kind are the trace's (`samples/h200/prefill-18gib`: 2917 allocations, as many
/// frees, and the failed request for `h`). Needs the `duckdb` Python package (CI installs it
/// into a folder named by `VRAMTRACE_TEST_PYTHONPATH` and sets `VRAMTRACE_REQUIRE_DUCKDB=1`).
#[test]
fn duckdb_reads_the_parquet_export_of_an_h200_trace() {
    let Some(pythonpath) =
        vramtrace_testkit::duckdb_or_skip("duckdb_reads_the_parquet_export_of_an_h200_trace")
    else {
        return;
    };
    let out = vramtrace_testkit::scratch("duckdb").join("tables");
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/h200/prefill-18gib");
    let o = export(
        &sample,
        &["--format", "parquet", "-o", out.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", vramtrace_testkit::describe(&o));
    let query = format!(
        "import duckdb; \
         rows = duckdb.sql(\"SELECT kind, count(*), sum(size) FROM '{}' GROUP BY kind ORDER BY kind\").fetchall(); \
         print(rows); \
         print(duckdb.sql(\"SELECT d.name, e.free_bytes FROM '{}' e JOIN '{}' d ON e.pid = d.pid AND e.device = d.ordinal WHERE e.kind = 'alloc_failed'\").fetchall())",
        out.join("events.parquet").display(),
        out.join("events.parquet").display(),
        out.join("devices.parquet").display(),
    );
    let q = std::process::Command::new("python3")
        .args(["-c", &query])
        .env("PYTHONPATH", &pythonpath)
        .output()
        .unwrap();
    assert!(q.status.success(), "{}", vramtrace_testkit::describe(&q));
    let text = String::from_utf8_lossy(&q.stdout);
    let mut lines = text.lines();
    let by_kind = lines.next().unwrap();
    for expected in [
        "('alloc', 2917, 257557832496)",
        "('alloc_failed', 1, 102236160)",
        "('free', 2917, 257557832496)",
    ] {
        assert!(by_kind.contains(expected), "{expected} not in {by_kind}");
    }
    assert_eq!(lines.next().unwrap(), "[('NVIDIA H200', 76677120)]");
}
