//! `vramtrace model` through the built binary: JSON tensors and peak, the cliff, TP errors.

use std::process::Command;

use serde_json::Value;

const QWEN36: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/samples/models/Qwen3.6-27B/config.json"
);
const QWEN3_NEXT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/samples/models/Qwen3-Next-80B-A3B/config.json"
);

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vramtrace"))
        .arg("model")
        .args(args)
        .output()
        .expect("the vramtrace binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(args: &[&str]) -> Value {
    let (code, stdout, stderr) = run(args);
    assert_eq!(code, 0, "stderr: {stderr}");
    serde_json::from_str(&stdout).expect("--json prints one JSON object")
}

#[test]
fn json_lists_fla_0_6_0_tensors_in_allocation_order() {
    // Qwen3.6-27B has 16 key heads; fla 0.6.0's GVA keeps the 48 value heads for A, w, u, h, o.
    let v = json(&[
        QWEN36,
        "--variant",
        "fla-0.6.0",
        "--tokens",
        "4128",
        "--json",
    ]);
    let tensors = v["tensors"].as_array().unwrap();
    let got: Vec<(&str, u64)> = tensors
        .iter()
        .map(|t| (t["name"].as_str().unwrap(), t["bytes"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        got,
        [
            ("g (cumsum)", 792_576),
            ("A", 25_362_432),
            ("w", 50_724_864),
            ("u", 50_724_864),
            ("h", 102_236_160),
            ("final_state", 3_145_728),
            ("v_new", 50_724_864),
            ("o", 50_724_864),
        ]
    );
    assert_eq!(
        tensors[4]["shape"],
        serde_json::json!([1, 65, 48, 128, 128])
    );
    assert_eq!(tensors[0]["dtype"], "float32");
    assert_eq!(tensors[1]["dtype"], "bfloat16");
    assert_eq!(v["peak_bytes"], 334_436_352);
}

#[test]
fn json_for_all_kernels_and_varlen() {
    let v = json(&[QWEN36, "--seqlens", "1000,3000,128", "--json"]);
    let kernels = v["kernels"].as_array().unwrap();
    assert_eq!(kernels.len(), 3);
    let gdn = &kernels[0];
    assert_eq!(gdn["variant"], "vllm-0.20.1");
    let h = gdn["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "h")
        .unwrap();
    assert_eq!(h["shape"], serde_json::json!([1, 65, 48, 128, 128]));
    let fa = &kernels[1];
    assert_eq!(fa["tensors"][1]["name"], "softmax_lse");
    assert_eq!(fa["tensors"][1]["shape"], serde_json::json!([24, 4128]));
    let max = kernels
        .iter()
        .map(|k| k["peak_bytes"].as_u64().unwrap())
        .max();
    assert_eq!(v["peak_bytes"].as_u64(), max);
}

#[test]
fn max_seqlen_k_does_not_change_softmax_lse() {
    let a = json(&[QWEN36, "--kernel", "fa", "--tokens", "4128", "--json"]);
    let b = json(&[
        QWEN36,
        "--kernel",
        "fa",
        "--tokens",
        "4128",
        "--max-seqlen-k",
        "196608",
        "--json",
    ]);
    assert_eq!(a["tensors"], b["tensors"]);
    assert_eq!(a["tensors"][1]["bytes"], 396_288);
}

#[test]
fn cliff_is_the_first_token_count_that_does_not_fit() {
    let v = json(&[
        QWEN36,
        "--kernel",
        "gdn",
        "--capacity",
        "24GiB",
        "--resident",
        "23GiB",
        "--json",
    ]);
    let t = v["cliff_tokens"].as_u64().unwrap();
    let budget = v["budget_bytes"].as_u64().unwrap();
    assert_eq!(budget, 1 << 30);
    assert!(v["peak_bytes_at_cliff"].as_u64().unwrap() > budget);
    assert!(v["peak_bytes_below_cliff"].as_u64().unwrap() <= budget);
    // Check against the model directly at T and T - 1.
    let at = json(&[
        QWEN36,
        "--kernel",
        "gdn",
        "--tokens",
        &t.to_string(),
        "--json",
    ]);
    let below = json(&[
        QWEN36,
        "--kernel",
        "gdn",
        "--tokens",
        &(t - 1).to_string(),
        "--json",
    ]);
    assert!(at["peak_bytes"].as_u64().unwrap() > budget);
    assert!(below["peak_bytes"].as_u64().unwrap() <= budget);

    let (code, stdout, _) = run(&[
        QWEN36,
        "--kernel",
        "gdn",
        "--capacity",
        "24GiB",
        "--resident",
        "23GiB",
    ]);
    assert_eq!(code, 0);
    assert!(
        stdout.starts_with(&format!("cliff: {t} tokens.")),
        "{stdout}"
    );
}

#[test]
fn human_output_names_the_naive_sum_over_count() {
    let (code, stdout, stderr) = run(&[QWEN36, "--kernel", "gdn", "--tokens", "4128"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("peak: 334436352 B (318.94 MiB)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("over-counts the peak by 48.38 MiB: A (fp32, kkt) (48.38 MiB) is freed at step 3, before u is allocated at step 4"),
        "{stdout}"
    );
}

#[test]
fn tp_that_does_not_divide_the_heads_is_refused() {
    let (code, _, stderr) = run(&[QWEN3_NEXT, "--tp", "3"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("cannot split evenly"), "{stderr}");
    let v = json(&[
        QWEN3_NEXT, "--kernel", "gdn", "--tp", "2", "--tokens", "4128", "--json",
    ]);
    let h = v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "h")
        .cloned()
        .unwrap();
    assert_eq!(h["shape"], serde_json::json!([1, 65, 16, 128, 128]));
}

#[test]
fn sweep_prints_one_row_per_step() {
    let v = json(&[
        QWEN36,
        "--kernel",
        "gdn",
        "--sweep",
        "1024..4096",
        "--step",
        "1024",
        "--json",
    ]);
    let rows = v["sweep"].as_array().unwrap();
    let tokens: Vec<u64> = rows.iter().map(|r| r["tokens"].as_u64().unwrap()).collect();
    assert_eq!(tokens, [1024, 2048, 3072, 4096]);
}

#[test]
fn config_errors_name_the_field() {
    let dir = std::env::temp_dir().join(format!("vramtrace-model-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("config.json");
    // Without GDN fields the config is read as a dense model, which needs an MLP width.
    std::fs::write(&p, r#"{"num_hidden_layers": 4, "hidden_size": 8}"#).unwrap();
    let (code, _, stderr) = run(&[p.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(stderr.contains("has no `intermediate_size`"), "{stderr}");
    // One GDN field makes it hybrid, and the layer pattern is then required.
    std::fs::write(
        &p,
        r#"{"num_hidden_layers": 4, "hidden_size": 8, "linear_num_value_heads": 4}"#,
    )
    .unwrap();
    let (code, _, stderr) = run(&[p.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("has no `full_attention_interval`"),
        "{stderr}"
    );
}

const HYBRID12: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/samples/models/hybrid12/config.json"
);

/// The H200's total as the driver reports it (docs/validation.md, "The machine").
const H200_TOTAL: u64 = 150_109_880_320;

/// The transformers planner's frozen predictions, as committed before the H200 run that checks
/// them (docs/validation.md, "The step's tensors in the program's order": the table of
/// predictions committed before the call of 2026-12-03, 18:10): a change to the planner that
/// moves any of them must say so there, and be checked on a new run.
#[test]
fn the_transformers_planner_predicts_what_docs_validation_records() {
    let table: [(&[&str], u64, u64, u64, u64); 7] = [
        (&[], 7, 3072, 40, 125_952),
        (&[], 9, 5120, 24, 128_000),
        (&[], 11, 6144, 24, 153_600),
        (&["--expandable-segments"], 7, 2048, 76, 157_696),
        (&["--expandable-segments"], 10, 6144, 29, 184_320),
        (&["--attn-implementation", "eager"], 10, 1024, 33, 34_816),
        (&["--attn-implementation", "eager"], 7, 768, 37, 29_184),
    ];
    for (flags, cap, chunk, index, context) in table {
        let fraction = (cap << 30) as f64 / H200_TOTAL as f64;
        let (chunk_s, total_s, fraction_s) = (
            chunk.to_string(),
            H200_TOTAL.to_string(),
            fraction.to_string(),
        );
        let mut args = vec![
            HYBRID12,
            "--runtime",
            "transformers",
            "--tokens",
            &chunk_s,
            "--limit",
            &total_s,
            "--memory-fraction",
            &fraction_s,
            "--json",
        ];
        args.extend_from_slice(flags);
        let (code, stdout, stderr) = run(&args);
        // Exit 1: a chunk was refused before the prompt was held.
        assert_eq!(code, 1, "{stderr}");
        let v: Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(
            v["failure"]["index"], index,
            "{flags:?} {cap} GiB, chunk {chunk}"
        );
        assert_eq!(v["failure"]["context_tokens"], context);
        assert_eq!(v["frontier"]["failing_context"], context);
        assert_eq!(v["frontier"]["context_at_chunk"], context - chunk);
        assert_eq!(v["frontier"]["basis"], "config");
        assert_eq!(v["limit_bytes"], cap << 30);
        for p in v["failure"]["parts"].as_array().unwrap() {
            assert_eq!(p["basis"], "predicted", "{p}");
        }
    }
}

#[test]
fn the_transformers_planner_holds_a_short_prompt_and_refuses_bad_input() {
    let (code, stdout, stderr) = run(&[
        HYBRID12,
        "--tokens",
        "4096",
        "--limit",
        "24GiB",
        "--context",
        "16384",
        "--json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["fits"], true);
    assert_eq!(v["frontier"]["context_at_chunk"], 16384);
    assert_eq!(v["frontier"]["capped"], true);
    assert_eq!(v["steps_completed"], 4);
    // Past the model's own maximum, or vLLM's utilisation: refused with a sentence.
    let (code, _, stderr) = run(&[
        HYBRID12,
        "--tokens",
        "4096",
        "--limit",
        "24GiB",
        "--context",
        "300000",
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("max_position_embeddings of 262144"),
        "{stderr}"
    );
    let (code, _, stderr) = run(&[
        HYBRID12,
        "--tokens",
        "4096",
        "--limit",
        "24GiB",
        "--gpu-memory-utilization",
        "0.9",
    ]);
    assert_ne!(code, 0);
    assert!(stderr.contains("per-process fraction"), "{stderr}");
}

/// transformers' continuous-batching plan, as committed before the H200 run that checks it
/// (docs/validation.md, "transformers 5.17 continuous batching"; observed 1,662 / 5,607 / 10,104
/// blocks and 8,192 tokens).
#[test]
fn the_continuous_batching_plan_is_what_docs_validation_records() {
    let dense = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/samples/h200/hf-serve-cb/config.json"
    );
    for (percent, blocks) in [("0.15", 1662u64), ("0.5", 5619), ("0.9", 10127)] {
        let v = json(&[
            dense,
            "--limit",
            &H200_TOTAL.to_string(),
            "--cb-max-memory-percent",
            percent,
            "--json",
        ]);
        assert_eq!(v["plan"]["max_batch_tokens"], 8192, "{v}");
        assert_eq!(v["plan"]["num_blocks"], blocks, "{percent}");
        assert_eq!(v["plan"]["pages"], blocks * 256);
        // K and V of 16 layers, 4 heads × 128 × 2 B a token, two padding blocks.
        assert_eq!(
            v["plan"]["kv_pool_bytes"],
            2 * 16 * (blocks + 2) * 256 * 4 * 128 * 2
        );
        assert_eq!(v["context"]["basis"], "default");
    }
    // A GDN model is refused, as transformers refuses it.
    let (code, _, stderr) = run(&[
        HYBRID12,
        "--limit",
        "24GiB",
        "--cb-max-memory-percent",
        "0.5",
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("linear-attention"), "{stderr}");
}

/// `--calibrate TRACE`: the planner's terms fitted to the traced 4,096-token, 6 GiB run
/// (`samples/h200/hf-generate-oom`) and carried to another chunk and limit; docs/validation.md
/// sets these beside the bare runs of those settings.
#[test]
fn the_transformers_planner_calibrated_from_a_trace_of_the_same_program() {
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/samples/h200/hf-generate-oom");
    let fraction = (10u64 << 30) as f64 / H200_TOTAL as f64;
    let (code, stdout, stderr) = run(&[
        HYBRID12,
        "--runtime",
        "transformers",
        "--tokens",
        "4096",
        "--limit",
        &H200_TOTAL.to_string(),
        "--memory-fraction",
        &fraction.to_string(),
        "--calibrate",
        sample,
        "--json",
    ]);
    assert_eq!(code, 1, "{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["frontier"]["basis"], "calibrated");
    let k = &v["calibration"];
    // Forwards 1..=17 of the trace (the first has no mask, the 19th was refused).
    assert_eq!(k["forwards"], 17, "{k}");
    assert!(k["per_chunk_token"].as_f64().unwrap() >= 0.0);
    assert!(k["reserve_held_back"].as_u64().unwrap() < 1 << 30, "{k}");
    assert!(k["from"].as_str().unwrap().ends_with("hf-generate-oom"));
    assert_eq!(v["failure"]["context_tokens"], 176_128);
    for p in v["failure"]["parts"].as_array().unwrap() {
        assert_eq!(p["basis"], "calibrated", "{p}");
    }
    // A trace with no generate loop cannot calibrate it.
    let plain = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/samples/h200/hf-prefill-qwen35"
    );
    let (code, _, stderr) = run(&[
        HYBRID12,
        "--tokens",
        "4096",
        "--limit",
        "24GiB",
        "--calibrate",
        plain,
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("no prefill forward of transformers' generate"),
        "{stderr}"
    );
}

/// `--weights` reaches the whole-step model (`--context`): int4 weights of the 27B config are
/// about a third of its bf16 ones (issue 32: it was read after the step had been computed, and
/// the step printed bf16 whatever was asked).
#[test]
fn the_whole_step_model_takes_the_weight_format_asked_for() {
    let cfg = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/samples/models/Qwen3.6-27B/config.json"
    );
    let weights = |w: &str| -> u64 {
        let (code, stdout, stderr) = run(&[
            cfg,
            "--runtime",
            "vllm-0.20.1",
            "--tokens",
            "4128",
            "--context",
            "60000",
            "--weights",
            w,
            "--json",
        ]);
        assert_eq!(code, 0, "{stderr}");
        let v: Value = serde_json::from_str(&stdout).unwrap();
        v["weights"]
            .as_u64()
            .unwrap_or_else(|| panic!("no weights in {v}"))
    };
    let (bf16, int4) = (weights("bf16"), weights("int4"));
    assert!(
        int4 * 5 < bf16 * 2 && int4 * 4 > bf16,
        "bf16 {bf16}, int4 {int4}"
    );
}

/// Issue 32's command: vLLM 0.20.1's planner, every figure the issue asks for, and each lever
/// pointing the way vLLM's planner does.
#[test]
fn the_vllm_planner_prints_the_pool_the_slack_and_the_step_against_the_card() {
    let base = [
        QWEN36,
        "--runtime",
        "vllm-0.20.1",
        "--limit",
        "23.58GiB",
        "--max-num-batched-tokens",
        "4128",
        "--max-model-len",
        "65536",
        "--context",
        "60000",
        "--json",
    ];
    let at = |util: &str, extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend(["--gpu-memory-utilization", util]);
        if !extra.contains(&"--weights") {
            a.extend(["--weights", "int4"]);
        }
        a.extend(extra);
        json(&a)
    };
    let v = at("0.95", &[]);
    let w = v["weights_bytes"].as_u64().unwrap();
    assert_eq!(v["vllm"]["weights"]["bytes"], w);
    let tokens = v["vllm"]["kv_cache_tokens"].as_u64().unwrap();
    let pool = v["vllm"]["pool_bytes"].as_u64().unwrap();
    let profiled = v["vllm"]["profiled_peak_bytes"].as_u64().unwrap();
    let slack = v["vllm"]["slack_bytes"].as_i64().unwrap();
    assert!(tokens > 60_000 && pool > 0 && profiled > 0, "{v}");
    let card = v["vllm"]["card_bytes"].as_i64().unwrap();
    assert!((card - (23.58 * (1u64 << 30) as f64) as i64).abs() <= 1);
    let requested = v["vllm"]["requested_bytes"].as_i64().unwrap();
    assert_eq!(slack, card - (610 << 20) - requested);
    assert_eq!(v["step"]["fits"], true, "{v}");
    // int4 weights are a little over a quarter of bf16's linear bytes (the embedding and the
    // head stay bf16).
    let bf16 = at("0.95", &["--weights", "bf16"]);
    assert!(w * 3 < bf16["weights_bytes"].as_u64().unwrap() * 2, "{w}");
    // fp8 KV: the same bytes hold more tokens.
    let fp8 = at("0.95", &["--kv-dtype", "fp8"]);
    assert!(fp8["vllm"]["kv_cache_tokens"].as_u64().unwrap() > tokens * 3 / 2);
    // Lowering util never lowers the slack; the levers say so too.
    let mut last = i64::MIN;
    for u in ["0.97", "0.95", "0.93", "0.90"] {
        let s = at(u, &[])["vllm"]["slack_bytes"].as_i64().unwrap();
        assert!(s > last, "{u}: {s}");
        last = s;
    }
    let lever = |name: &str| {
        v["levers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["lever"] == name)
            .unwrap_or_else(|| panic!("no lever {name}: {v}"))
            .clone()
    };
    let down = lever("--gpu-memory-utilization 0.93");
    let up = lever("--gpu-memory-utilization 0.97");
    assert!(down["slack_bytes"].as_i64() > Some(slack));
    assert!(up["slack_bytes"].as_i64() < Some(slack));
    // At 0.90 the pool cannot hold one request of 65,536 tokens: vLLM's start-up error.
    let low = at("0.90", &[]);
    assert!(low["vllm"]["kv_cache_tokens"].is_null());
    let e = low["vllm"]["startup_error"].as_str().unwrap();
    assert!(e.contains("max_model_len 65536"), "{e}");
    assert_eq!(low["step"]["fits"], false);
    // The planner's own flags need it.
    let (code, _, stderr) = run(&[QWEN36, "--max-model-len", "4096"]);
    assert_ne!(code, 0);
    assert!(stderr.contains("--gpu-memory-utilization"), "{stderr}");
}

/// A checkpoint's safetensors index gives vLLM's weights as stored (over the ranks), instead of
/// counting them from the config; a file without `metadata.total_size` is refused in words.
#[test]
fn the_vllm_planner_takes_the_checkpoint_s_own_bytes() {
    let dir = std::env::temp_dir().join(format!("vramtrace-st-index-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let index = dir.join("model.safetensors.index.json");
    std::fs::write(
        &index,
        r#"{"metadata": {"total_size": 18000000000}, "weight_map": {}}"#,
    )
    .unwrap();
    let args = |tp: &'static str| {
        vec![
            QWEN36,
            "--runtime",
            "vllm-0.20.1",
            "--limit",
            "80GiB",
            "--gpu-memory-utilization",
            "0.9",
            "--max-model-len",
            "8192",
            "--tp",
            tp,
            "--json",
        ]
    };
    let mut a = args("2");
    a.extend(["--safetensors-index", index.to_str().unwrap()]);
    let v = json(&a);
    assert_eq!(v["weights_bytes"], 9_000_000_000u64);
    assert_eq!(v["vllm"]["weights"]["basis"], "given");
    std::fs::write(&index, r#"{"weight_map": {}}"#).unwrap();
    let (code, _, stderr) = run(&a);
    assert_ne!(code, 0);
    assert!(stderr.contains("no metadata.total_size"), "{stderr}");
    // A GGUF checkpoint: its tensors' bytes as the header lists them (vLLM keeps them quantized),
    // over the ranks; not beside a safetensors index.
    let gguf = format!(
        "{}/samples/h200/llama-hybrid/qwen35-h8-q4km.header.gguf",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut g = args("2");
    g.extend(["--gguf", &gguf]);
    let v = json(&g);
    assert_eq!(v["weights_bytes"], 3_593_245_952u64 / 2);
    assert_eq!(v["vllm"]["weights"]["basis"], "given");
    a.extend(["--gguf", &gguf]);
    let (code, _, stderr) = run(&a);
    assert_ne!(code, 0);
    assert!(stderr.contains("cannot be used with"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
    // Without either, the weights are counted from the config.
    assert_eq!(json(&args("2"))["vllm"]["weights"]["basis"], "code");
}
