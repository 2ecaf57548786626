//! `vramtrace report`: the real CLI on the H200 prefill sample with the Qwen3.6-27B model (key
//! lines exact), `--html` as one file with the plots inline, and a snapshot of the Markdown of a
//! small synthetic trace.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use vramtrace::report::{ReportOptions, build, markdown};
use vramtrace::trace::Trace;
use vramtrace_format::{Api, DeviceInfo, Event, EventKind, Header, MemKind, Record, TraceFile};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "vramtrace-test-report-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn report(extra: &[&str], out: &Path) -> std::process::Output {
    let r = root();
    let mut c = Command::new(common::vramtrace());
    c.arg("report")
        .arg(r.join("samples/h200/prefill-18gib"))
        .arg("--model")
        .arg(r.join("samples/models/Qwen3.6-27B/config.json"))
        .args([
            "--variant",
            "fla-0.6.0",
            "--tokens",
            "4128",
            "--capacity",
            "24GiB",
            "--hide",
            "other",
            "-o",
        ])
        .arg(out)
        .args(extra);
    c.output().unwrap()
}

#[test]
fn prefill_sample_report_states_the_failure_and_the_levers() {
    let out = scratch("md");
    let o = report(&[], &out);
    assert!(o.status.success(), "{}", common::describe(&o));
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    let lines: Vec<&str> = md.lines().collect();
    let has = |s: &str| assert!(md.contains(s), "missing {s:?} in\n{md}");
    // The first screen: the failure, its request, the free bytes, the levers.
    assert_eq!(
        lines[2],
        "**Out of memory on cuda:0 (NVIDIA H200, 139.80 GiB)** in `vramtrace-workload` pid 449 (parent 447) at 7.902 s."
    );
    assert_eq!(
        lines[4],
        "- **Request**: `cuMemAlloc_v2` of **97.50 MiB (102,236,160 B)** failed with CUDA_ERROR_OUT_OF_MEMORY (2); the driver said **73.12 MiB (76,677,120 B)** free of 139.80 GiB, **24.38 MiB short**."
    );
    has("- **What**: `h` bfloat16 [1, 65, 48, 128, 128] of fla-0.6.0 (97.50 MiB predicted)");
    has("untraced on the device (contexts, modules, other processes): 772.50 MiB.");
    has(
        "  - the cliff: a prefill chunk of **86191 tokens** or more does not fit (17.57 GiB resident); this one was 4128: keep `--max-num-batched-tokens` at **86190** or below.",
    );
    has(
        "  - halving the chunk to 2064 tokens takes **157.22 MiB** off the kernel's peak (318.94 MiB → 161.72 MiB) — more than the shortfall.",
    );
    has(
        "  - fp8 KV cache frees **387.00 MiB** at the 12384 tokens the cache held — more than the shortfall.",
    );
    let top_end = lines.iter().position(|l| *l == "---").unwrap();
    assert!(top_end < 20, "the first screen is {top_end} lines");
    // Below: exact bytes.
    has(
        "| KV cache bfloat16 → fp8 (`--kv-cache-dtype fp8`) | 64.00 KiB (65,536 B) → 32.00 KiB (32,768 B) per token; 774.00 MiB (811,597,824 B) live in the KV cache = 12384 tokens at bfloat16 | frees **387.00 MiB (405,798,912 B)**",
    );
    has("| untraced (total − free − traced live) | 772.50 MiB (810,021,840 B) |");
    has(
        "| `h` | [1, 65, 48, 128, 128] | bfloat16 | 102,236,160 | **the failed request** | — | order and size |",
    );
    has("| `o` | [1, 4128, 48, 128] | bfloat16 | 50,724,864 | not live | — |  |");
    has("| `layer.#.kv.chunk.# [prefill/kv_cache]` | KV cache | 48 | 774.00 MiB (811,597,824 B) |");
    has(
        "Headroom at the failure (7.902 s): total 139.80 GiB − traced live 138.97 GiB − untraced 772.50 MiB = 73.12 MiB free, against a request of 97.50 MiB.",
    );
    has("<details><summary>stack of the failed request</summary>");
    for png in ["timeline.png", "breakdown.png", "cliff.png"] {
        has(&format!("]({png})"));
        let bytes = std::fs::read(out.join(png)).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{png}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn html_is_one_file_with_the_plots_inline() {
    let out = scratch("html");
    let o = report(&["--html"], &out);
    assert!(o.status.success(), "{}", common::describe(&o));
    let files: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files, vec!["report.html".to_string()]);
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert_eq!(
        html.matches("src=\"data:image/png;base64,iVBORw0KGgo")
            .count(),
        3
    );
    assert!(!html.contains(".png\""), "no image outside the file");
    assert!(html.contains("<table>") && html.contains("<details>"));
    assert!(html.contains("<strong>86191 tokens</strong>"));
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn an_unreadable_trace_gets_a_report_that_says_so() {
    let dir = scratch("empty-in");
    std::fs::create_dir_all(&dir).unwrap();
    let o = Command::new(common::vramtrace())
        .arg("report")
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let md = String::from_utf8_lossy(&o.stdout);
    assert!(
        md.contains("**No report: the trace could not be read.**"),
        "{md}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn ev(t: u64, kind: EventKind, api: &str, ptr: u64, size: u64, label: u32) -> Event {
    Event {
        t_ns: t,
        tid: 1,
        device: 0,
        kind,
        mem: MemKind::Device,
        api: Api::from_name(api).unwrap(),
        result: 0,
        ptr,
        size,
        label,
        ..Event::default()
    }
}

/// A server rank: weights, a KV cache, one activation, an OOM, and a refused call.
fn synthetic() -> Trace {
    const MIB: u64 = 1 << 20;
    let s = |id, text: &str| Record::String {
        id,
        text: text.into(),
    };
    let mut oom = ev(900, EventKind::AllocFailed, "cuMemAlloc_v2", 0, 96 * MIB, 4);
    oom.result = 2;
    oom.free_bytes = 40 * MIB;
    oom.total_bytes = 1 << 30;
    let mut refused = ev(950, EventKind::AllocFailed, "cuMemCreate", 0, 2 * MIB, 0);
    refused.result = 1;
    let records = vec![
        s(1, "model/layers.0.weight"),
        s(2, "model/layers.1.weight"),
        s(3, "kv_cache/layer.3"),
        s(4, "forward/layer.7/attn"),
        Record::Event(ev(
            100,
            EventKind::Alloc,
            "cuMemAlloc_v2",
            0x1000,
            400 * MIB,
            1,
        )),
        Record::Event(ev(
            200,
            EventKind::Alloc,
            "cuMemAlloc_v2",
            0x2000,
            400 * MIB,
            2,
        )),
        Record::Event(ev(
            300,
            EventKind::Alloc,
            "cuMemAlloc_v2",
            0x3000,
            64 * MIB,
            3,
        )),
        Record::Event(ev(
            400,
            EventKind::Alloc,
            "cuMemAlloc_v2",
            0x4000,
            32 * MIB,
            4,
        )),
        Record::Event(ev(
            500,
            EventKind::Alloc,
            "cuMemAlloc_v2",
            0x5000,
            3 * MIB,
            0,
        )),
        Record::Event(oom),
        Record::Event(refused),
        Record::Event(ev(990, EventKind::Free, "cuMemFree_v2", 0x4000, 0, 0)),
    ];
    Trace::from_files(vec![TraceFile {
        path: "4242.vtr".into(),
        header: Header {
            pid: 4242,
            ppid: 4200,
            hostname: "rig".into(),
            cmdline: vec![
                "python3".into(),
                "serve.py".into(),
                "--local-rank".into(),
                "1".into(),
            ],
            ..Header::default()
        },
        driver_version: Some(12040),
        devices: vec![DeviceInfo {
            ordinal: 0,
            total_bytes: 1 << 30,
            name: "NVIDIA GeForce RTX 3090".into(),
        }],
        records,
        problems: vec![],
    }])
}

#[test]
fn synthetic_report_matches_its_snapshot() {
    let r = build(
        &synthetic(),
        &ReportOptions {
            title: "synthetic".into(),
            ..ReportOptions::default()
        },
    )
    .unwrap();
    let md = markdown::render(&r, &markdown::Images::default());
    let path = root().join("tests/snapshots/report_synthetic.md");
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, &md).unwrap();
    }
    let want = std::fs::read_to_string(&path).expect("run with UPDATE_SNAPSHOTS=1 to create it");
    assert_eq!(
        md, want,
        "the Markdown changed; look at it, then UPDATE_SNAPSHOTS=1"
    );
}
