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
            "18GiB",
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
    // The first screen: the verdict, the shortfall against the card the sample was held to,
    // the step read from the trace, the model's verdict, the levers with their ceilings.
    assert_eq!(
        lines[2],
        "**Verdict: KV-cache growth** — `vramtrace-workload` pid 449 (parent 447) on cuda:0 (NVIDIA H200, 139.80 GiB) ran out of memory at 7.902 s: a request of **97.50 MiB** at `prefill/chunk.2/layer.0/gdn/chunk_gated_delta_rule/chunk_gated_delta_rule_fwd_h` was refused, **short by 24.38 MiB** against a card of 18.00 GiB (given with --capacity)."
    );
    has("- the KV cache held 774.00 MiB at chunk 2, about 258.00 MiB per chunk since the first");
    has(
        "- the model fits a chunk of 4128 tokens up to a context of 10157 tokens; this step held 12384",
    );
    has(
        "- the refused tensor, by the kernel model: `h` bfloat16 [1, 65, 48, 128, 128] of fla-0.6.0 (97.50 MiB predicted)",
    );
    has(
        "| step | chunk 2 (counting from 0) of **4128 tokens**, **12,384 tokens** held at its end — the failure's label",
    );
    has(
        "| whole-step model | the failing step **does not fit**: 18.14 GiB counted against 18.00 GiB (short by 139.17 MiB); the step before it fits |",
    );
    has(
        "context and modules 245.68 MiB; not counted by it: the device's 121.80 GiB past the limit",
    );
    has("| `--max-model-len 10157` | — | contexts up to 10157 tokens at a chunk of 4128 |");
    has(
        "| `--max-num-batched-tokens (smaller chunk)` (infeasible) | no | no chunk fits at this context (12384 tokens): even the floor of 4128 tokens counts 18.14 GiB against 18.00 GiB |",
    );
    let top_end = lines.iter().position(|l| *l == "---").unwrap();
    assert!(top_end < 40, "the first screen is {top_end} lines");
    // Below: every category with its evidence, the model's residuals, exact bytes.
    has(
        "| kv_cache | 774.00 MiB (811,597,824 B) | label \"prefill/kv_cache\" (\"kv\") (811597824 B, 48 allocations) |",
    );
    has("| context | 245.68 MiB (257,618,896 B) | 245.68 MiB (257,618,896 B) | 0 B | agrees |");
    has(
        "The frontier (the largest context, or chunk, whose step still fits) against 18.00 GiB: at a chunk of 4128 tokens, contexts up to **10,157** fit; at the failing context of 12,384 tokens, no chunk fits",
    );
    has("| untraced (total − free − traced live) | 772.50 MiB (810,021,840 B) |");
    // The kernel model beside the failure: what each match rests on and where it was made.
    has(
        "| tensor | shape | dtype | predicted | observed | difference | matched by | evidence | allocation |",
    );
    has(
        "| `h` | [1, 65, 48, 128, 128] | bfloat16 | 102,236,160 | **the failed request** | — | order and size | size and order only (1 alike) | the request, no Python frame recorded |",
    );
    has(
        "| `A` | [1, 4128, 48, 64] | bfloat16 | 25,362,432 | 25,362,432 | 0 | name | named as the tensor | `A bf16[1, 4128, 48, 64]`, no Python frame recorded |",
    );
    has("| `o` | [1, 4128, 48, 128] | bfloat16 | 50,724,864 | not live | — |  |  |  |");
    has(
        "Of the matched: backed by a name or a frame in the modelled file 121.69 MiB (127,604,736 B), by size and order alone 0 B; 0 tensor(s) ambiguous among look-alikes, 0 contradicted by their frames.",
    );
    // The table is not repeated at the peak.
    assert_eq!(
        md.matches("| tensor | shape | dtype | predicted |").count(),
        1
    );
    has("(the model is set beside the first failure above, not repeated here)");
    has("| `layer.#.kv.chunk.# [prefill/kv_cache]` | KV cache | 48 | 774.00 MiB (811,597,824 B) |");
    has(
        "Headroom at the failure (7.902 s): total 139.80 GiB − traced live 138.97 GiB − untraced 772.50 MiB = 73.12 MiB free, against a request of 97.50 MiB.",
    );
    has("<details><summary>stack of the failed request</summary>");
    // Not PyTorch: no PyTorch message.
    assert!(!md.contains("PyTorch says"), "{md}");
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
    assert!(html.contains("<strong>Verdict: KV-cache growth</strong>"));
    assert!(
        html.contains("<th>evidence</th><th>allocation</th>"),
        "the model table has the evidence column"
    );
    assert!(html.contains(
        "<td>named as the tensor</td><td><code>A bf16[1, 4128, 48, 64]</code>, no Python frame recorded</td>"
    ));
    let _ = std::fs::remove_dir_all(&out);
}

fn model_report(sample: &str, extra: &[&str]) -> String {
    let r = root();
    let o = Command::new(common::vramtrace())
        .arg("report")
        .arg(r.join(sample))
        .arg("--model")
        .arg(r.join("samples/models/Qwen3.6-27B/config.json"))
        .args(["--variant", "fla-0.6.0", "--tokens", "4128"])
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", common::describe(&o));
    String::from_utf8(o.stdout).unwrap()
}

/// No allocation failed: the highest peak's section sets the model beside the peak, each tensor
/// with what its match rests on. fla with caching off and no Python frames: size and order only.
#[test]
fn a_peak_without_failure_shows_the_model_table_with_its_evidence() {
    let md = model_report("samples/h200/fla-gdn-t4128", &[]);
    assert!(md.contains("**No allocation failed.**"), "{md}");
    let peak = &md[md.find("## Peaks per process and device").expect("peaks")..];
    let has = |s: &str| assert!(peak.contains(s), "missing {s:?} in\n{peak}");
    has(
        "The model at the peak: **fla-0.6.0** on Qwen3.6-27B, 4128 tokens (chosen with --variant); fla-core 0.6.0 wheel:",
    );
    has(
        "| tensor | shape | dtype | predicted | observed | difference | matched by | evidence | allocation |",
    );
    for row in [
        "| `h` | [1, 65, 48, 128, 128] | bfloat16 | 102,236,160 | 102,236,160 | 0 | order and size | size and order only (1 alike) | `cuMemAlloc_v2`, no Python frame recorded |",
        "| `v_new` | [1, 4128, 48, 128] | bfloat16 | 50,724,864 | 50,724,864 | 0 | order and size | size and order only (4 alike) | `cuMemAlloc_v2`, no Python frame recorded |",
        "| `o` | [1, 4128, 48, 128] | bfloat16 | 50,724,864 | 50,724,864 | 0 | order and size | size and order only (4 alike) | `cuMemAlloc_v2`, no Python frame recorded |",
    ] {
        has(row);
    }
    has(
        "Of 403.70 MiB (423,312,384 B) live: matched to the model 318.94 MiB (334,436,352 B), named but not in the model 84.76 MiB (88,876,032 B), neither 0 B.",
    );
    has(
        "Of the matched: backed by a name or a frame in the modelled file 0 B, by size and order alone 318.94 MiB (334,436,352 B); 0 tensor(s) ambiguous among look-alikes, 0 contradicted by their frames.",
    );
    has("Size and order alone do not show that these allocations are the model's tensors");
    assert!(!peak.contains("failed request"), "{peak}");
    // The table comes once; the first screen leads with the peak by category, not with one
    // kernel's cliff.
    assert_eq!(md.matches("The model at").count(), 1);
    let top = &md[..md.find("\n---\n").expect("the first screen ends")];
    assert!(
        top.contains("**403.70 MiB (423,312,384 B)** at 564.5 ms; **21.00%** of it is in a named category, 318.94 MiB unnamed."),
        "{top}"
    );
    assert!(
        top.contains("| unnamed | 318.94 MiB (334,436,352 B) | 79.00% |"),
        "{top}"
    );
    assert!(!md.contains("the cliff"), "{md}");
}

/// A real PyTorch OOM with the probe's Python frames: matches backed by a frame in the modelled
/// file say so and name the line that allocated; same-size allocations made by other code are
/// not matched, say where they were made, and the first screen says another implementation ran.
#[test]
fn a_failure_with_python_frames_shows_the_evidence_and_the_allocating_line() {
    let md = model_report(
        "samples/h200/torch-oom",
        &["--layers", "16", "--runtime", "torch-prefill-script"],
    );
    // fla ran (o and final_state were allocated at its lines): the look-alike of g made by
    // the program itself is not matched, and the first screen says so for that one tensor
    // without claiming that the whole program ran another implementation.
    assert!(
        !md.contains("the program ran another implementation"),
        "{md}"
    );
    assert!(
        md.contains(
            "- **Model**: 1 tensor(s) of the model have same-size allocations made by other code (torch_prefill.py), not where the model cites: another implementation allocated them, although 2 other tensor(s) were allocated where the model's variant allocates them"
        ),
        "{md}"
    );
    let fail = &md[md.find("## Failed allocations").unwrap()..md.find("## Peaks per").unwrap()];
    let has = |s: &str| assert!(fail.contains(s), "missing {s:?} in\n{fail}");
    has(
        "| tensor | shape | dtype | predicted | observed | difference | matched by | evidence | allocation |",
    );
    has(
        "| `final_state` | [1, 48, 128, 128] | float32 | 3,145,728 | 3,145,728 | 0 | frame and size | frame `chunk_delta_h.py:723 chunk_gated_delta_rule_fwd_h` in the modelled file | a PyTorch tensor at `chunk_delta_h.py:723 chunk_gated_delta_rule_fwd_h` |",
    );
    // o and w have one size; o is matched to the allocation made in chunk_o.py, not taken for w.
    has(
        "| `o` | [1, 4128, 48, 128] | bfloat16 | 50,724,864 | 50,724,864 | 0 | frame and size | frame `chunk_o.py:565 chunk_fwd_o` in the modelled file | a PyTorch tensor at `chunk_o.py:565 chunk_fwd_o` |",
    );
    has(
        "| `g (cumsum)` | [1, 4128, 48] | float32 | 792,576 | not matched | — |  | **other code**: allocated at `torch_prefill.py:62 prefill`, not in `fla/ops/utils/cumsum.py:278` |  |",
    );
    has(
        "Of the matched: backed by a name or a frame in the modelled file 51.38 MiB (53,870,592 B)",
    );
    // The peak does not repeat the table.
    let peak = &md[md.find("## Peaks per").unwrap()..];
    assert!(
        peak.contains("(the model is set beside the first failure above, not repeated here)"),
        "{peak}"
    );
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
    if vramtrace_testkit::bless("UPDATE_SNAPSHOTS") {
        std::fs::write(&path, &md).unwrap();
    }
    let want = std::fs::read_to_string(&path).expect("run with UPDATE_SNAPSHOTS=1 to create it");
    assert_eq!(
        md, want,
        "the Markdown changed; look at it, then UPDATE_SNAPSHOTS=1"
    );
}

/// A card most of which the context, modules and libraries hold (the trace sees 100 MiB of
/// weights, the driver says 10 MiB free of 1 GiB): the verdict is the context, with its bytes.
#[test]
fn an_untraced_context_that_fills_the_card_is_the_context_verdict() {
    const MIB: u64 = 1 << 20;
    let s = |id, text: &str| Record::String {
        id,
        text: text.into(),
    };
    let mut oom = ev(900, EventKind::AllocFailed, "cuMemAlloc_v2", 0, 96 * MIB, 2);
    oom.result = 2;
    oom.free_bytes = 10 * MIB;
    oom.total_bytes = 1 << 30;
    let trace = Trace::from_files(vec![TraceFile {
        path: "7.vtr".into(),
        header: Header {
            pid: 7,
            ppid: 1,
            cmdline: vec!["server".into()],
            ..Header::default()
        },
        driver_version: Some(12040),
        devices: vec![DeviceInfo {
            ordinal: 0,
            total_bytes: 1 << 30,
            name: "card".into(),
        }],
        records: vec![
            s(1, "model/layers.0.weight"),
            s(2, "forward/layer.0/mlp"),
            Record::Event(ev(
                100,
                EventKind::Alloc,
                "cuMemAlloc_v2",
                0x1000,
                100 * MIB,
                1,
            )),
            Record::Event(oom),
        ],
        problems: vec![],
    }]);
    let r = build(
        &trace,
        &ReportOptions {
            title: "context".into(),
            ..ReportOptions::default()
        },
    )
    .unwrap();
    let t = r.triage.as_ref().unwrap();
    assert_eq!(t.verdict.class.key(), "context");
    assert_eq!(t.shortfall, Some(86 * MIB));
    assert_eq!(
        t.verdict.evidence[0],
        "the context, modules and libraries' workspaces took 914.00 MiB of the 1.00 GiB limit"
    );
    let j = vramtrace::report::json::render(&r);
    assert_eq!(j["verdict"]["class"], "context");
    assert!(j.get("model").is_none());
}
