//! `vramtrace compare` with PyTorch's caching allocator on: the driver sees one segment, the
//! TENSOR records the tensors inside it (fla 0.6.0's at T=4128, H=48, K=V=128 bf16, after an
//! unnamed input of v's size), each with its Python frames in the file the model cites. The
//! comparison takes the live tensors, not the segment: at the tensor peak every fla tensor is
//! matched with a frame as evidence (the four look-alikes of 50,724,864 bytes too), and at the
//! allocator's refusal (`--at oom`) the refused request is `o`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use vramtrace_format::{
    Api, BlockFileWriter, DeviceInfo, Event, EventKind, Header, MemKind, PyFrame, Record,
    TensorAction, TensorEvent,
};

/// (name, bytes, file, line, function) in fla's allocation order.
const FLA: [(&str, u64, &str, u32, &str); 8] = [
    (
        "g",
        792576,
        "fla/ops/utils/cumsum.py",
        278,
        "chunk_local_cumsum",
    ),
    (
        "A",
        25362432,
        "fla/ops/gated_delta_rule/chunk_fwd.py",
        385,
        "chunk_fwd",
    ),
    (
        "w",
        50724864,
        "fla/ops/gated_delta_rule/wy_fast.py",
        273,
        "recompute_w_u_fwd",
    ),
    (
        "u",
        50724864,
        "fla/ops/gated_delta_rule/wy_fast.py",
        274,
        "recompute_w_u_fwd",
    ),
    (
        "h",
        102236160,
        "fla/ops/common/chunk_delta_h.py",
        722,
        "chunk_fwd_h",
    ),
    (
        "final_state",
        3145728,
        "fla/ops/common/chunk_delta_h.py",
        723,
        "chunk_fwd_h",
    ),
    (
        "v_new",
        50724864,
        "fla/ops/common/chunk_delta_h.py",
        725,
        "chunk_fwd_h",
    ),
    (
        "o",
        50724864,
        "fla/ops/common/chunk_o.py",
        565,
        "chunk_fwd_o",
    ),
];
const SEGMENT: u64 = 0x7000_0000_0000;

/// The trace; with `refuse_o` the allocator refuses `o` (a memory fraction limit).
fn write_trace(dir: &Path, refuse_o: bool) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let header = Header {
        pid: 99,
        ppid: 1,
        start_mono_ns: 1,
        cmdline: vec!["python3".into(), "prefill.py".into()],
        ..Header::default()
    };
    let mut w = BlockFileWriter::new(&header, 1 << 16);
    let mut records = vec![
        Record::Device(DeviceInfo {
            ordinal: 0,
            total_bytes: 24 << 30,
            name: "stand-in".into(),
        }),
        Record::Event(Event {
            t_ns: 100,
            tid: 7,
            device: 0,
            kind: EventKind::Alloc,
            mem: MemKind::Device,
            api: Api::from_name("cuMemAlloc_v2").unwrap(),
            ptr: SEGMENT,
            size: 1 << 30,
            ..Event::default()
        }),
    ];
    let mut next_string = 1u32;
    let mut string = |records: &mut Vec<Record>, text: &str| {
        let id = next_string;
        next_string += 1;
        records.push(Record::String {
            id,
            text: text.into(),
        });
        id
    };
    let probe = string(&mut records, "/opt/vramtrace/vramtrace_torch.py");
    let on_alloc = string(&mut records, "on_alloc");
    let model = string(&mut records, "/app/model.py");
    let forward = string(&mut records, "forward");
    let mut stack = |records: &mut Vec<Record>, id: u32, file: &str, line: u32, f: &str| {
        let file = string(records, &format!("/site/{file}"));
        let function = string(records, f);
        records.push(Record::Stack {
            id,
            frames: Vec::new(),
        });
        records.push(Record::PyStack {
            stack: id,
            frames: vec![
                PyFrame {
                    file: probe,
                    function: on_alloc,
                    line: 95,
                },
                PyFrame {
                    file,
                    function,
                    line,
                },
                PyFrame {
                    file: model,
                    function: forward,
                    line: 40,
                },
            ],
        });
    };
    stack(&mut records, 1, "app/model.py", 12, "embed");
    for (i, (_, _, file, line, f)) in FLA.iter().enumerate() {
        stack(&mut records, i as u32 + 2, file, *line, f);
    }
    let mut t = 1000;
    let mut ptr = SEGMENT;
    let mut sizes = vec![(50724864u64, 1u32)];
    sizes.extend(FLA.iter().enumerate().map(|(i, x)| (x.1, i as u32 + 2)));
    for (i, (size, stack)) in sizes.iter().enumerate() {
        t += 10;
        let refused = refuse_o && i == sizes.len() - 1;
        let mut e = TensorEvent {
            t_ns: t,
            tid: 7,
            device: 0,
            action: TensorAction::Alloc,
            ptr,
            size: *size,
            stack: *stack,
            ..TensorEvent::default()
        };
        if refused {
            e.action = TensorAction::AllocFailed;
            e.ptr = 0;
            e.allocated = ptr - SEGMENT;
            e.reserved = 1 << 30;
            e.limit = ptr - SEGMENT + (10 << 20);
            e.free = 20 << 30;
        }
        records.push(Record::Tensor(e));
        ptr += size.div_ceil(512) * 512;
    }
    for r in &records {
        w.push(7, r).unwrap();
    }
    std::fs::write(dir.join("99.vtr"), w.finish()).unwrap();
    dir.to_path_buf()
}

fn json(o: &std::process::Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", describe(o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn the_tensor_peak_is_compared_with_frames_as_evidence() {
    let dir = write_trace(&scratch("compare-tensors-peak"), false);
    let v = json(&compare_fla(&dir, &["--json"]));
    let a = &v["attribution"];
    let rows = a["rows"].as_array().unwrap();
    for (r, (name, bytes, file, line, f)) in rows.iter().zip(FLA) {
        assert_eq!(r["predicted_bytes"], bytes, "{name}");
        assert_eq!(r["observed_bytes"], bytes, "{name}: {r}");
        let base = file.rsplit('/').next().unwrap();
        assert_eq!(r["evidence"]["kind"], "frame", "{name}: {r}");
        assert_eq!(
            r["evidence"]["frame"],
            format!("{base}:{line} {f}"),
            "{name}"
        );
    }
    let fla: u64 = FLA.iter().map(|x| x.1).sum();
    // The live tensors, not the 1 GiB segment: fla's eight and the input.
    assert_eq!(a["observed_bytes"], fla + 50724864);
    assert_eq!(a["attributed_bytes"], fla);
    assert_eq!(a["evidence"]["evidence_bytes"], fla);
    assert_eq!(a["evidence"]["size_only_bytes"], 0);
    assert_eq!(a["evidence"]["ambiguous"], 0);
    assert_eq!(a["observed"][0]["api"], "pytorch");
    assert_eq!(a["observed"][0]["frames"][0], "model.py:12 embed");
    let text = compare_fla(&dir, &[]);
    let s = String::from_utf8_lossy(&text.stdout);
    assert!(s.contains("tensor peak"), "{s}");
    assert!(s.contains("frame chunk_o.py:565 chunk_fwd_o"), "{s}");
    assert!(!s.contains("vramtrace_torch.py"), "{s}");
}

#[test]
fn an_allocator_oom_is_a_failure_whose_request_is_the_refused_tensor() {
    let dir = write_trace(&scratch("compare-tensors-oom"), true);
    let o = compare_fla(&dir, &["--at", "oom"]);
    assert!(o.status.success(), "{}", describe(&o));
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(
        s.contains("the failed request is o bfloat16 [1, 4128, 48, 128]"),
        "{s}"
    );
    assert!(s.contains("PyTorch's allocator refused"), "{s}");
    let v = json(&compare_fla(&dir, &["--at", "oom", "--json"]));
    let a = &v["attribution"];
    assert_eq!(a["failed_tensor"], 7);
    let rows = a["rows"].as_array().unwrap();
    assert_eq!(rows[7]["evidence"]["frame"], "chunk_o.py:565 chunk_fwd_o");
    assert_eq!(rows[6]["evidence"]["kind"], "frame", "{}", rows[6]);
    let bad = compare_fla(&dir, &["--at", "oom:1"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("there is no failure #1"),
        "{}",
        describe(&bad)
    );
    // plot --kind breakdown takes the same moment.
    let svg = dir.join("oom.svg");
    let o = Command::new(vramtrace())
        .arg("plot")
        .arg(&dir)
        .args([
            "--kind",
            "breakdown",
            "--model",
            QWEN_CONFIG,
            "--variant",
            "fla-0.6.0",
        ])
        .args(["--tokens", "4128", "--at", "oom", "-o"])
        .arg(&svg)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", describe(&o));
    let body = std::fs::read_to_string(&svg).unwrap();
    assert!(body.contains("v_new"), "the breakdown names fla's tensors");
}

/// The report explains PyTorch's message from the tensor records: the live tensors with their
/// lines, reserved-but-unallocated as segment minus tensor bytes with the largest free block
/// against the request, the limit, and what lies outside PyTorch; snapshot of the section.
#[test]
fn the_report_explains_pytorchs_message_from_the_tensors() {
    let dir = write_trace(&scratch("report-tensors-oom"), true);
    let o = Command::new(vramtrace())
        .arg("report")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", describe(&o));
    let md = String::from_utf8(o.stdout).unwrap();
    let start = md
        .find("PyTorch's out-of-memory message")
        .expect("the section");
    let end = start + md[start..].find("Still unknown").unwrap();
    let end = end + md[end..].find('\n').unwrap() + 1;
    let section = &md[start..end];
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/report_tensors_message.md");
    if vramtrace_testkit::bless("UPDATE_SNAPSHOTS") {
        std::fs::write(&path, section).unwrap();
    }
    let want = std::fs::read_to_string(&path).expect("run with UPDATE_SNAPSHOTS=1 to create it");
    assert_eq!(
        section, want,
        "the section changed; look at it, then UPDATE_SNAPSHOTS=1"
    );
    assert!(section.contains("334,436,352 B) in 8 live tensors"));
    assert!(section.contains("`chunk_delta_h.py:722 chunk_fwd_h`"));
    assert!(section.contains("= PyTorch's reserved 1.00 GiB − allocated 318.94 MiB"));
    assert!(section.contains("refused before asking the driver"));
    // The free block would have held the request: not fragmentation, PyTorch's limit refused
    // it with 20 GiB free on the card.
    let o = Command::new(vramtrace())
        .arg("report")
        .arg(&dir)
        .arg("--json")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", describe(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["verdict"]["class"], "limit", "{j}");
    assert_eq!(j["limit"]["bytes"], 344_922_112);
    // reserved 1 GiB + the segment the 48.38 MiB request asks for (rounded up to 2 MiB:
    // 50 MiB) − the limit.
    assert_eq!(j["shortfall"], (1u64 << 30) + 50 * (1 << 20) - 344_922_112);
}
