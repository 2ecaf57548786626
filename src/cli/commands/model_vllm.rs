//! `vramtrace model CONFIG --runtime vllm-0.20.1 --limit CARD --gpu-memory-utilization U`: vLLM
//! 0.20.1's start-up plan (`models/src/engine/vllm_0_20_1_plan.rs`): the budget, each term it
//! subtracts, the pool and the tokens vLLM would log, the slack the card keeps beyond the budget,
//! and with `--context` the step of `--max-num-batched-tokens` new tokens against the card; then
//! each lever's outcome as vLLM would produce it.

use anyhow::{Context, bail};
use serde_json::{Value, json};
use vramtrace_models::engine::vllm_0_20_1_plan::{
    TermBasis, VllmFlags, VllmPlan, VllmStep, plan, step,
};
use vramtrace_models::units::{fmt_bytes, parse_bytes};
use vramtrace_models::{DType, ModelConfig, WeightFormat};

use crate::commands::model_step::{StepArgs, config_weights, known_parts};

/// The flags of `vramtrace model` as vLLM's.
pub fn flags(
    cfg: &ModelConfig,
    card: u64,
    util: f64,
    tp: u64,
    weights: Option<WeightFormat>,
    args: &StepArgs,
) -> anyhow::Result<VllmFlags> {
    let known = known_parts(&args.known)?;
    for (name, v) in [
        ("kv_pool", known.kv_pool),
        ("allocator_reserve", known.allocator_reserve),
        ("engine_buffers", known.engine_buffers),
        ("autotune", known.autotune),
    ] {
        if v.is_some() {
            bail!(
                "--known {name}= is not a term of vLLM's plan; it takes context=, communication=, other_process= (held before start) and cuda_graphs= (the graph estimate)"
            );
        }
    }
    let outside = match (known.context, known.communication, known.other_process) {
        (None, None, None) => None,
        (c, n, o) => Some(
            c.unwrap_or(vramtrace_models::engine::vllm_0_20_1_plan::DEFAULT_OUTSIDE_BUDGET)
                + n.unwrap_or(0)
                + o.unwrap_or(0),
        ),
    };
    let kv = match args.kv_dtype.as_deref() {
        None | Some("auto") => None,
        Some(d) => Some(
            d.parse::<DType>()
                .map_err(anyhow::Error::msg)
                .context("--kv-dtype")?,
        ),
    };
    Ok(VllmFlags {
        card_bytes: card,
        gpu_memory_utilization: util,
        max_num_batched_tokens: args.max_num_batched_tokens,
        max_num_seqs: args.max_num_seqs,
        max_model_len: args.max_model_len,
        kv_cache_dtype: kv,
        tp: tp.max(1),
        enforce_eager: args.enforce_eager,
        estimate_cudagraphs: !args.no_cudagraph_estimate,
        block_size: args.block_size,
        weights: weights.or(config_weights(cfg)?),
        outside_budget: outside,
        non_torch_increase: args
            .non_torch
            .as_deref()
            .map(|b| parse_bytes(b).context("--non-torch"))
            .transpose()?,
        cudagraph_estimate: known.cuda_graphs,
        num_sms: 132,
        enable_prefix_caching: args.enable_prefix_caching,
        num_speculative_tokens: args.num_speculative_tokens.unwrap_or(0),
        mamba_ssm_cache_dtype: args
            .mamba_ssm_cache_dtype
            .as_deref()
            .map(|d| d.parse::<DType>().map_err(anyhow::Error::msg))
            .transpose()
            .context("--mamba-ssm-cache-dtype")?,
        checkpoint_bytes: match (&args.safetensors_index, &args.gguf) {
            (Some(p), _) => Some(checkpoint_bytes(p)?),
            (None, Some(p)) => Some(gguf_bytes(p)?),
            (None, None) => None,
        },
    })
}

/// A GGUF checkpoint's tensor bytes, from its header: vLLM's GGUF loader keeps every tensor as
/// the file stores it (`model_executor/layers/quantization/gguf.py:432-473`, the quantized
/// blocks as `uint8` parameters of the file's size).
fn gguf_bytes(path: &std::path::Path) -> anyhow::Result<u64> {
    let h = vramtrace_models::gguf::GgufHeader::read(path)
        .with_context(|| format!("--gguf {}", path.display()))?;
    let total: u64 = h.tensors.iter().map(|t| t.bytes).sum();
    if total == 0 {
        anyhow::bail!("--gguf {}: the file lists no tensors", path.display());
    }
    Ok(total)
}

/// `metadata.total_size` of a safetensors index.
fn checkpoint_bytes(path: &std::path::Path) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--safetensors-index {}", path.display()))?;
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("--safetensors-index {}: not JSON", path.display()))?;
    v["metadata"]["total_size"]
        .as_u64()
        .filter(|&b| b > 0)
        .with_context(|| {
            format!(
                "--safetensors-index {}: no metadata.total_size (a model.safetensors.index.json has one)",
                path.display()
            )
        })
}

/// One lever: the flags changed and vLLM's outcome.
struct Lever {
    name: String,
    flags: VllmFlags,
}

/// The levers vLLM offers, each one step away from `f`.
fn levers(f: &VllmFlags, p: &VllmPlan, cfg: &ModelConfig) -> Vec<Lever> {
    let mut out = Vec::new();
    let mut push = |name: String, g: VllmFlags| {
        if g != *f {
            out.push(Lever { name, flags: g });
        }
    };
    for d in [-0.05, -0.02, 0.02] {
        let u = ((f.gpu_memory_utilization + d) * 100.0).round() / 100.0;
        if u > 0.0 && u <= 1.0 {
            push(
                format!("--gpu-memory-utilization {u:.2}"),
                VllmFlags {
                    gpu_memory_utilization: u,
                    ..f.clone()
                },
            );
        }
    }
    let half = (p.max_num_batched_tokens / 2).max(1);
    push(
        format!("--max-num-batched-tokens {half}"),
        VllmFlags {
            max_num_batched_tokens: Some(half),
            ..f.clone()
        },
    );
    push(
        format!("--max-model-len {}", p.max_model_len / 2),
        VllmFlags {
            max_model_len: Some((p.max_model_len / 2).max(1)),
            ..f.clone()
        },
    );
    if p.max_num_seqs > 16 {
        push(
            "--max-num-seqs 16".into(),
            VllmFlags {
                max_num_seqs: Some(16),
                ..f.clone()
            },
        );
    }
    if f.kv_cache_dtype != Some(DType::F8) && cfg.dtype != DType::F8 {
        push(
            "--kv-cache-dtype fp8".into(),
            VllmFlags {
                kv_cache_dtype: Some(DType::F8),
                ..f.clone()
            },
        );
    }
    push(
        "--enforce-eager".into(),
        VllmFlags {
            enforce_eager: true,
            ..f.clone()
        },
    );
    push(
        "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0".into(),
        VllmFlags {
            estimate_cudagraphs: false,
            ..f.clone()
        },
    );
    // Twice the ranks, where the heads split over them (vLLM refuses an uneven split; the step
    // model does not replicate KV heads).
    let tp2 = f.tp * 2;
    if cfg.num_attention_heads.is_multiple_of(tp2)
        && cfg.num_key_value_heads.is_multiple_of(tp2)
        && cfg.linear_num_value_heads.is_multiple_of(tp2)
        && cfg.linear_num_key_heads.is_multiple_of(tp2)
    {
        push(
            format!("--tensor-parallel-size {tp2}"),
            VllmFlags {
                tp: tp2,
                ..f.clone()
            },
        );
    }
    out
}

fn step_json(s: &VllmStep) -> Value {
    json!({
        "chunk_tokens": s.chunk_tokens,
        "context_tokens": s.context_tokens,
        "peak_bytes": s.peak_bytes,
        "peak_layer": s.peak_layer,
        "excess_over_profiled_bytes": s.excess_bytes,
        "held_bytes": s.held_bytes,
        "margin_bytes": s.margin_bytes,
        "admitted": s.admitted,
        "refused_because": s.refused_because,
        "fits": s.fits,
    })
}

fn plan_json(p: &VllmPlan) -> Value {
    let pool = p.pool.as_ref().ok();
    json!({
        "max_num_batched_tokens": p.max_num_batched_tokens,
        "max_num_seqs": p.max_num_seqs,
        "max_model_len": p.max_model_len,
        "card_bytes": p.card_bytes,
        "requested_bytes": p.requested_bytes,
        "outside_budget": p.outside_budget,
        "weights": p.weights,
        "profiled_peak_bytes": p.profiled_peak.bytes,
        "profiled_peak": p.profiled_peak,
        "profiled_peak_layer": p.profiled_peak_layer,
        "non_torch": p.non_torch,
        "cudagraph": p.cudagraph,
        "moe_workspace_bytes": p.moe_workspace_bytes,
        "cudagraph_graphs": {"piecewise": p.cudagraph_counts.0, "full": p.cudagraph_counts.1},
        "available_bytes": p.available_bytes,
        "pool_bytes": pool.map(|x| x.pool_bytes),
        "kv_cache_tokens": pool.map(|x| x.kv_cache_tokens),
        "max_concurrency": pool.map(|x| x.max_concurrency),
        "block_size": pool.map(|x| x.block_size),
        "num_blocks": pool.map(|x| x.num_blocks),
        "page_bytes": pool.map(|x| x.page_bytes),
        "startup_error": p.startup_error(),
        "slack_bytes": p.slack_bytes,
    })
}

/// Runs the vLLM planner.
pub fn run(
    cfg: ModelConfig,
    f: VllmFlags,
    chunk: Option<u64>,
    context: Option<u64>,
    json_out: bool,
) -> anyhow::Result<i32> {
    let p = plan(&cfg, &f)?;
    let chunk = chunk.unwrap_or(p.max_num_batched_tokens);
    let s = match context {
        Some(c) => Some(step(&cfg, &f, &p, chunk, c)?),
        None => None,
    };
    let mut rows = Vec::new();
    for l in levers(&f, &p, &cfg) {
        let lp = plan(&cfg, &l.flags)?;
        let ls = match context {
            Some(c) => Some(step(
                &cfg,
                &l.flags,
                &lp,
                chunk.min(lp.max_num_batched_tokens),
                c,
            )?),
            None => None,
        };
        rows.push((l.name, lp, ls));
    }
    if json_out {
        let v = json!({
            "runtime": "vllm-0.20.1",
            "model": cfg.display_name(),
            "weights_bytes": p.weights.bytes,
            "weight_format": p.weight_format,
            "vllm": plan_json(&p),
            "step": s.as_ref().map(step_json),
            "levers": rows.iter().map(|(name, lp, ls)| json!({
                "lever": name,
                "kv_cache_tokens": lp.kv_cache_tokens(),
                "startup_error": lp.startup_error(),
                "slack_bytes": lp.slack_bytes,
                "profiled_peak_bytes": lp.profiled_peak.bytes,
                "step": ls.as_ref().map(step_json),
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    print_plan(&cfg, &f, &p, s.as_ref());
    println!();
    println!("Levers (one at a time; vLLM's outcome):");
    println!(
        "  {:<44} {:>14} {:>11} {:>14}  step",
        "lever", "KV tokens", "slack", "step margin"
    );
    let outcome = |lp: &VllmPlan, ls: Option<&VllmStep>| {
        let tokens = lp
            .kv_cache_tokens()
            .map_or("won't start".to_string(), |t| t.to_string());
        let margin = ls
            .filter(|s| s.admitted)
            .map_or("-".to_string(), |s| signed(s.margin_bytes));
        let verdict = match ls {
            None => String::new(),
            Some(s) if s.fits => "fits".into(),
            Some(s) if !s.admitted => "refused".into(),
            Some(_) => "OOM".into(),
        };
        (tokens, signed(lp.slack_bytes), margin, verdict)
    };
    let (t, sl, m, v) = outcome(&p, s.as_ref());
    println!("  {:<44} {t:>14} {sl:>11} {m:>14}  {v}", "(as given)");
    for (name, lp, ls) in &rows {
        let (t, sl, m, v) = outcome(lp, ls.as_ref());
        println!("  {name:<44} {t:>14} {sl:>11} {m:>14}  {v}");
    }
    Ok(0)
}

fn basis(b: TermBasis) -> &'static str {
    match b {
        TermBasis::Code => "vLLM's formula",
        TermBasis::Default => "default",
        TermBasis::Given => "given",
        TermBasis::Skipped => "skipped",
    }
}

fn signed(b: i64) -> String {
    if b < 0 {
        format!("-{}", fmt_bytes(b.unsigned_abs()))
    } else {
        fmt_bytes(b as u64)
    }
}

fn print_plan(cfg: &ModelConfig, f: &VllmFlags, p: &VllmPlan, s: Option<&VllmStep>) {
    println!(
        "{} under vLLM 0.20.1 on a card of {} at --gpu-memory-utilization {} (TP {}; --max-num-batched-tokens {}, --max-num-seqs {}, --max-model-len {})",
        cfg.display_name(),
        fmt_bytes(p.card_bytes),
        f.gpu_memory_utilization,
        f.tp,
        p.max_num_batched_tokens,
        p.max_num_seqs,
        p.max_model_len
    );
    println!();
    println!("Start-up (gpu_worker.py determine_available_memory):");
    let row = |name: &str, b: String, why: &str| println!("  {name:<22} {b:>12}  {why}");
    row(
        "budget",
        fmt_bytes(p.requested_bytes),
        "⌈total × util⌉ (v1/worker/utils.py:408-410)",
    );
    for (name, t) in [
        ("− weights", &p.weights),
        ("− profiled peak", &p.profiled_peak),
        ("− non-torch", &p.non_torch),
        ("− CUDA graphs", &p.cudagraph),
    ] {
        row(
            name,
            fmt_bytes(t.bytes),
            &format!("{} [{}]", t.why, basis(t.basis)),
        );
    }
    row(
        "= for the KV cache",
        signed(p.available_bytes),
        "\"Available KV cache memory\"",
    );
    match &p.pool {
        Ok(pool) => println!(
            "  the pool: {} in {} blocks of {} tokens (page {}); vLLM logs \"GPU KV cache size: {} tokens\", \"Maximum concurrency for {} tokens per request: {:.2}x\"",
            fmt_bytes(pool.pool_bytes),
            pool.num_blocks,
            pool.block_size,
            fmt_bytes(pool.page_bytes),
            pool.kv_cache_tokens,
            p.max_model_len,
            pool.max_concurrency
        ),
        Err(e) => println!("  {e}"),
    }
    println!(
        "  the slack: card {} − outside the budget {} ({}) − budget {} = {}",
        fmt_bytes(p.card_bytes),
        fmt_bytes(p.outside_budget.bytes),
        basis(p.outside_budget.basis),
        fmt_bytes(p.requested_bytes),
        signed(p.slack_bytes)
    );
    if let Some(e) = p.startup_error().filter(|_| p.slack_bytes < 0) {
        println!("  {e}");
    }
    let Some(s) = s else {
        return;
    };
    println!();
    println!(
        "The step: {} new tokens with {} held. Its real peak is {} (the {} layer), {} the profiled peak of {}: {} against a slack of {}.",
        s.chunk_tokens,
        s.context_tokens,
        fmt_bytes(s.peak_bytes),
        s.peak_layer,
        if s.excess_bytes >= 0 { "over" } else { "under" },
        fmt_bytes(p.profiled_peak.bytes),
        signed(s.excess_bytes),
        signed(p.slack_bytes)
    );
    match &s.refused_because {
        Some(why) => println!("Refused: {why}."),
        None => println!(
            "On the card: {} held at the peak, {} ({}).",
            fmt_bytes(s.held_bytes),
            if s.fits { "fits" } else { "OOM" },
            if s.margin_bytes >= 0 {
                format!("{} to spare", fmt_bytes(s.margin_bytes as u64))
            } else {
                format!("short by {}", fmt_bytes(s.margin_bytes.unsigned_abs()))
            }
        ),
    }
}
