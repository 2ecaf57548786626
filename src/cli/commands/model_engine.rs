//! `vramtrace model CONFIG --runtime transformers --tokens C --limit BYTES [--memory-fraction F]`:
//! the engine's planner (`vramtrace_models::engine`), run chunk by chunk from the config and the
//! flags alone through PyTorch's caching allocator under the limit the engine meets, to the first
//! refused request. Prints the frontier at the chunk (the largest context that completes) and
//! the failing step, every figure labelled with its basis (docs/architecture.md, "Engines").

use anyhow::{Context, bail};
use serde_json::json;
use vramtrace_models::engine::transformers_5::{ContextFrontier, GenerateChunked};
use vramtrace_models::engine::{Basis, Engine};
use vramtrace_models::units::fmt_bytes;
use vramtrace_models::{Limit, ModelConfig};

/// The prompt when neither `--context` nor `--prompt-tokens` says, and the config has no
/// `max_position_embeddings`.
const DEFAULT_PROMPT: u64 = 1 << 20;

/// Runs the planner: exit 0 when the prompt (`--context`) is held, 1 when a chunk is refused.
pub fn run(
    mut planner: GenerateChunked,
    limit: Limit,
    context: Option<u64>,
    prompt_tokens: Option<u64>,
    calibrate: Option<&std::path::Path>,
    json_out: bool,
) -> anyhow::Result<i32> {
    let (cfg, chunk) = (planner.config.clone(), planner.chunk_tokens);
    let max = cfg.max_position_embeddings;
    let (prompt, asked) = match (context, prompt_tokens) {
        (Some(_), Some(_)) => bail!(
            "give --context (is this context held?) or --prompt-tokens (how far does it get?), not both"
        ),
        (Some(c), None) => (c, "--context"),
        (None, Some(p)) => (p, "--prompt-tokens"),
        (None, None) => (max.unwrap_or(DEFAULT_PROMPT), "the default"),
    };
    if let Some(m) = max.filter(|&m| prompt > m) {
        bail!(
            "{asked} asks for {prompt} tokens, past the model's max_position_embeddings of {m}: transformers would not generate that far"
        );
    }
    if let Some(trace) = calibrate {
        planner.calibration = Some(calibration(&planner, &limit, trace)?);
    }
    let basis = if planner.calibration.is_some() {
        Basis::Calibrated
    } else {
        Basis::Predicted
    };
    let run = planner
        .plan(&limit, prompt)
        .with_context(|| format!("planning {}", planner.name()))?;
    let frontier = ContextFrontier::of(&run, chunk, basis);
    let held = run.failure.is_none();
    if json_out {
        let last_steps: Vec<_> = run.steps.iter().rev().take(4).rev().collect();
        let v = json!({
            "engine": run.engine,
            "attn_implementation": planner.attention.name(),
            "expandable_segments": planner.expandable_segments,
            "config": cfg.path,
            "chunk_tokens": chunk,
            "prompt_tokens": prompt,
            "limit": run.limit,
            "limit_bytes": run.limit_bytes,
            "fits": held,
            "frontier": {
                "context_at_chunk": frontier.context_at_chunk,
                "failing_context": frontier.failing_context,
                "capped": frontier.capped,
                "cap": prompt,
                "basis": match frontier.basis { Basis::Predicted => "config", other => other.name() },
            },
            "failure": run.failure,
            "calibration": planner.calibration,
            "steps_completed": run.steps.len(),
            "last_steps": last_steps,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(if held { 0 } else { 1 });
    }
    println!(
        "{}: {} in chunks of {chunk} tokens with {} attention{}, against {} ({} the allocator may hold); {}.",
        cfg.display_name(),
        planner.name(),
        planner.attention.name(),
        if planner.expandable_segments {
            " and expandable segments"
        } else {
            ""
        },
        run.limit.describe(),
        fmt_bytes(run.limit_bytes),
        match &planner.calibration {
            None => "every figure predicted from the config and the flags".to_string(),
            Some(k) => format!(
                "calibrated from {} ({} forwards): {:.1} B per chunk token and {:.4} B per chunk token × context token held through each forward, {} of reserve held back",
                k.from,
                k.forwards,
                k.per_chunk_token,
                k.per_chunk_context_token,
                fmt_bytes(k.reserve_held_back)
            ),
        }
    );
    println!();
    for s in run.steps.iter().rev().take(3).rev() {
        println!(
            "  chunk {:>4}  context {:>9} tok   peak allocated {:>11}   reserved {:>11}",
            s.index,
            s.context_tokens,
            fmt_bytes(s.peak_allocated),
            fmt_bytes(s.peak_reserved)
        );
    }
    match &run.failure {
        Some(f) if f.context_tokens == 0 => println!(
            "\nNothing of the prompt runs: {} ({}) is refused before the first chunk, with {} held; the frontier at a chunk of {chunk} is none.",
            f.tensor,
            fmt_bytes(f.request),
            fmt_bytes(f.reserved)
        ),
        Some(f) => {
            println!(
                "  chunk {:>4}  context {:>9} tok   refused: {} of {} ({}) at {}",
                f.index,
                f.context_tokens,
                f.tensor,
                fmt_bytes(f.request),
                if f.segment == f.request {
                    "a segment of its own".to_string()
                } else {
                    format!("a {} segment", fmt_bytes(f.segment))
                },
                f.source
            );
            println!();
            println!(
                "Held when refused: {} allocated, {} reserved (limit {}):",
                fmt_bytes(f.allocated),
                fmt_bytes(f.reserved),
                fmt_bytes(run.limit_bytes)
            );
            for p in &f.parts {
                println!(
                    "  {:<18} {:>11}  {}",
                    p.category.key(),
                    fmt_bytes(p.bytes),
                    p.basis.name()
                );
            }
            println!();
            println!(
                "Frontier at a chunk of {chunk}: the largest context that completes is {} tokens ({}); chunk {} ({} tokens held at its end) is refused.",
                frontier
                    .context_at_chunk
                    .map_or("none: not even the first chunk".to_string(), |c| c
                        .to_string()),
                basis.name(),
                f.index,
                f.context_tokens
            );
        }
        None => println!(
            "\nEvery chunk of the {prompt}-token prompt ({asked}) completes: the frontier at a chunk of {chunk} is at least {prompt} tokens ({}).",
            basis.name()
        ),
    }
    Ok(if held { 0 } else { 1 })
}

/// The CUDA context and driver overhead when `--known context=` does not say: transformers' own
/// figure for it (`generation/continuous_batching/requests.py:48-49`, "~0.5 GiB").
const DEFAULT_CONTEXT: u64 = 512 << 20;

/// `vramtrace model CONFIG --cb-max-memory-percent P --limit TOTAL`: the paged pool and batch
/// transformers' continuous batching plans at start, from the config, the flag and the memory
/// free then (the card less the context and the weights, both predicted unless given).
pub fn run_cb(
    cfg: ModelConfig,
    total: u64,
    percent: f64,
    block_size: Option<u64>,
    flash_attention: bool,
    context: Option<u64>,
    json_out: bool,
) -> anyhow::Result<i32> {
    use vramtrace_models::engine::transformers_cb::{ContinuousBatching, DEFAULT_BLOCK_SIZE};
    use vramtrace_models::{WeightFormat, weight_bytes};
    let weights = weight_bytes(&cfg, WeightFormat::Bf16, 1)?.bytes;
    // The weights sit in one segment of the caching allocator (caching_allocator_warmup),
    // rounded to 2 MiB.
    let weights_reserved = weights.next_multiple_of(2 << 20);
    let ctx = context.unwrap_or(DEFAULT_CONTEXT);
    let free = total.saturating_sub(ctx).saturating_sub(weights_reserved);
    let planner = ContinuousBatching {
        config: cfg.clone(),
        max_memory_percent: percent,
        block_size: block_size.unwrap_or(DEFAULT_BLOCK_SIZE),
        flash_attention,
        free_bytes: free,
        reserved_bytes: weights_reserved,
        total_bytes: total,
    };
    let plan = planner.plan()?;
    let context_basis = if context.is_some() {
        "given"
    } else {
        "default"
    };
    if json_out {
        let v = json!({
            "engine": "transformers 5.17 continuous batching (PagedAttentionCache)",
            "config": cfg.path,
            "max_memory_percent": percent,
            "total": total,
            "weights": {"bytes": weights_reserved, "basis": "config"},
            "context": {"bytes": ctx, "basis": context_basis},
            "free": free,
            "plan": plan,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    println!(
        "{}: transformers 5.17's continuous batching at max_memory_percent {percent} of a {} card ({} free after the weights' {} and {} of context, {context_basis}):",
        cfg.display_name(),
        fmt_bytes(total),
        fmt_bytes(free),
        fmt_bytes(weights_reserved),
        fmt_bytes(ctx)
    );
    println!(
        "  available {}  ->  max_batch_tokens {}, num_blocks {} of {} tokens ({} token slots), KV pool {}",
        fmt_bytes(plan.available),
        plan.max_batch_tokens,
        plan.num_blocks,
        plan.block_size,
        plan.pages,
        fmt_bytes(plan.kv_pool_bytes)
    );
    Ok(0)
}

/// The planner's terms fitted to `trace`: its forwards of `generate` beside the planner's run at
/// the trace's own chunk, under the limit its refusal names (else `limit`).
fn calibration(
    planner: &GenerateChunked,
    limit: &Limit,
    trace: &std::path::Path,
) -> anyhow::Result<vramtrace_models::engine::transformers_5::Calibration> {
    let cfg = &planner.config;
    let t = vramtrace::trace::Trace::open(trace)
        .with_context(|| format!("--calibrate {}", trace.display()))?;
    let observed = vramtrace::calibrate::observe_generate(&t, cfg)?.with_context(|| {
        format!(
            "--calibrate {}: no prefill forward of transformers' generate whose embedding output is {} B a token (the config's hidden size × dtype); give a trace of the same program and model",
            trace.display(),
            cfg.hidden_size * cfg.dtype.size_bytes()
        )
    })?;
    let traced_chunk = observed.forwards[0].chunk_tokens;
    let capacity = match *limit {
        Limit::PerProcessFraction { capacity, .. }
        | Limit::Card { capacity }
        | Limit::GpuMemoryUtilization { capacity, .. } => capacity,
    };
    let traced_limit = match observed.torch_limit {
        Some(l) => Limit::PerProcessFraction {
            capacity,
            fraction: l as f64 / capacity as f64,
        },
        None => *limit,
    };
    let last = observed.forwards.last().map_or(0, |f| f.context_tokens);
    // The traced run is planned as the target is (the same attention and allocator settings):
    // calibration carries terms between chunks and limits of one program.
    let mut traced = planner.clone();
    traced.chunk_tokens = traced_chunk;
    traced.calibration = None;
    let planned = traced.plan(&traced_limit, last)?;
    vramtrace::calibrate::fit(&observed, &planned, &trace.display().to_string()).with_context(
        || {
            format!(
                "--calibrate {}: fewer than two whole forwards after the first to fit to",
                trace.display()
            )
        },
    )
}
