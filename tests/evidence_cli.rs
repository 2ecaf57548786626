//! What an attribution rests on, through `vramtrace compare` on synthetic PyTorch traces (the
//! caching allocator's tensors, each with its Python frames, name or operator description):
//! frames back a model only at its own module path and line (fla 0.6.0 and vLLM 0.20.1's
//! vendored copy have the same file names), the variant is chosen by the bytes its evidence
//! backs, and a tensor whose look-alike was allocated by other code says so even when the
//! modelled code allocated the others.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use vramtrace_format::{
    Annotation, BlockFileWriter, DeviceInfo, Event, EventKind, Header, MemKind, PyFrame, Record,
    TensorAction, TensorEvent,
};

/// One tensor of a synthetic trace.
#[derive(Clone, Default)]
struct T {
    bytes: u64,
    /// Its innermost Python frame: (co_filename, line, function).
    frame: Option<(&'static str, u32, &'static str)>,
    /// A name given through the annotation ABI.
    name: Option<&'static str>,
}

const G: u64 = 792576;
const A: u64 = 25362432;
const BIG: u64 = 50724864;
const H: u64 = 102236160;
const FINAL: u64 = 3145728;
/// fla 0.6.0's eight tensors at T=4128, H=48, K=V=128 bf16 (all live at its peak).
const FLA_BYTES: u64 = G + A + 4 * BIG + H + FINAL;

/// fla 0.6.0's tensors (allocation order) as its wheel allocates them, installed under /site.
fn fla() -> Vec<T> {
    let f = |bytes, file, line, func| T {
        bytes,
        frame: Some((file, line, func)),
        name: None,
    };
    vec![
        f(
            G,
            "/site/fla/ops/utils/cumsum.py",
            278,
            "chunk_local_cumsum_scalar",
        ),
        f(
            A,
            "/site/fla/ops/gated_delta_rule/chunk_fwd.py",
            385,
            "chunk_gated_delta_rule_fwd_intra",
        ),
        f(
            BIG,
            "/site/fla/ops/gated_delta_rule/wy_fast.py",
            273,
            "recompute_w_u_fwd",
        ),
        f(
            BIG,
            "/site/fla/ops/gated_delta_rule/wy_fast.py",
            274,
            "recompute_w_u_fwd",
        ),
        f(
            H,
            "/site/fla/ops/common/chunk_delta_h.py",
            722,
            "chunk_gated_delta_rule_fwd_h",
        ),
        f(
            FINAL,
            "/site/fla/ops/common/chunk_delta_h.py",
            723,
            "chunk_gated_delta_rule_fwd_h",
        ),
        f(
            BIG,
            "/site/fla/ops/common/chunk_delta_h.py",
            725,
            "chunk_gated_delta_rule_fwd_h",
        ),
        f(BIG, "/site/fla/ops/common/chunk_o.py", 565, "chunk_fwd_o"),
    ]
}

/// vLLM 0.20.1's vendored copy of fla (`vllm/model_executor/layers/fla/ops/`: the same file
/// names, other directories and lines), the tensors live at its peak in allocation order: g,
/// Ai, u, w, h, final_state, v_new, o (the fp32 A is freed before u).
fn vllm() -> Vec<T> {
    let f = |bytes, file, line, func| T {
        bytes,
        frame: Some((file, line, func)),
        name: None,
    };
    const OPS: &str = "/site/vllm/model_executor/layers/fla/ops";
    let p = |file: &str| -> &'static str { Box::leak(format!("{OPS}/{file}").into_boxed_str()) };
    vec![
        f(G, p("cumsum.py"), 180, "chunk_local_cumsum_scalar"),
        f(A, p("solve_tril.py"), 539, "solve_tril"),
        f(BIG, p("wy_fast.py"), 137, "recompute_w_u_fwd"),
        f(BIG, p("wy_fast.py"), 138, "recompute_w_u_fwd"),
        f(
            H,
            p("chunk_delta_h.py"),
            332,
            "chunk_gated_delta_rule_fwd_h",
        ),
        f(
            FINAL,
            p("chunk_delta_h.py"),
            334,
            "chunk_gated_delta_rule_fwd_h",
        ),
        f(
            BIG,
            p("chunk_delta_h.py"),
            337,
            "chunk_gated_delta_rule_fwd_h",
        ),
        f(BIG, p("chunk_o.py"), 161, "chunk_fwd_o"),
    ]
}

const SEGMENT: u64 = 0x7000_0000_0000;

/// A trace of process 99: one 1 GiB segment, then `tensors` allocated in it in order (none
/// freed), each with a Python stack of its frame above the caller's `/app/model.py:40 forward`
/// (none without a frame), and its name.
fn write_trace(dir: &Path, tensors: &[T]) -> PathBuf {
    let _ = std::fs::remove_dir_all(dir);
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
            api: vramtrace_format::Api::from_name("cuMemAlloc_v2").unwrap(),
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
    let model = string(&mut records, "/app/model.py");
    let forward = string(&mut records, "forward");
    let mut t = 1000;
    let mut ptr = SEGMENT;
    for (i, x) in tensors.iter().enumerate() {
        // A tensor without a frame has no Python stack at all (stack 0).
        let stack = if let Some((file, line, function)) = x.frame {
            let id = i as u32 + 1;
            let frames = vec![
                PyFrame {
                    file: string(&mut records, file),
                    function: string(&mut records, function),
                    line,
                },
                PyFrame {
                    file: model,
                    function: forward,
                    line: 40,
                },
            ];
            records.push(Record::Stack {
                id,
                frames: Vec::new(),
            });
            records.push(Record::PyStack { stack: id, frames });
            id
        } else {
            0
        };
        let name = x.name.map(|n| string(&mut records, n));
        t += 10;
        records.push(Record::Tensor(TensorEvent {
            t_ns: t,
            tid: 7,
            device: 0,
            action: TensorAction::Alloc,
            ptr,
            size: x.bytes.div_ceil(512) * 512,
            requested: x.bytes,
            stack,
            ..TensorEvent::default()
        }));
        if let Some(name) = name {
            t += 1;
            records.push(Record::Annotate(Annotation {
                t_ns: t,
                tid: 7,
                ptr,
                name,
                dtype: 0,
                shape: Vec::new(),
                op: false,
            }));
        }
        ptr += x.bytes.div_ceil(512) * 512;
    }
    for r in &records {
        w.push(7, r).unwrap();
    }
    std::fs::write(dir.join("99.vtr"), w.finish()).unwrap();
    dir.to_path_buf()
}

/// `vramtrace compare DIR --model Qwen3.6-27B --tokens 4128 --json EXTRA...`.
fn compare(dir: &Path, extra: &[&str]) -> serde_json::Value {
    let o = Command::new(vramtrace())
        .arg("compare")
        .arg(dir)
        .args(["--model", QWEN_CONFIG, "--tokens", "4128", "--json"])
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", describe(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn kinds(v: &serde_json::Value) -> Vec<(String, String)> {
    v["attribution"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_string(),
                r["evidence"]["kind"].as_str().unwrap_or("-").to_string(),
            )
        })
        .collect()
}

#[test]
fn fla_frames_do_not_back_vllms_vendored_copy() {
    let dir = write_trace(&scratch("evidence-fla-frames"), &fla());
    let own = compare(&dir, &["--variant", "fla-0.6.0"]);
    assert!(
        kinds(&own).iter().all(|(_, k)| k == "frame"),
        "{:?}",
        kinds(&own)
    );
    assert_eq!(own["attribution"]["evidence"]["evidence_bytes"], FLA_BYTES);
    // The same file names, but not vLLM's module paths and lines: nothing backs vLLM's copy.
    let other = compare(&dir, &["--variant", "vllm-0.20.1"]);
    let a = &other["attribution"];
    assert!(
        kinds(&other).iter().all(|(_, k)| k != "frame"),
        "{:?}",
        kinds(&other)
    );
    assert_eq!(a["evidence"]["evidence_bytes"], 0, "{}", a["evidence"]);
    let o = a["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "o")
        .unwrap();
    assert_eq!(o["evidence"]["kind"], "contradicted", "{o}");
    assert_eq!(
        o["evidence"]["expected"],
        "vllm/model_executor/layers/fla/ops/chunk_o.py:161"
    );
}

#[test]
fn vllms_vendored_frames_do_not_back_fla() {
    let dir = write_trace(&scratch("evidence-vllm-frames"), &vllm());
    let own = compare(&dir, &["--variant", "vllm-0.20.1"]);
    for r in own["attribution"]["rows"].as_array().unwrap() {
        if r["live_at_predicted_peak"] == true {
            assert_eq!(r["evidence"]["kind"], "frame", "{r}");
        }
    }
    assert_eq!(own["attribution"]["evidence"]["evidence_bytes"], FLA_BYTES);
    let other = compare(&dir, &["--variant", "fla-0.6.0"]);
    assert!(
        kinds(&other).iter().all(|(_, k)| k != "frame"),
        "{:?}",
        kinds(&other)
    );
    assert_eq!(other["attribution"]["evidence"]["evidence_bytes"], 0);
    // Without --variant, the copy that ran is chosen.
    assert_eq!(
        compare(&dir, &["--kernel", "gdn"])["variant"],
        "vllm-0.20.1"
    );
}

#[test]
fn a_frame_at_another_line_of_the_modelled_file_does_not_back_it() {
    // fla's o allocated at chunk_o.py:570, not 565 (another version of the file).
    let mut t = fla();
    t[7].frame = Some(("/site/fla/ops/common/chunk_o.py", 570, "chunk_fwd_o"));
    let dir = write_trace(&scratch("evidence-other-line"), &t);
    let v = compare(&dir, &["--variant", "fla-0.6.0"]);
    let rows = v["attribution"]["rows"].as_array().unwrap();
    assert_eq!(rows[7]["evidence"]["kind"], "contradicted", "{}", rows[7]);
    assert_eq!(
        rows[7]["evidence"]["expected"],
        "fla/ops/common/chunk_o.py:565"
    );
    assert_eq!(
        v["attribution"]["evidence"]["evidence_bytes"],
        FLA_BYTES - BIG
    );
}

#[test]
fn the_variant_is_chosen_by_backed_bytes_not_by_size_alone() {
    // fla 0.6.0's tensors named as its code names them, after two unnamed tensors of the size
    // vLLM 0.10.2's in-kernel l2norm allocates (the caller normalised q and k itself). vLLM
    // 0.10.2 explains more bytes (its own seven names plus the two by size alone), fla 0.6.0
    // more bytes with evidence (all eight names).
    let names = [
        "g (cumsum)",
        "A",
        "w",
        "u",
        "h",
        "final_state",
        "v_new",
        "o",
    ];
    let qk = 16908288;
    let mut t = vec![
        T {
            bytes: qk,
            ..T::default()
        },
        T {
            bytes: qk,
            ..T::default()
        },
    ];
    for (x, n) in fla().into_iter().zip(names) {
        t.push(T {
            bytes: x.bytes,
            frame: None,
            name: Some(n),
        });
    }
    let dir = write_trace(&scratch("evidence-ranking"), &t);
    let v = compare(&dir, &["--kernel", "gdn"]);
    assert_eq!(
        v["variant"], "fla-0.6.0",
        "{}",
        v["attribution"]["evidence"]
    );
    assert_eq!(v["attribution"]["evidence"]["evidence_bytes"], FLA_BYTES);
    // What vLLM 0.10.2 would have claimed: more bytes, fewer of them backed.
    let other = compare(&dir, &["--variant", "vllm-0.10.2"]);
    let a = &other["attribution"];
    assert_eq!(a["attributed_bytes"], FLA_BYTES - A + 2 * qk);
    assert_eq!(a["evidence"]["evidence_bytes"], FLA_BYTES - A);
}

#[test]
fn another_implementation_is_said_for_each_tensor_it_allocated() {
    // fla ran, but o's only look-alike was allocated by the program's own GDN code.
    let mut t = fla();
    t[7].frame = Some(("/app/my_gdn.py", 88, "forward"));
    let dir = write_trace(&scratch("evidence-per-tensor"), &t);
    let v = compare(&dir, &["--variant", "fla-0.6.0"]);
    let a = &v["attribution"];
    let rows = a["rows"].as_array().unwrap();
    assert_eq!(rows[7]["evidence"]["kind"], "contradicted", "{}", rows[7]);
    assert_eq!(rows[7]["evidence"]["frame"], "my_gdn.py:88 forward");
    assert_eq!(a["evidence"]["contradicted"], 1);
    let said = a["evidence"]["other_implementation"].as_str().unwrap_or("");
    assert!(said.starts_with("1 tensor"), "{}", a["evidence"]);
    assert!(said.contains("my_gdn.py"), "{said}");
    // The text says it too, on the row and in the headline.
    let o = Command::new(vramtrace())
        .arg("compare")
        .arg(&dir)
        .args(["--model", QWEN_CONFIG, "--tokens", "4128"])
        .args(["--variant", "fla-0.6.0"])
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(
        s.contains("other code: allocated at my_gdn.py:88 forward"),
        "{s}"
    );
    assert!(s.contains(said), "{s}");
}
