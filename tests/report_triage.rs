//! `vramtrace report` for the person who triages the bug (issue 18, item 4): the verdict
//! class, the enforced limit and the shortfall against it, the step read from the trace, every
//! byte in a category, the whole-step model's verdict on the failing step, the levers with their
//! ceilings, PyTorch's message rebuilt verbatim, the versions block; `report --json` with the
//! keys a tool relies on. Pinned on the H200 samples and the stand-in demo.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn config() -> PathBuf {
    root().join("samples/models/Qwen3.6-27B/config.json")
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "vramtrace-test-triage-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn run(trace: &Path, extra: &[&str]) -> String {
    let o = Command::new(common::vramtrace())
        .arg("report")
        .arg(trace)
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", common::describe(&o));
    String::from_utf8(o.stdout).unwrap()
}

fn json(trace: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["--json"];
    args.extend_from_slice(extra);
    serde_json::from_str(&run(trace, &args)).expect("report --json prints one JSON object")
}

fn with_model<'a>(extra: &[&'a str], cfg: &'a str) -> Vec<&'a str> {
    let mut v = vec!["--model", cfg];
    v.extend_from_slice(extra);
    v
}

const CATEGORY_NAMES: [&str; 12] = [
    "weights",
    "kv_cache",
    "state",
    "activations",
    "engine_buffers",
    "cuda_graphs",
    "communication",
    "autotune",
    "allocator_reserve",
    "context",
    "other_process",
    "unnamed",
];

/// The report's lever whose change starts with `prefix`.
fn lever(j: &Value, prefix: &str) -> Value {
    j["levers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["change"].as_str().is_some_and(|c| c.starts_with(prefix)))
        .unwrap_or_else(|| panic!("no lever {prefix}: {}", j["levers"]))
        .clone()
}

fn categories(j: &Value) -> Vec<(String, u64)> {
    j["categories"]
        .as_array()
        .expect("categories is a list")
        .iter()
        .map(|c| {
            let name = c["category"].as_str().unwrap().to_string();
            assert!(CATEGORY_NAMES.contains(&name.as_str()), "{name}");
            assert!(
                c["evidence"].as_array().is_some_and(|e| !e.is_empty()),
                "{c}"
            );
            (name, c["bytes"].as_u64().unwrap())
        })
        .collect()
}

/// A real PyTorch OOM under `set_per_process_memory_fraction` (24 GiB): fragmentation under an
/// enforced limit, 46 MiB short of the limit (not "0 B" against the card's 116 GiB free), the
/// chunk and context read from the tensors' lines, the model's verdict that the step does not
/// fit while it would without the reserve, and `expandable_segments` as the first lever.
#[test]
fn torch_oom_is_fragmentation_under_an_enforced_limit() {
    let cfg = config();
    let cfg = cfg.to_str().unwrap();
    let sample = root().join("samples/h200/torch-oom");
    let j = json(
        &sample,
        &with_model(
            &["--layers", "16", "--runtime", "torch-prefill-script"],
            cfg,
        ),
    );
    assert_eq!(j["verdict"]["class"], "fragmentation");
    assert_eq!(j["model"]["failure_fits"], false);
    assert_eq!(j["model"]["before_fits"], true);
    assert_eq!(j["model"]["headroom"], -296_425_472);
    assert_eq!(j["model"]["runtime"], "torch_prefill_script");
    assert_eq!(j["limit"]["bytes"], 25_769_803_776u64);
    assert_eq!(j["limit"]["limit"]["kind"], "per_process_fraction");
    // reserved 24,498,929,664 + the 1,319,108,608-byte segment − the limit.
    assert_eq!(j["shortfall"], 48_234_496);
    assert_eq!(j["tipping"]["line"], "torch_prefill.py:73 prefill");
    assert_eq!(j["tipping"]["bytes"], 1_319_108_608u64);
    assert_eq!(j["step"]["chunk_index"], 25);
    assert_eq!(j["step"]["chunk_tokens"], 4128);
    assert_eq!(j["step"]["context_tokens"], 107_328);
    assert_eq!(
        categories(&j),
        [
            ("weights".to_string(), 11_168_645_120),
            ("kv_cache".to_string(), 6_919_421_952),
            ("state".to_string(), 38_862_848),
            ("activations".to_string(), 3_189_318_656),
            ("allocator_reserve".to_string(), 3_149_126_656),
            ("context".to_string(), 730_660_864),
            ("unnamed".to_string(), 33_554_432),
        ]
    );
    let levers = j["levers"].as_array().unwrap();
    assert_eq!(
        levers[0]["change"],
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    );
    assert_eq!(levers[0]["fits"], true);
    assert_eq!(
        j["pytorch_message"],
        "CUDA out of memory. Tried to allocate 1.23 GiB. GPU 0 has a total capacity of 139.80 GiB of which 116.30 GiB is free. Including non-PyTorch memory, this process has 23.50 GiB memory in use. 24.00 GiB allowed; Of the allocated memory 19.88 GiB is allocated by PyTorch, and 2.93 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
    );
    // Without a model the verdict stands on the trace alone, and `model` is absent.
    let bare = json(&sample, &[]);
    assert_eq!(bare["verdict"]["class"], "fragmentation");
    assert!(bare.get("model").is_none(), "{bare}");
    assert_eq!(bare["shortfall"], 48_234_496);
    assert_eq!(
        bare["levers"][0]["change"],
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    );
}

/// The Markdown's first screen on the same sample: the verdict and the shortfall against the
/// limit lead; the driver's 116 GiB free is not bolded; the reserve is PyTorch's 2.93 GiB (not
/// 3.00 GiB with cuBLAS's 64 MiB counted twice); no host "GPU"; the model's table once.
#[test]
fn torch_oom_first_screen_leads_with_the_cause() {
    let cfg = config();
    let md = run(
        &root().join("samples/h200/torch-oom"),
        &with_model(
            &[
                "--layers",
                "16",
                "--variant",
                "fla-0.6.0",
                "--runtime",
                "torch-prefill-script",
            ],
            cfg.to_str().unwrap(),
        ),
    );
    let lines: Vec<&str> = md.lines().collect();
    assert_eq!(
        lines[2],
        "**Verdict: fragmentation** — `python3` pid 473 (parent 471) on cuda:0 (NVIDIA H200, 139.80 GiB) ran out of memory at 54.028 s: a request of **1.23 GiB** at `torch_prefill.py:73 prefill` was refused, **short by 46.00 MiB** against PyTorch's per-process limit of 24.00 GiB (`set_per_process_memory_fraction`), read from its refusal."
    );
    let top = &md[..md.find("\n---\n").expect("the first screen ends")];
    assert!(top.lines().count() < 40, "{top}");
    assert!(!top.contains("**116.30 GiB"), "{top}");
    assert!(
        top.contains("| short by | **46.00 MiB (48,234,496 B)** |"),
        "{top}"
    );
    assert!(
        top.contains("| step | chunk 25 (counting from 0) of **4128 tokens**, **107,328 tokens** held at its end"),
        "{top}"
    );
    assert!(
        top.contains("| `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` | yes |"),
        "{top}"
    );
    assert!(top.contains("the failing step **does not fit**"), "{top}");
    // What the limit counts is PyTorch's reserved 22.82 GiB; the context is outside it.
    assert!(
        top.contains("**Where the 22.82 GiB the limit counts were** at the first failure (54.028 s): weights 10.40 GiB · KV cache 6.44 GiB · recurrent state 37.06 MiB · activations 2.97 GiB · allocator reserve 2.93 GiB · unnamed 32.00 MiB; not counted by it: context and modules 696.81 MiB."),
        "{top}"
    );
    // Nothing recommends the GDN kernel's cliff for a failure in an attention layer.
    assert!(!md.contains("the cliff: a prefill chunk"), "{md}");
    assert!(md.contains(
        "| *R* is reserved by PyTorch but unallocated | 2.93 GiB (3,149,126,656 B) = PyTorch's reserved 22.82 GiB − allocated 19.88 GiB"
    ));
    assert!(!md.contains("3,216,392,964"), "the reserve counted twice");
    assert!(!md.contains("does not exist yet"));
    assert!(
        !md.contains("cuda:-1"),
        "a pinned host allocation is not a GPU"
    );
    assert!(!md.contains("| kv_cache | 0 B"));
    assert_eq!(
        md.matches("| tensor | shape | dtype | predicted |").count(),
        1
    );
    assert!(md.contains(
        "```text\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.23 GiB."
    ));
}

/// The workload on the H200 held to 18 GiB by a ballast: the KV cache grew to the point where
/// chunk 2 no longer fits; the model agrees (the failing step does not fit, the one before
/// does, contexts fit up to 10,157 tokens at 4128), the chunk lever is infeasible under vLLM's
/// block floor, and the ballast is outside the card.
#[test]
fn prefill_18gib_is_kv_growth_and_the_failing_step_does_not_fit() {
    let cfg = config();
    let cfg = cfg.to_str().unwrap();
    let sample = root().join("samples/h200/prefill-18gib");
    let j = json(&sample, &with_model(&["--capacity", "18GiB"], cfg));
    assert_eq!(j["verdict"]["class"], "kv_growth");
    assert_eq!(j["model"]["failure_fits"], false);
    assert_eq!(j["model"]["before_fits"], true);
    assert_eq!(j["model"]["headroom"], -145_928_144);
    assert_eq!(j["model"]["runtime"], "workload");
    assert_eq!(j["model"]["known"]["context"], 257_618_896);
    assert_eq!(j["model"]["context_frontier"]["largest_context"], 10_157);
    assert_eq!(j["model"]["chunk_frontier"]["largest_chunk"], Value::Null);
    assert_eq!(j["shortfall"], 102_236_160 - 76_677_120);
    assert_eq!(j["step"]["chunk_index"], 2);
    assert_eq!(j["step"]["chunk_tokens"], 4128);
    assert_eq!(j["step"]["context_tokens"], 12_384);
    assert_eq!(j["inside_limit"]["other_process"], 0);
    assert_eq!(j["inside_limit"]["context"], 257_618_896);
    let chunk = lever(&j, "--max-num-batched-tokens");
    assert_eq!(chunk["feasible"], false);
    // Every residual is a number with a cause, none hidden.
    for p in j["model"]["residuals"]["parts"].as_array().unwrap() {
        assert!(p["residual"].is_i64(), "{p}");
        assert!(!p["likely_cause"].as_str().unwrap().is_empty(), "{p}");
    }
    // Without --capacity the ballast is memory another tenant holds on the card.
    let card = json(&sample, &[]);
    assert_eq!(card["verdict"]["class"], "other_process");
    assert_eq!(card["inside_limit"]["other_process"], 130_230_124_544u64);
    // A driver-level failure of a program that is not PyTorch: no PyTorch message.
    let md = run(&sample, &with_model(&["--capacity", "18GiB"], cfg));
    assert!(!md.contains("PyTorch says"), "{md}");
    assert!(j.get("pytorch_message").is_none());
}

/// `vramtrace demo` on the stand-in: chunk 27 of 4128 tokens fails; KV growth, and the model
/// says the failing step does not fit by 209,173,504 bytes.
#[test]
fn the_demo_is_kv_growth_and_the_failing_step_does_not_fit() {
    common::target_dir();
    let out = scratch("demo").join("trace");
    let o = Command::new(common::vramtrace())
        .args(["demo", "--simulate", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", common::describe(&o));
    let cfg = config();
    let j = json(&out, &with_model(&[], cfg.to_str().unwrap()));
    assert_eq!(j["verdict"]["class"], "kv_growth");
    assert_eq!(j["model"]["failure_fits"], false);
    assert_eq!(j["model"]["headroom"], -209_173_504);
    assert_eq!(j["step"]["chunk_index"], 27);
    assert_eq!(j["step"]["context_tokens"], 28 * 4128);
    let _ = std::fs::remove_dir_all(out.parent().unwrap());
}

/// No failure: `verdict.class` is `none`, the categories are the highest peak's, and
/// `model.failure_fits` is absent even with a model.
#[test]
fn without_a_failure_the_verdict_is_none_and_failure_fits_is_absent() {
    let cfg = config();
    let j = json(
        &root().join("samples/h200/fla-gdn-t4128"),
        &with_model(
            &["--variant", "fla-0.6.0", "--tokens", "4128"],
            cfg.to_str().unwrap(),
        ),
    );
    assert_eq!(j["verdict"]["class"], "none");
    assert!(j["model"].get("failure_fits").is_none(), "{j}");
    let c = categories(&j);
    assert!(!c.is_empty());
    assert_eq!(j["failures"], 0);
}

/// The versions `vramtrace run` gathered at start are the report's versions block.
#[test]
fn the_versions_block_comes_from_versions_json() {
    let dir = scratch("versions");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        root().join("samples/h200/torch-oom/473.vtr"),
        dir.join("473.vtr"),
    )
    .unwrap();
    std::fs::write(
        dir.join("versions.json"),
        r#"{"command": "python3 x.py", "PYTORCH_CUDA_ALLOC_CONF": "(unset)", "driver": "580.95.05", "torch": "2.11.0+cu130", "cuda": "13.0", "vllm": null}"#,
    )
    .unwrap();
    let md = run(&dir, &[]);
    assert!(
        md.contains("## Versions\n\n```text\ncommand: python3 x.py\nPYTORCH_CUDA_ALLOC_CONF: (unset)\ndriver: 580.95.05\ncuda: 13.0\ntorch: 2.11.0+cu130\nvllm: (not found)\n```"),
        "{md}"
    );
    let j = json(&dir, &[]);
    assert_eq!(j["versions"]["torch"], "2.11.0+cu130");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `vramtrace run` writes versions.json into the trace directory before the program starts:
/// the command line and `PYTORCH_CUDA_ALLOC_CONF` always, the Python packages when the program
/// is a Python program.
#[test]
fn run_writes_the_versions_at_start() {
    common::target_dir();
    let dir = scratch("run-versions");
    if !vramtrace_testkit::python3_or_skip() {
        return;
    }
    let python = "python3";
    let o = Command::new(common::vramtrace())
        .args(["run", "--simulate", "--quiet", "--out"])
        .arg(&dir)
        .env("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        .args(["--", python, "-c", "print('hi')"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", common::describe(&o));
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("versions.json")).unwrap()).unwrap();
    assert_eq!(v["command"], format!("{python} -c print('hi')"));
    assert_eq!(v["PYTORCH_CUDA_ALLOC_CONF"], "expandable_segments:True");
    assert_eq!(v["python"], python);
    for k in ["torch", "triton", "fla", "vllm", "transformers", "cuda"] {
        assert!(v.get(k).is_some(), "{k} missing in {v}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `vramtrace model --context`: the whole-step view and its frontier, as the report computes
/// them, on prefill-18gib's step (chunk 2 of 4128 at 18 GiB, the trace's 257,618,896 bytes of
/// context given).
#[test]
fn model_context_prints_the_whole_step_and_its_frontier() {
    let o = Command::new(common::vramtrace())
        .arg("model")
        .arg(config())
        .args([
            "--tokens",
            "4128",
            "--context",
            "12384",
            "--runtime",
            "workload",
            "--limit",
            "18GiB",
            "--known",
            "context=257618896",
            "--block-size",
            "4128",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", common::describe(&o));
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["total"], 19_473_280_976u64);
    assert_eq!(j["limit"]["fits"], false);
    assert_eq!(j["limit"]["headroom"], -145_928_144);
    assert_eq!(j["context_frontier"]["largest_context"], 10_157);
    assert_eq!(j["chunk_frontier"]["largest_chunk"], Value::Null);
    // A part that is not one is refused with the list.
    let o = Command::new(common::vramtrace())
        .arg("model")
        .arg(config())
        .args([
            "--tokens",
            "4128",
            "--context",
            "8256",
            "--known",
            "kv=1GiB",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("use engine_buffers, cuda_graphs"),
        "{}",
        common::describe(&o)
    );
}

/// The chunk is read from the trace, not echoed from `--tokens`: the demo with chunks of 2064
/// fails in chunk 56; the whole-step model and the kernel model (no `--tokens` given) both take
/// 2064.
#[test]
fn the_chunk_is_read_from_the_trace() {
    common::target_dir();
    let out = scratch("demo-2064").join("trace");
    let o = Command::new(common::vramtrace())
        .args(["demo", "--simulate", "--chunk", "2064", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", common::describe(&o));
    let cfg = config();
    let cfg = cfg.to_str().unwrap();
    let j = json(&out, &with_model(&[], cfg));
    assert_eq!(j["step"]["chunk_index"], 56);
    assert_eq!(j["step"]["chunk_tokens"], 2064);
    assert_eq!(j["step"]["context_tokens"], 57 * 2064);
    assert_eq!(j["model"]["shape"]["chunk_tokens"], 2064);
    assert_eq!(j["model"]["failure_fits"], false);
    assert_eq!(j["verdict"]["class"], "kv_growth");
    let md = run(&out, &with_model(&["--variant", "fla-0.6.0"], cfg));
    assert!(
        md.contains("The model at that moment: **fla-0.6.0** on Qwen3.6-27B, 2064 tokens"),
        "{md}"
    );
    assert!(!md.contains("4128"), "no chunk of 4128 anywhere: {md}");
    let _ = std::fs::remove_dir_all(out.parent().unwrap());
}

/// An unreadable trace under `--json` is still one JSON object, with the error.
#[test]
fn an_unreadable_trace_is_a_json_error() {
    let dir = scratch("empty-json");
    std::fs::create_dir_all(&dir).unwrap();
    let o = Command::new(common::vramtrace())
        .arg("report")
        .arg(&dir)
        .arg("--json")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let j: Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    assert!(
        j["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("the trace could not be read")),
        "{j}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// vLLM's `--gpu-memory-utilization` is not a limit at run time (issue 32): vLLM spends it at
/// start, sizing its pool to fill ⌈0.9 × 18 GiB⌉, and then only the card refuses. The shortfall
/// is against the card, as without the flag; the report shows vLLM's slack (card − what was
/// held outside the budget − the budget), and its utilisation lever points down, by the
/// shortfall over the card. The verdict class is the trace's own, the same as without the flag
/// or a model: a model adds lines and never flips it (issue 31).
#[test]
fn gpu_memory_utilization_is_spent_at_start_and_the_card_refuses() {
    let cfg = config();
    let j = json(
        &root().join("samples/h200/prefill-18gib"),
        &with_model(
            &["--capacity", "18GiB", "--gpu-memory-utilization", "0.9"],
            cfg.to_str().unwrap(),
        ),
    );
    assert_eq!(j["verdict"]["class"], "kv_growth");
    let bare = json(
        &root().join("samples/h200/prefill-18gib"),
        &["--capacity", "18GiB"],
    );
    assert_eq!(bare["verdict"]["class"], j["verdict"]["class"]);
    assert_eq!(j["limit"]["limit"]["kind"], "card");
    assert_eq!(j["limit"]["bytes"], 19_327_352_832u64);
    assert_eq!(j["shortfall"], bare["shortfall"]);
    let short = j["shortfall"].as_u64().unwrap();
    let v = &j["vllm"];
    assert_eq!(v["budget_bytes"], 17_394_617_549u64);
    assert_eq!(v["class"], "step_over_profiled");
    assert_eq!(
        v["slack_bytes"].as_i64().unwrap(),
        19_327_352_832 - v["outside_bytes"].as_i64().unwrap() - 17_394_617_549
    );
    // The utilisation lever: lower, by the shortfall over the card, never higher.
    let util = lever(&j, "--gpu-memory-utilization");
    let to: f64 = util["change"].as_str().unwrap()[25..30].parse().unwrap();
    assert!(to < 0.9, "{util}");
    assert!(
        (0.9 - to) * 19_327_352_832.0 >= short as f64,
        "{to}: the pool must shrink by the {short} B short"
    );
    // Without a model, the same lever from the trace alone.
    let j = json(
        &root().join("samples/h200/prefill-18gib"),
        &["--capacity", "18GiB", "--gpu-memory-utilization", "0.9"],
    );
    assert!(
        j["levers"][0]["change"]
            .as_str()
            .unwrap()
            .starts_with("--gpu-memory-utilization 0.898")
    );
}
