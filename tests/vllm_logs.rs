//! vLLM's own start-up lines, as users posted them (tests/data/vllm_startup_logs.json,
//! tests/data/vllm_v1_startup_logs.json and tests/data/vllm_v1_debug_logs.json, each with its
//! source), against vLLM 0.20.1's planner (`models/src/engine/vllm_0_20_1_plan.rs`,
//! `vllm_0_20_1_pool.rs`). Two stages are checked (docs/validation.md, "vLLM's start-up lines"):
//! the pool's, from the "Available KV cache memory" a log prints to the "GPU KV cache size" in
//! tokens (hybrids and TP included); and the whole chain, from the config and the command line
//! alone to the tokens, with the log's intermediate figures set beside the predicted ones.

use serde_json::Value;
use vramtrace_models::engine::vllm_0_20_1_pool::{GdnState, PoolShape, plan};

fn logs(file: &str) -> Vec<Value> {
    let path = format!("{}/tests/data/{file}", env!("CARGO_MANIFEST_DIR"));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["logs"].as_array().unwrap().clone()
}

/// The log `id` (by its prefix) of `file`, with its available GiB and logged tokens.
fn figures(file: &str, id: &str) -> (f64, u64, Value) {
    let l = logs(file)
        .into_iter()
        .find(|l| l["id"].as_str().unwrap().starts_with(id))
        .unwrap_or_else(|| panic!("no log {id} in {file}"));
    let f = &l["figures"];
    (
        f["available_kv_cache_gib"].as_f64().unwrap(),
        f["gpu_kv_cache_tokens"].as_u64().unwrap(),
        l,
    )
}

fn dense(
    layers: u64,
    kv_heads: u64,
    head: u64,
    kv_bytes: u64,
    tp: u64,
    max_model_len: u64,
) -> PoolShape {
    PoolShape {
        attention_layers: layers,
        gdn_layers: 0,
        kv_heads_per_rank: (kv_heads / tp).max(1),
        head_size: head,
        kv_bytes,
        gdn: None,
        tp,
        block_size: None,
        max_model_len,
        num_spec: 0,
        prefix_caching: false,
    }
}

/// Qwen3.5/3.6's GDN state (16 key and `value_heads` value heads of 128, conv kernel 4), the
/// recurrent part in fp32 as Qwen3.5 checkpoints declare (`mamba_ssm_dtype`).
fn qwen35_gdn(value_heads: u64) -> GdnState {
    GdnState {
        key_heads: 16,
        value_heads,
        key_dim: 128,
        value_dim: 128,
        conv_kernel: 4,
        conv_bytes: 2,
        ssm_bytes: 4,
    }
}

/// Qwen3.6-35B-A3B as log L11 ran it: an fp8 cache on one GPU (10 attention and 30 GDN layers,
/// 2 KV heads of 256, 32 GDN value heads), `max_model_len` 131,072.
fn qwen36_35b(prefix_caching: bool) -> PoolShape {
    PoolShape {
        attention_layers: 10,
        gdn_layers: 30,
        kv_heads_per_rank: 2,
        head_size: 256,
        kv_bytes: 1,
        gdn: Some(qwen35_gdn(32)),
        tp: 1,
        block_size: None,
        max_model_len: 131_072,
        num_spec: 0,
        prefix_caching,
    }
}

#[test]
fn the_pool_from_the_logged_available_bytes_is_the_logged_token_count() {
    let v1 = "vllm_v1_startup_logs.json";
    let old = "vllm_startup_logs.json";
    let mut rows = Vec::new();
    let cases: Vec<(&str, &str, PoolShape, f64)> = vec![
        // Qwen3-1.7B, -8B, -14B (28/36/40 layers, 8 KV heads of 128, bf16).
        (v1, "L01", dense(28, 8, 128, 2, 1, 1024), 0.1),
        (v1, "L03", dense(36, 8, 128, 2, 1, 16_384), 0.1),
        (v1, "L04", dense(40, 8, 128, 2, 1, 32_768), 0.1),
        // Qwen3-235B-A22B at TP 4: 94 layers, 4 KV heads replicated to one a rank; its
        // max_model_len is the config's 40,960. An older vLLM with LMCache: 1.2% apart.
        (old, "qwen3-235b", dense(94, 4, 128, 2, 4, 40_960), 1.5),
        // Qwen3.6-27B at TP 2, an fp8 cache, MTP with 3 speculative tokens (16 attention and 48
        // GDN layers, 4 KV heads of 256; 48 GDN value heads).
        (
            v1,
            "L08",
            PoolShape {
                attention_layers: 16,
                gdn_layers: 48,
                kv_heads_per_rank: 2,
                head_size: 256,
                kv_bytes: 1,
                gdn: Some(qwen35_gdn(48)),
                tp: 2,
                block_size: None,
                max_model_len: 262_144,
                num_spec: 3,
                prefix_caching: false,
            },
            5.0,
        ),
        // Qwen3.6-35B-A3B, fp8 cache, one GPU (10 attention and 30 GDN layers, 2 KV heads of
        // 256, 32 GDN value heads); vLLM 0.24.0.
        (v1, "L11", qwen36_35b(false), 5.0),
    ];
    for (file, id, shape, tolerance) in cases {
        let (gib, tokens, l) = figures(file, id);
        let p = plan(&shape, (gib * (1u64 << 30) as f64) as i128).unwrap();
        let off = 100.0 * (p.kv_cache_tokens as f64 - tokens as f64) / tokens as f64;
        rows.push(format!(
            "{id}: {} predicted, {tokens} logged ({off:+.2}%)",
            p.kv_cache_tokens
        ));
        assert!(
            off.abs() <= tolerance,
            "{id} ({}): {} tokens from {gib} GiB, vLLM logged {tokens} ({off:+.2}%)",
            l["source"]["url"],
            p.kv_cache_tokens
        );
    }
    eprintln!("{}", rows.join("\n"));
}

/// L11 was vLLM 0.24.0: its 4.35x is the pool with the state cache in mode "align" (two states a
/// request, as with prefix caching on), to the token; 0.20.1's default ("none") is 4.5% over.
#[test]
fn a_hybrid_with_prefix_caching_keeps_two_states_a_request() {
    let (gib, tokens, _) = figures("vllm_v1_startup_logs.json", "L11");
    let shape = qwen36_35b(true);
    let p = plan(&shape, (gib * (1u64 << 30) as f64) as i128).unwrap();
    assert_eq!(p.block_size, 2096);
    assert_eq!(p.blocks_per_request, 63 + 3 * 2);
    assert_eq!(p.kv_cache_tokens, tokens);
    assert_eq!(format!("{:.2}", p.max_concurrency), "4.35");
}

/// The whole chain, from the config and the command line alone, against the start-up lines of
/// vLLM 0.19.0 on H100 80GB HBM3s (tests/data/vllm_v1_debug_logs.json, each with its source): the
/// budget `⌈util × total⌉`, the weights, the profile run's torch peak, the non-torch increase
/// and the pool, to the "GPU KV cache size" in tokens. In 0.19.0 the CUDA-graph estimate was
/// computed but not subtracted (every log's available bytes are its requested bytes less the
/// non-KV ones), as with `VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0`. The card is the total
/// vLLM printed for an H100 80GB HBM3 (79.19 GiB). One log built a default and is not counted:
/// `llmd_llama31_8b_h100_tp2`, the non-torch increase at TP > 1 ([`DEFAULT_NON_TORCH_TP`]).
///
/// [`DEFAULT_NON_TORCH_TP`]: vramtrace_models::engine::vllm_0_20_1_plan::DEFAULT_NON_TORCH_TP
#[test]
fn the_whole_chain_from_the_config_and_the_command_line() {
    use vramtrace_models::engine::vllm_0_20_1_plan::{VllmFlags, plan};
    use vramtrace_models::{DType, ModelConfig, WeightFormat};
    const GIB: f64 = (1u64 << 30) as f64;
    let card = (79.19 * GIB).round() as u64;
    let dir = format!("{}/tests/data", env!("CARGO_MANIFEST_DIR"));
    let mut rows = vec![format!(
        "{:<36} {:>15} {:>13} {:>13} {:>11} {:>15} {:>17}",
        "log", "weights GiB", "peak GiB", "non-torch", "", "available GiB", "tokens"
    )];
    let mut checked = 0;
    for l in logs("vllm_v1_debug_logs.json") {
        if l["vllm_version"] != "0.19.0" {
            continue;
        }
        let id = l["id"].as_str().unwrap();
        let f = &l["flags"];
        let fig = &l["figures"];
        let cfg = ModelConfig::from_path(format!("{dir}/{}", l["config_file"].as_str().unwrap()))
            .unwrap();
        let mut flags = VllmFlags::serve(card);
        flags.gpu_memory_utilization = f["gpu_memory_utilization"].as_f64().unwrap();
        flags.max_num_batched_tokens = f["max_num_batched_tokens"].as_u64();
        flags.max_num_seqs = f["max_num_seqs"].as_u64();
        flags.max_model_len = f["max_model_len"].as_u64();
        flags.tp = f["tensor_parallel_size"].as_u64().unwrap();
        flags.estimate_cudagraphs = false;
        if f["kv_cache_dtype"] == "fp8" {
            flags.kv_cache_dtype = Some(DType::F8);
        }
        // The weights' format as the log's own engine line names the quantization (the configs
        // kept here are the base models'): fp8 (online, or compressed-tensors fp8-dynamic),
        // int4 (the w4a16 checkpoint vLLM runs with gptq_marlin).
        flags.weights = match f["quantization"].as_str() {
            None => None,
            Some("gptq_marlin") => Some(WeightFormat::Int4 { group: 128 }),
            Some("fp8" | "compressed-tensors") => Some(WeightFormat::Fp8Block128),
            Some(q) => panic!("{id}: quantization {q} not mapped"),
        };
        let p = plan(&cfg, &flags).unwrap();
        let tokens = p.kv_cache_tokens().unwrap();
        let logged = fig["gpu_kv_cache_tokens"].as_u64().unwrap();
        let off = 100.0 * (tokens as f64 - logged as f64) / logged as f64;
        let g = |b: u64| b as f64 / GIB;
        let pair = |a: f64, b: &serde_json::Value| format!("{a:.2}/{:.2}", b.as_f64().unwrap());
        rows.push(format!(
            "{id:<36} {:>15} {:>13} {:>13} {:>11} {:>15} {:>17} {off:+.2}%",
            pair(g(p.weights.bytes), &fig["weights_memory_gib"]),
            pair(g(p.profiled_peak.bytes), &fig["torch_peak_increase_gib"]),
            pair(g(p.non_torch.bytes), &fig["non_torch_gib"]),
            "",
            pair(
                p.available_bytes as f64 / GIB,
                &fig["available_kv_cache_gib"]
            ),
            format!("{tokens}/{logged}"),
        ));
        if id == "llmd_llama31_8b_h100_tp2" {
            continue;
        }
        assert!(
            off.abs() <= 5.0,
            "{id} ({}): {tokens} tokens predicted, vLLM logged {logged} ({off:+.2}%)",
            l["source"]["url"]
        );
        // The budget is vLLM's own rounding of the card it printed.
        assert!(
            (g(p.requested_bytes) - fig["requested_gib"].as_f64().unwrap()).abs() < 0.006,
            "{id}"
        );
        checked += 1;
    }
    eprintln!("predicted/logged\n{}", rows.join("\n"));
    assert!(checked >= 10, "{checked} logs checked");
}
