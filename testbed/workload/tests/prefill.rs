//! `vramtrace-workload prefill --simulate` end to end on the stand-in driver
//! (testbed/fakecuda), and under the preload for the labels it records: the
//! persistent stand-ins' sizes, one chunk's allocations and labels layer by
//! layer, the KV cache's growth, and the out-of-memory report.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::Output;

use common::{TINY_CONFIG, command, describe, libs, preload, run};
use serde_json::{Value, json};
use vramtrace_format::{EventKind, Record, TraceFile};
use vramtrace_models::{self as model, ModelConfig, WeightFormat};

const QWEN36: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../samples/models/Qwen3.6-27B/config.json"
);

fn json_of(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(o)))
}

/// The tiny model prefilled with `extra` options; `--json --ledger`, bf16
/// weights unless `extra` says otherwise.
fn tiny(libs: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["prefill", "--config", TINY_CONFIG];
    if !extra.contains(&"--weights") {
        args.extend(["--weights", "bf16"]);
    }
    args.extend(["--simulate", "--json", "--ledger", "--quiet"]);
    args.extend_from_slice(extra);
    let o = run(libs, None, &args);
    assert!(o.status.success(), "{}", describe(&o));
    json_of(&o)
}

/// (event, name, bytes, label) of every ledger event.
fn events(j: &Value) -> Vec<(String, String, u64, String)> {
    j["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap().to_string(),
                e["name"].as_str().unwrap().to_string(),
                e["bytes"].as_u64().unwrap(),
                e["label"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn persistent_tensors_have_the_models_sizes() {
    let libs = libs();
    let j = tiny(libs, &["--prompt-tokens", "40", "--chunk", "32"]);
    let allocs: Vec<(String, u64, String)> = events(&j)
        .into_iter()
        .filter(|e| e.0 == "alloc" && !e.3.starts_with("prefill/chunk."))
        .map(|e| (e.1, e.2, e.3))
        .collect();
    let w = |n: &str, b: u64| (n.to_string(), b, "prefill/weights".to_string());
    let st = |n: &str, b: u64| (n.to_string(), b, "prefill/gdn_state".to_string());
    let kv = |n: &str, b: u64| (n.to_string(), b, "prefill/kv_cache".to_string());
    // bf16 parameters, by hand (h 64, key_dim 2x16, value_dim 4x8, HV 4, I 96):
    // GDN layer: in_proj 64x128 + out_proj 32x64 + b,a 64x8 + conv 96x4 + A_log,
    //   dt_bias 8 + gated norm 8 + MLP 3x64x96 + two norms 128 = 29712 params;
    // attention layer: q (gated) 64x256 + k,v 2x64x64 + o 128x64 + q/k norms 64 +
    //   MLP 18432 + two norms 128 = 51392 params.
    let expected = vec![
        w("embed_tokens", 100 * 64 * 2),
        w("layer.0.weights", 29_712 * 2),
        w("layer.1.weights", 51_392 * 2),
        w("layer.2.weights", 29_712 * 2),
        w("layer.3.weights", 51_392 * 2),
        w("norm", 64 * 2),
        w("lm_head", 100 * 64 * 2),
        // conv state [1, 3, 2x2x16 + 4x8] bf16, recurrent state [1, 4, 16, 8] f32.
        st("layer.0.conv_state", 3 * 96 * 2),
        st("layer.0.ssm_state", 4 * 16 * 8 * 4),
        st("layer.2.conv_state", 3 * 96 * 2),
        st("layer.2.ssm_state", 4 * 16 * 8 * 4),
        // KV [2, T, 2, 32] bf16 for chunk 0 (32 tokens) and chunk 1 (8 tokens).
        kv("layer.1.kv.chunk.0", 2 * 32 * 2 * 32 * 2),
        kv("layer.3.kv.chunk.0", 2 * 32 * 2 * 32 * 2),
        kv("layer.1.kv.chunk.1", 2 * 8 * 2 * 32 * 2),
        kv("layer.3.kv.chunk.1", 2 * 8 * 2 * 32 * 2),
    ];
    assert_eq!(allocs, expected);

    // The same numbers as the models the attribution uses.
    let cfg = ModelConfig::from_path(TINY_CONFIG).unwrap();
    let weights = model::weight_bytes(&cfg, WeightFormat::Bf16, 1)
        .unwrap()
        .bytes;
    assert_eq!(j["persistent"]["weights_bytes"], weights);
    assert_eq!(allocs[..7].iter().map(|a| a.1).sum::<u64>(), weights);
    let state = model::gdn_state_per_seq(&cfg, 1, model::DType::BF16, model::DType::F32, 0)
        .unwrap()
        .bytes_per_seq;
    assert_eq!(j["persistent"]["gdn_state_bytes"], state);
    assert_eq!(j["outcome"], "completed");
    assert_eq!(j["tokens_prefilled"], 40);
    assert_eq!(j["held_at_end"]["activations"], 0);

    // int4:128 packs each linear layer's weights into 4 bits plus group scales and zeros.
    let j = tiny(
        libs,
        &[
            "--prompt-tokens",
            "40",
            "--chunk",
            "32",
            "--weights",
            "int4",
        ],
    );
    let int4 = model::weight_bytes(&cfg, WeightFormat::Int4 { group: 128 }, 1)
        .unwrap()
        .bytes;
    assert_eq!(j["persistent"]["weights_bytes"], int4);
    assert!(int4 < weights);
}

#[test]
fn one_chunk_layer_by_layer_in_order_with_labels() {
    let libs = libs();
    let j = tiny(libs, &["--prompt-tokens", "40", "--chunk", "32"]);
    let ev = events(&j);
    // Chunk 1 (tokens 32..40), layers 0 (GDN) and 1 (attention).
    let chunk: Vec<&(String, String, u64, String)> = ev
        .iter()
        .filter(|e| {
            e.3.starts_with("prefill/chunk.1/layer.0/")
                || e.3.starts_with("prefill/chunk.1/layer.1/")
        })
        .collect();
    let allocs: Vec<(String, u64, String)> = chunk
        .iter()
        .filter(|e| e.0 == "alloc")
        .map(|e| (e.1.clone(), e.2, e.3.clone()))
        .collect();
    let gdn = |n: &str, b: u64, stage: &str| {
        (
            n.to_string(),
            b,
            format!("prefill/chunk.1/layer.0/gdn/{stage}"),
        )
    };
    let fa = |n: &str, b: u64, stage: &str| {
        (
            n.to_string(),
            b,
            format!("prefill/chunk.1/layer.1/attention/{stage}"),
        )
    };
    let mlp = |l: usize| {
        let label = format!("prefill/chunk.1/layer.{l}/mlp");
        vec![
            ("gate_up".to_string(), 8 * 192 * 2, label.clone()),
            ("act (silu_and_mul)".to_string(), 8 * 96 * 2, label.clone()),
            ("down".to_string(), 8 * 64 * 2, label),
        ]
    };
    let cgdr = "chunk_gated_delta_rule";
    let mut expected = vec![
        // T = 8, HV 4, Hk 2, K 16, V 8, bf16; fp32 g, state and cumsum.
        gdn("q", 8 * 2 * 16 * 2, "inputs"),
        gdn("k", 8 * 2 * 16 * 2, "inputs"),
        gdn("v", 8 * 4 * 8 * 2, "inputs"),
        gdn("g", 8 * 4 * 4, "inputs"),
        gdn("beta", 8 * 4 * 2, "inputs"),
        gdn("initial_state", 4 * 16 * 8 * 4, "inputs"),
        gdn("cu_seqlens", 16, "inputs"),
        gdn("q_l2norm", 8 * 2 * 16 * 2, &format!("{cgdr}/l2norm_fwd")),
        gdn("q_rstd", 8 * 2 * 4, &format!("{cgdr}/l2norm_fwd")),
        gdn("k_l2norm", 8 * 2 * 16 * 2, &format!("{cgdr}/l2norm_fwd")),
        gdn("k_rstd", 8 * 2 * 4, &format!("{cgdr}/l2norm_fwd")),
        gdn(
            "chunk_indices",
            16,
            &format!("{cgdr}/prepare_chunk_indices"),
        ),
        gdn("g_cumsum", 8 * 4 * 4, &format!("{cgdr}/chunk_local_cumsum")),
        gdn(
            "A",
            8 * 4 * 64 * 2,
            &format!("{cgdr}/chunk_gated_delta_rule_fwd_intra/kkt_solve"),
        ),
        gdn(
            "w",
            8 * 4 * 16 * 2,
            &format!("{cgdr}/chunk_gated_delta_rule_fwd_intra/recompute_w_u_fwd"),
        ),
        gdn(
            "u",
            8 * 4 * 8 * 2,
            &format!("{cgdr}/chunk_gated_delta_rule_fwd_intra/recompute_w_u_fwd"),
        ),
        gdn(
            "chunk_offsets",
            16,
            &format!("{cgdr}/chunk_gated_delta_rule_fwd_h"),
        ),
        gdn(
            "h",
            4 * 16 * 8 * 2,
            &format!("{cgdr}/chunk_gated_delta_rule_fwd_h"),
        ),
        gdn(
            "final_state",
            4 * 16 * 8 * 4,
            &format!("{cgdr}/chunk_gated_delta_rule_fwd_h"),
        ),
        gdn(
            "v_new",
            8 * 4 * 8 * 2,
            &format!("{cgdr}/chunk_gated_delta_rule_fwd_h"),
        ),
        gdn("o", 8 * 4 * 8 * 2, &format!("{cgdr}/chunk_fwd_o")),
    ];
    expected.extend(mlp(0));
    expected.extend([
        // T = 8, 4 query heads, 2 KV heads, head_dim 32, over the chunk's own keys.
        fa("q", 8 * 4 * 32 * 2, "inputs"),
        fa("k", 8 * 2 * 32 * 2, "inputs"),
        fa("v", 8 * 2 * 32 * 2, "inputs"),
        fa("cu_seqlens_q", 8, "inputs"),
        fa("cu_seqlens_k", 8, "inputs"),
        fa("out", 8 * 4 * 32 * 2, "_flash_attention_forward"),
        fa("softmax_lse", 4 * 8 * 4, "_flash_attention_forward"),
        fa("rng_state", 16, "_flash_attention_forward"),
        fa("_unused_philox_offset", 8, "_flash_attention_forward"),
    ]);
    expected.extend(mlp(1));
    assert_eq!(allocs, expected);

    // Each layer frees everything it allocated before the next layer begins,
    // the GDN layer's returned final_state first (after its copy into the state).
    for l in 0..4 {
        let prefix = format!("prefill/chunk.1/layer.{l}/");
        let first = ev.iter().position(|e| e.3.starts_with(&prefix)).unwrap();
        let last = ev.iter().rposition(|e| e.3.starts_with(&prefix)).unwrap();
        let span = &ev[first..=last];
        let allocated = span.iter().filter(|e| e.0 == "alloc").count();
        let freed = span.iter().filter(|e| e.0 == "free").count();
        assert_eq!(allocated, freed, "layer {l}");
        assert!(span.iter().all(|e| e.3.starts_with(&prefix)), "layer {l}");
    }
    let gdn_frees: Vec<&str> = chunk
        .iter()
        .filter(|e| e.0 == "free" && e.3.starts_with("prefill/chunk.1/layer.0/gdn"))
        .map(|e| e.1.as_str())
        .collect();
    assert_eq!(
        &gdn_frees[..6],
        ["w", "u", "h", "v_new", "A", "g_cumsum"],
        "fla's own order inside the call"
    );
    assert_eq!(
        &gdn_frees[10..14],
        ["final_state", "o", "chunk_offsets", "chunk_indices"]
    );
}

#[test]
fn the_kv_cache_grows_by_a_chunk_of_tokens_per_attention_layer() {
    let libs = libs();
    let j = tiny(libs, &["--prompt-tokens", "100", "--chunk", "32"]);
    let cfg = ModelConfig::from_path(TINY_CONFIG).unwrap();
    let per_token = model::kv_cache_per_token(&cfg, 1, model::DType::BF16)
        .unwrap()
        .bytes_per_layer;
    assert_eq!(per_token, 256);
    assert_eq!(j["persistent"]["kv_bytes_per_token_per_layer"], per_token);
    let chunks = j["chunks"].as_array().unwrap();
    let tokens: Vec<u64> = chunks
        .iter()
        .map(|c| c["tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(tokens, [32, 32, 32, 4]);
    let mut before = 0;
    for c in chunks {
        let kv = c["kv_cache_bytes"].as_u64().unwrap();
        assert_eq!(
            kv - before,
            2 * per_token * c["tokens"].as_u64().unwrap(),
            "{c}"
        );
        before = kv;
    }
    let blocks: Vec<(String, u64)> = events(&j)
        .into_iter()
        .filter(|e| e.0 == "alloc" && e.3 == "prefill/kv_cache")
        .map(|e| (e.1, e.2))
        .collect();
    assert_eq!(blocks.len(), 2 * 4);
    for (i, &t) in tokens.iter().enumerate() {
        for l in [1, 3] {
            assert!(
                blocks.contains(&(format!("layer.{l}.kv.chunk.{i}"), per_token * t)),
                "{blocks:?}"
            );
        }
    }
    assert_eq!(j["held_at_end"]["kv_cache"], 2 * per_token * 100);

    // Preallocated, the cache is all there before the first chunk and stays put.
    let j = tiny(
        libs,
        &[
            "--prompt-tokens",
            "100",
            "--chunk",
            "32",
            "--kv-cache",
            "preallocate",
            "--kv-tokens",
            "128",
        ],
    );
    let kv: Vec<u64> = j["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["kv_cache_bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(kv, [2 * per_token * 128; 4]);
    // fp8 halves it.
    let j = tiny(
        libs,
        &[
            "--prompt-tokens",
            "100",
            "--chunk",
            "32",
            "--kv-dtype",
            "fp8",
        ],
    );
    assert_eq!(j["held_at_end"]["kv_cache"], per_token * 100);
}

/// The default demo run: Qwen3.6-27B in int4 on a 24 GiB stand-in, a 262144-token
/// prompt in chunks of 4128. The KV cache fills until fla's `h` of layer 0 in
/// chunk 27 no longer fits.
#[test]
fn a_24gib_card_runs_out_in_chunk_27_on_h() {
    let libs = libs();
    let args = [
        "prefill",
        "--config",
        QWEN36,
        "--prompt-tokens",
        "262144",
        "--capacity",
        "24GiB",
        "--simulate",
        "--quiet",
    ];
    let o = run(libs, Some("24GiB"), &args);
    assert_eq!(o.status.code(), Some(3), "{}", describe(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("out of memory allocating h (bf16 [1, 65, 48, 128, 128], 102236160 bytes)"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("OUT OF MEMORY in chunk 27 (tokens 111456..115584), layer 0 (gdn)"),
        "{stdout}"
    );

    let mut json_args = args.to_vec();
    json_args.push("--json");
    let o = run(libs, Some("24GiB"), &json_args);
    assert_eq!(o.status.code(), Some(3), "{}", describe(&o));
    let j = json_of(&o);
    assert_eq!(j["outcome"], "out_of_memory");
    let f = &j["failure"];
    assert_eq!(f["tensor"], "h");
    assert_eq!(f["shape"], json!([1, 65, 48, 128, 128]));
    assert_eq!(f["bytes"], 102_236_160);
    assert_eq!(f["chunk"], 27);
    assert_eq!(f["layer"], 0);
    assert_eq!(f["layer_kind"], "gdn");
    assert_eq!(
        f["label"],
        "prefill/chunk.27/layer.0/gdn/chunk_gated_delta_rule/chunk_gated_delta_rule_fwd_h"
    );
    assert_eq!(
        f["stage"],
        "gdn/chunk_gated_delta_rule/chunk_gated_delta_rule_fwd_h"
    );
    assert_eq!(f["tokens_prefilled"], 27 * 4128);
    let held = &f["held"];
    assert_eq!(
        held["kv_cache"],
        28u64 * 4128 * 64 * 1024,
        "chunk 27's blocks too"
    );
    assert_eq!(held["weights"], j["persistent"]["weights_bytes"]);
    assert_eq!(held["gdn_state"], j["persistent"]["gdn_state_bytes"]);
    let total = held["total"].as_u64().unwrap();
    assert_eq!(
        total + f["device_free"].as_u64().unwrap(),
        24u64 << 30,
        "the stand-in's free memory is what the run does not hold"
    );
    assert!(f["device_free"].as_u64().unwrap() < 102_236_160);
    assert_eq!(j["chunks"].as_array().unwrap().len(), 27);
}

/// (size, label, free bytes) of every request the driver refused.
type FailedRequest = (u64, Option<String>, Option<u64>);

/// `args` under the preload on a stand-in of `capacity` bytes, recording into
/// a fresh `vt-prefill-{name}-{pid}`: the output, and the failed requests the
/// trace holds.
fn traced(libs: &Path, name: &str, capacity: &str, args: &[&str]) -> (Output, Vec<FailedRequest>) {
    let trace = std::env::temp_dir().join(format!("vt-prefill-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&trace);
    std::fs::create_dir_all(&trace).unwrap();
    let o = command(libs, Some(capacity))
        .args(args)
        .env("LD_PRELOAD", preload())
        .env("VRAMTRACE_DIR", &trace)
        .output()
        .unwrap();
    let mut failed = Vec::new();
    for entry in std::fs::read_dir(&trace).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "vtr") {
            continue;
        }
        let file = TraceFile::read(&path).unwrap_or_else(|e| panic!("{e}: {}", describe(&o)));
        let strings: HashMap<u32, &str> = file
            .records
            .iter()
            .filter_map(|r| match r {
                Record::String { id, text } => Some((*id, text.as_str())),
                _ => None,
            })
            .collect();
        for r in &file.records {
            if let Record::Event(e) = r
                && e.kind == EventKind::AllocFailed
            {
                let label = strings.get(&e.label).map(|s| s.to_string());
                failed.push((e.size, label, Some(e.free_bytes)));
            }
        }
    }
    (o, failed)
}

/// A small card fails on a named tensor with status 3, and the preload records
/// the failed request under the label `prefill/chunk.{i}/layer.{l}/...`.
#[test]
fn a_small_card_fails_with_status_3_and_a_labelled_request() {
    let libs = libs();
    // Room for the persistent tensors (350144 + 5248 bytes) and two chunks.
    let (o, failed) = traced(
        libs,
        "trace",
        "1000000",
        &[
            "prefill",
            "--config",
            TINY_CONFIG,
            "--prompt-tokens",
            "4000",
            "--chunk",
            "256",
            "--weights",
            "bf16",
            "--simulate",
            "--json",
            "--quiet",
        ],
    );
    assert_eq!(o.status.code(), Some(3), "{}", describe(&o));
    let j = json_of(&o);
    let f = &j["failure"];
    let (i, l) = (f["chunk"].as_u64().unwrap(), f["layer"].as_u64().unwrap());
    let name = f["tensor"].as_str().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains(&format!("out of memory allocating {name} (")),
        "{stderr}"
    );
    let prefix = format!("prefill/chunk.{i}/layer.{l}/");
    assert!(f["label"].as_str().unwrap().starts_with(&prefix), "{f}");
    // Two chunks' KV blocks (2 x 2 x 256 x 256 bytes) leave chunk 2's first GDN
    // layer short of room for w.
    assert_eq!((i, l, name), (2, 0, "w"));
    assert_eq!(f["shape"], json!([1, 256, 4, 16]));
    assert_eq!(
        f["stage"],
        "gdn/chunk_gated_delta_rule/chunk_gated_delta_rule_fwd_intra/recompute_w_u_fwd"
    );
    assert_eq!(f["tokens_prefilled"], 512);
    assert_eq!(f["held"]["kv_cache"], 3 * 2 * 256 * 256);

    assert_eq!(failed.len(), 1, "{failed:?}");
    let (size, label, free) = &failed[0];
    assert_eq!(*size, f["bytes"].as_u64().unwrap());
    assert_eq!(label.as_deref(), f["label"].as_str(), "the preload's label");
    assert!(label.as_deref().unwrap().starts_with(&prefix));
    assert_eq!(*free, f["device_free"].as_u64());
}

/// The demo's run under the preload: the failed request must carry its label.
/// With 64 layers, every chunk interns ~700 new range paths: more than the
/// preload's string table deduplicates, so this also checks that a full table
/// writes a label again rather than dropping it.
#[test]
fn the_demo_run_labels_its_failed_request() {
    let libs = libs();
    let (o, failed) = traced(
        libs,
        "demo",
        "24GiB",
        &[
            "prefill",
            "--config",
            QWEN36,
            "--prompt-tokens",
            "262144",
            "--capacity",
            "24GiB",
            "--simulate",
            "--quiet",
        ],
    );
    assert_eq!(o.status.code(), Some(3), "{}", describe(&o));
    let label = failed.last().map(|f| f.1.clone());
    assert_eq!(
        label,
        Some(Some(
            "prefill/chunk.27/layer.0/gdn/chunk_gated_delta_rule/chunk_gated_delta_rule_fwd_h"
                .to_string()
        ))
    );
}
