//! `vramtrace diff`: two H200 samples through the real CLI, and two synthetic traces through
//! the library, with exact numbers.

mod common;

use std::path::PathBuf;
use std::process::Command;

use vramtrace::diff::{DiffOptions, Row, diff};
use vramtrace::trace::Trace;
use vramtrace_format::{Api, DeviceInfo, Event, EventKind, Header, MemKind, Record, TraceFile};

const MIB: u64 = 1 << 20;

#[test]
fn two_h200_samples_by_label() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let o = Command::new(common::vramtrace())
        .arg("diff")
        .arg(root.join("samples/h200/workload-gdn-t4128"))
        .arg(root.join("samples/h200/fla-gdn-t4128"))
        .arg("--json")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", common::describe(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let d = &v["devices"][0];
    assert_eq!(d["device"], 0);
    assert_eq!(d["a"]["pid"], 1124);
    assert_eq!(d["a"]["peak_bytes"], 420_166_656u64);
    assert_eq!(d["b"]["pid"], 1405);
    assert_eq!(d["b"]["peak_bytes"], 423_312_384u64);
    assert_eq!(d["peak_difference"], 3_145_728);
    let row = |key: &str| {
        d["by_label"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["key"] == key)
            .unwrap_or_else(|| panic!("no row {key}"))
            .clone()
    };
    let h = row("h [chunk_gated_delta_rule/chunk_gated_delta_rule_fwd_h]");
    assert_eq!(
        (h["a_bytes"].as_u64(), h["b_bytes"].as_u64()),
        (Some(102_236_160), Some(0))
    );
    assert_eq!(h["difference"], -102_236_160i64);
    // fla's own tensors are not named in B: 8 unnamed allocations, 318.94 MiB.
    let unnamed = row("(unnamed, no label)");
    assert_eq!(unnamed["b_count"], 8);
    assert_eq!(unnamed["b_bytes"], 334_436_352u64);
    // Largest difference first.
    assert_eq!(d["by_label"][0]["key"], "(unnamed, no label)");
    // By the categoriser's rows at each peak: A's labelled workload tensors are activations
    // and the recurrent state; B's fla tensors carry no frame, no label: unnamed.
    let cat = |key: &str| {
        d["by_category"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["key"] == key)
            .unwrap_or_else(|| panic!("no category row {key}"))
            .clone()
    };
    let u = cat("unnamed");
    assert_eq!(
        (u["a_bytes"].as_u64(), u["b_bytes"].as_u64()),
        (Some(0), Some(334_436_352))
    );
    assert_eq!(u["b_count"], 8);
    let st = cat("recurrent state");
    assert_eq!(
        (st["a_bytes"].as_u64(), st["b_bytes"].as_u64()),
        (Some(3_145_728), Some(3_145_728))
    );
    assert_eq!(d["by_category"][0]["key"], "unnamed");
    // And as text.
    let t = Command::new(common::vramtrace())
        .arg("diff")
        .arg(root.join("samples/h200/workload-gdn-t4128"))
        .arg(root.join("samples/h200/fla-gdn-t4128"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&t.stdout);
    assert!(
        text.contains("  peak B - A: +3.00 MiB (3145728 B)"),
        "{text}"
    );
    assert!(
        text.contains("      97.50 MiB x1           0 B x0    -97.50 MiB  h [chunk_gated_delta_rule/chunk_gated_delta_rule_fwd_h]"),
        "{text}"
    );
}

fn ev(t: u64, kind: EventKind, ptr: u64, size: u64, label: u32) -> Event {
    Event {
        t_ns: t,
        tid: 1,
        device: 0,
        kind,
        mem: MemKind::Device,
        api: Api::from_name(if kind == EventKind::Free {
            "cuMemFree_v2"
        } else {
            "cuMemAlloc_v2"
        })
        .unwrap(),
        result: if kind == EventKind::AllocFailed { 2 } else { 0 },
        ptr,
        size,
        label,
        ..Event::default()
    }
}

/// A prefill with a chunk of `chunk` MiB of activations per layer over two layers, weights of
/// 100 MiB, and with `fail` an OOM after the peak.
fn prefill(pid: u32, chunk: u64, fail: bool) -> Trace {
    let s = |id, text: &str| Record::String {
        id,
        text: text.into(),
    };
    let mut records = vec![
        s(1, "weights"),
        s(2, "chunk.0/layer.0/gdn"),
        s(3, "chunk.0/layer.1/gdn"),
        Record::Event(ev(10, EventKind::Alloc, 0x1000, 100 * MIB, 1)),
        Record::Event(ev(20, EventKind::Alloc, 0x2000, chunk * MIB, 2)),
        Record::Event(ev(30, EventKind::Alloc, 0x3000, chunk * MIB, 3)),
        Record::Event(ev(40, EventKind::Free, 0x2000, 0, 0)),
    ];
    if fail {
        let mut f = ev(50, EventKind::AllocFailed, 0, 512 * MIB, 3);
        f.free_bytes = 8 * MIB;
        f.total_bytes = 1 << 30;
        records.push(Record::Event(f));
    }
    Trace::from_files(vec![TraceFile {
        path: format!("{pid}.vtr").into(),
        header: Header {
            pid,
            ppid: 1,
            cmdline: vec!["/usr/bin/python3".into()],
            ..Header::default()
        },
        driver_version: Some(13000),
        devices: vec![DeviceInfo {
            ordinal: 0,
            total_bytes: 1 << 30,
            name: "stand-in".into(),
        }],
        records,
        problems: vec![],
    }])
}

#[test]
fn two_chunk_sizes_exactly() {
    let a = prefill(10, 64, true);
    let b = prefill(20, 32, false);
    let d = diff(&a, &b, DiffOptions::default()).unwrap();
    assert_eq!(d.devices.len(), 1);
    let dev = &d.devices[0];
    let (sa, sb) = (dev.a.as_ref().unwrap(), dev.b.as_ref().unwrap());
    assert_eq!(
        (sa.pid, sa.peak_bytes, sa.peak_live_count),
        (10, 228 * MIB, 3)
    );
    assert_eq!(
        (sb.pid, sb.peak_bytes, sb.peak_live_count),
        (20, 164 * MIB, 3)
    );
    assert_eq!(sa.program, "python3");
    assert_eq!(dev.peak_difference, -(64 * MIB as i128));
    assert_eq!(sa.failures.len(), 1);
    assert_eq!(
        (sa.failures[0].size, sa.failures[0].free_bytes),
        (512 * MIB, 8 * MIB)
    );
    assert_eq!(sa.failures[0].label.as_deref(), Some("chunk.0/layer.1/gdn"));
    assert!(sb.failures.is_empty());
    assert_eq!(
        dev.by_label,
        vec![
            Row {
                key: "(unnamed) [chunk.#/layer.#/gdn]".into(),
                a_bytes: 128 * MIB,
                a_count: 2,
                b_bytes: 64 * MIB,
                b_count: 2,
                difference: -(64 * MIB as i128),
            },
            Row {
                key: "(unnamed) [weights]".into(),
                a_bytes: 100 * MIB,
                a_count: 1,
                b_bytes: 100 * MIB,
                b_count: 1,
                difference: 0,
            },
        ]
    );
    assert_eq!(dev.by_stack.len(), 1);
    assert_eq!(dev.by_stack[0].key, "(no stack)");
    assert_eq!(dev.by_stack[0].difference, -(64 * MIB as i128));
}

#[test]
fn a_device_only_one_trace_uses() {
    let a = prefill(10, 64, false);
    let b = Trace::from_files(vec![]);
    let d = diff(&a, &b, DiffOptions::default()).unwrap();
    assert_eq!(d.devices.len(), 1);
    assert!(d.devices[0].b.is_none());
    assert_eq!(d.devices[0].peak_difference, -(228 * MIB as i128));
    assert!(d.devices[0].by_label.iter().all(|r| r.b_bytes == 0));
}

/// fla's GDN against PyTorch's FlashAttention, both recorded with tensor records on the H200:
/// the tensors at each tensor peak by Python line (`summary` gives A's as 659.70 MiB in 15
/// tensors).
#[test]
fn two_h200_samples_by_python_line() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("samples/h200");
    let a = Trace::open(&dir.join("pytorch-gdn-cache")).unwrap();
    let b = Trace::open(&dir.join("pytorch-fa-cache")).unwrap();
    let d = diff(&a, &b, DiffOptions::default()).unwrap();
    let dev = &d.devices[0];
    let a_total: u64 = dev.by_line.iter().map(|r| r.a_bytes).sum();
    let a_count: usize = dev.by_line.iter().map(|r| r.a_count).sum();
    assert_eq!((a_total, a_count), (691_747_840, 15));
    let row = |key: &str| dev.by_line.iter().find(|r| r.key == key).unwrap().clone();
    assert_eq!(
        row("driver.py:761 get_empty_cache_for_benchmark"),
        Row {
            key: "driver.py:761 get_empty_cache_for_benchmark".into(),
            a_bytes: 256 << 20,
            a_count: 1,
            b_bytes: 0,
            b_count: 0,
            difference: -(256 << 20),
        }
    );
    let fa = row("model_vs_torch.py:170 call");
    assert_eq!((fa.a_count, fa.b_count, fa.b_bytes), (0, 4, 51_122_176));
    // The largest difference first.
    assert_eq!(
        dev.by_line[0].key,
        "driver.py:761 get_empty_cache_for_benchmark"
    );
    // By tensor: operator, shape pattern and dtype at the line.
    assert!(
        dev.by_tensor.iter().any(|r| r.key
            == "input q bfloat16[#, #, #] @ model_vs_torch.py:160 fa"
            && r.b_bytes == 50_724_864),
        "{:?}",
        dev.by_tensor
    );
    let text = vramtrace::diff::render(&d, "A", "B", 3);
    assert!(
        text.contains("tensors at the tensor peak, by Python line"),
        "{text}"
    );
}
