//! `vramtrace model CONFIG --context L`: the whole-step view of `vramtrace model`. One step of
//! `--tokens` T new tokens per sequence with L tokens held at its end, as a program runs it
//! (`--runtime`), part by part; against a limit (`--limit`, with `--gpu-memory-utilization` or
//! `--memory-fraction` a fraction of it), whether it fits, and the frontier: the largest chunk
//! at L (respecting vLLM's block floor with `--block-size`) and the largest context at T.

use anyhow::{Context, bail};
use serde_json::json;
use vramtrace_models::units::{fmt_bytes, parse_bytes};
use vramtrace_models::{
    ChunkFloor, DType, KnownParts, LayerKind, Limit, ModelConfig, Runtime, ServingShape, StepModel,
    StepVariants,
};

/// The whole-step options of `vramtrace model`.
#[derive(clap::Args, Debug, Default)]
#[command(
    next_help_heading = "Whole step (--context) and the engine planners (--runtime transformers --limit, --cb-max-memory-percent)"
)]
pub struct StepArgs {
    /// Tokens held at the end of the step (the chunk included): switches to the whole-step
    /// model, with `--tokens` as the chunk.
    #[arg(long, value_name = "TOKENS")]
    pub context: Option<u64>,
    /// The program that runs the step: workload, torch-prefill-script, vllm-0.20.1 or
    /// transformers. With transformers and a `--limit`, the engine's planner runs
    /// `generate(prefill_chunk_size=--tokens)` chunk by chunk through PyTorch's caching allocator
    /// to the first refusal (`--context`: is this context held?; otherwise how far it gets).
    #[arg(long, value_name = "RUNTIME", default_value = "transformers")]
    pub runtime: String,
    /// The limit: a card of this many bytes (e.g. `24GiB`); with a fraction, the card's total.
    #[arg(long, value_name = "BYTES")]
    pub limit: Option<String>,
    /// transformers' continuous batching (`serve --continuous-batching`): its
    /// `--cb-max-memory-percent`; prints the pool and batch it plans on the `--limit` card.
    #[arg(long, value_name = "P", requires = "limit")]
    pub cb_max_memory_percent: Option<f64>,
    /// With `--cb-max-memory-percent`: the cache block in tokens (transformers' default 256).
    #[arg(long, value_name = "TOKENS", requires = "cb_max_memory_percent")]
    pub cb_block_size: Option<u64>,
    /// With `--cb-max-memory-percent`: the model runs flash attention (no mask; CUDA graphs and
    /// two sets of IO tensors), not `paged|sdpa`.
    #[arg(long, requires = "cb_max_memory_percent")]
    pub cb_flash_attention: bool,
    /// The transformers planner's `attn_implementation`: `sdpa` (transformers' default) or
    /// `eager` (the scores materialised, a mask for every chunk).
    #[arg(long, value_name = "NAME", default_value = "sdpa", requires = "limit")]
    pub attn_implementation: String,
    /// The transformers planner's allocator runs with
    /// `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (one segment per pool growing by 2 or
    /// 20 MiB pages).
    #[arg(long, requires = "limit")]
    pub expandable_segments: bool,
    /// Calibrate the transformers planner from TRACE, a run of the same program (transformers'
    /// generate with prefill_chunk_size) at another chunk or limit: terms per chunk token, per
    /// chunk token × context token and the reserve, fitted to its forwards and carried to this
    /// chunk and limit (`frontier.basis` becomes `calibrated`).
    #[arg(long, value_name = "TRACE", requires = "limit")]
    pub calibrate: Option<std::path::PathBuf>,
    /// The transformers planner's prompt: how many tokens to try to hold (default: the model's
    /// `max_position_embeddings`).
    #[arg(
        long,
        value_name = "TOKENS",
        requires = "limit",
        conflicts_with = "context"
    )]
    pub prompt_tokens: Option<u64>,
    /// vLLM's `--gpu-memory-utilization` of the `--limit` card.
    #[arg(
        long,
        value_name = "F",
        requires = "limit",
        conflicts_with = "memory_fraction"
    )]
    pub gpu_memory_utilization: Option<f64>,
    /// PyTorch's `set_per_process_memory_fraction` of the `--limit` card.
    #[arg(long, value_name = "F", requires = "limit")]
    pub memory_fraction: Option<f64>,
    /// KV cache dtype (`bf16`, `fp8`): vLLM's `--kv-cache-dtype`.
    #[arg(long, value_name = "DTYPE")]
    pub kv_dtype: Option<String>,
    /// vLLM's attention block in tokens: the chunk floor in mamba align mode (hybrid models).
    #[arg(long, value_name = "TOKENS")]
    pub block_size: Option<u64>,
    /// vLLM's `--max-num-batched-tokens` (with `--runtime vllm-0.20.1 --gpu-memory-utilization`):
    /// the profile run's tokens, and the step's chunk unless `--tokens` says.
    #[arg(long, value_name = "N", requires = "gpu_memory_utilization")]
    pub max_num_batched_tokens: Option<u64>,
    /// vLLM's `--max-model-len` (default: the config's `max_position_embeddings`).
    #[arg(long, value_name = "L", requires = "gpu_memory_utilization")]
    pub max_model_len: Option<u64>,
    /// vLLM's `--max-num-seqs` (default: vLLM's for `vllm serve`: 256 on cards under 70 GiB,
    /// 1024 above): the sampler warm-up's rows.
    #[arg(long, value_name = "N", requires = "gpu_memory_utilization")]
    pub max_num_seqs: Option<u64>,
    /// vLLM's `--enforce-eager`: no CUDA graphs, so no graph estimate.
    #[arg(long, requires = "gpu_memory_utilization")]
    pub enforce_eager: bool,
    /// `VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0`: the graph estimate is not subtracted.
    #[arg(long, requires = "gpu_memory_utilization")]
    pub no_cudagraph_estimate: bool,
    /// vLLM's `--enable-prefix-caching`: a hybrid model's state cache in mode "align" (two
    /// states a request).
    #[arg(long, requires = "gpu_memory_utilization")]
    pub enable_prefix_caching: bool,
    /// vLLM's speculative tokens a step (`num_speculative_tokens`, MTP's n): more conv state
    /// rows and state blocks a request.
    #[arg(long, value_name = "N", requires = "gpu_memory_utilization")]
    pub num_speculative_tokens: Option<u64>,
    /// vLLM's `--mamba-ssm-cache-dtype` (default: the config's `mamba_ssm_dtype`, else the model
    /// dtype).
    #[arg(long, value_name = "DTYPE", requires = "gpu_memory_utilization")]
    pub mamba_ssm_cache_dtype: Option<String>,
    /// The checkpoint's `model.safetensors.index.json`: its `metadata.total_size` gives the
    /// weights' bytes (over the ranks) instead of counting them from the config.
    #[arg(long, value_name = "PATH", requires = "gpu_memory_utilization")]
    pub safetensors_index: Option<std::path::PathBuf>,
    /// A GGUF checkpoint vLLM serves (`vllm serve model.gguf`), or its header alone: its
    /// tensors' bytes give the weights (over the ranks), as vLLM keeps them quantized.
    #[arg(
        long,
        value_name = "PATH",
        requires = "gpu_memory_utilization",
        conflicts_with = "safetensors_index"
    )]
    pub gguf: Option<std::path::PathBuf>,
    /// vLLM's non-torch increase over its profile run, if known (default 0.35 GiB at TP 1; 2.07
    /// GiB at TP > 1, as vLLM printed it on NVLink-connected H100s).
    #[arg(long, value_name = "BYTES", requires = "gpu_memory_utilization")]
    pub non_torch: Option<String>,
    /// Keep the config's first N layers (a shortened model).
    #[arg(long, value_name = "N", requires = "context")]
    pub layers: Option<usize>,
    /// Bytes the step holds besides what the config gives (the context, a reserve), as
    /// `category=BYTES` (`context=700MiB`, `allocator_reserve=3GiB`); repeatable.
    #[arg(long, value_name = "CATEGORY=BYTES")]
    pub known: Vec<String>,
}

/// The limit of `--limit` with its fraction, if given.
pub fn limit(args: &StepArgs) -> anyhow::Result<Option<Limit>> {
    let Some(b) = &args.limit else {
        return Ok(None);
    };
    let capacity = parse_bytes(b).context("--limit")?;
    Ok(Some(
        match (args.gpu_memory_utilization, args.memory_fraction) {
            (Some(fraction), _) => Limit::GpuMemoryUtilization { capacity, fraction },
            (None, Some(fraction)) => Limit::PerProcessFraction { capacity, fraction },
            (None, None) => Limit::Card { capacity },
        },
    ))
}

/// The weight format the config's `quantization_config` gives, if it has one; an error when it
/// names a method the weights cannot be counted in.
pub fn config_weights(cfg: &ModelConfig) -> anyhow::Result<Option<vramtrace_models::WeightFormat>> {
    match &cfg.quantization {
        None => Ok(None),
        Some(q) => match &q.format {
            Ok(w) => Ok(Some(*w)),
            Err(e) => bail!(
                "the config's quantization_config ({}): {e}; give --weights",
                q.method
            ),
        },
    }
}

/// The `context=` of `--known`, if given.
pub fn known_context(list: &[String]) -> anyhow::Result<Option<u64>> {
    Ok(known_parts(list)?.context)
}

pub fn known_parts(list: &[String]) -> anyhow::Result<KnownParts> {
    let mut k = KnownParts::default();
    for item in list {
        let (name, bytes) = item.split_once('=').with_context(|| {
            format!("--known {item:?}: give CATEGORY=BYTES, e.g. context=700MiB")
        })?;
        let b = parse_bytes(bytes)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("--known {item:?}"))?;
        let slot = match name {
            "engine_buffers" => &mut k.engine_buffers,
            "cuda_graphs" => &mut k.cuda_graphs,
            "communication" => &mut k.communication,
            "autotune" => &mut k.autotune,
            "kv_pool" => &mut k.kv_pool,
            "allocator_reserve" => &mut k.allocator_reserve,
            "context" => &mut k.context,
            "other_process" => &mut k.other_process,
            _ => bail!(
                "--known {name:?} is not a part; use engine_buffers, cuda_graphs, communication, autotune, kv_pool, allocator_reserve, context or other_process"
            ),
        };
        *slot = Some(b);
    }
    Ok(k)
}

/// Runs the whole-step view.
pub fn run(
    cfg: ModelConfig,
    chunk: u64,
    tp: u64,
    weights: Option<vramtrace_models::WeightFormat>,
    args: &StepArgs,
    json_out: bool,
) -> anyhow::Result<i32> {
    let context = args.context.context("--context is required")?;
    let mut cfg = cfg;
    if let Some(n) = args.layers {
        if n == 0 || n > cfg.layer_types.len() {
            bail!(
                "--layers must be 1 to {} (the config's layers), not {n}",
                cfg.layer_types.len()
            );
        }
        cfg.layer_types.truncate(n);
        cfg.num_hidden_layers = n as u64;
    }
    let runtime = Runtime::from_name(&args.runtime).with_context(|| {
        let names: Vec<&str> = Runtime::ALL.iter().map(|r| r.name()).collect();
        format!(
            "--runtime {} is unknown; use one of {}",
            args.runtime,
            names.join(", ")
        )
    })?;
    let mut shape = ServingShape::prefill(&cfg, chunk, context);
    shape.tp = tp.max(1);
    if let Some(d) = &args.kv_dtype {
        shape.kv_dtype = d.parse::<DType>().map_err(anyhow::Error::msg)?;
    }
    let mut variants = StepVariants::for_runtime(runtime, &cfg);
    if let Some(w) = weights.or(config_weights(&cfg)?) {
        variants.weights = w;
    }
    let model = StepModel::new(cfg.clone(), variants, known_parts(&args.known)?);
    let limit = limit(args)?;
    let step = match &limit {
        Some(l) => model.check(&shape, l)?,
        None => model.step(&shape)?,
    };
    let hybrid = cfg.layer_types.contains(&LayerKind::LinearAttention);
    let floor = match args.block_size {
        Some(b) if hybrid => ChunkFloor::vllm_mamba_align(b),
        _ => ChunkFloor::none(),
    };
    let frontier = match &limit {
        Some(l) => Some((
            model.largest_chunk_at(&shape, l, &floor)?,
            model.largest_context_at(&shape.with_context(chunk), l, context.max(1 << 20))?,
        )),
        None => None,
    };
    if json_out {
        let mut v = serde_json::to_value(&step)?;
        for l in v["layers"].as_array_mut().into_iter().flatten() {
            l.as_object_mut().map(|o| o.remove("tensors"));
        }
        v["activations"]
            .as_object_mut()
            .map(|o| o.remove("tensors"));
        if let Some((c, x)) = &frontier {
            v["chunk_frontier"] = json!(c);
            v["context_frontier"] = json!(x);
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    println!(
        "{} as {} runs it: a step of {chunk} new tokens with {context} held, batch 1, TP {}",
        cfg.display_name(),
        runtime.name(),
        shape.tp
    );
    println!();
    let row = |name: &str, b: Option<u64>, note: &str| {
        if let Some(b) = b {
            println!("  {name:<18} {:>12}  {note}", fmt_bytes(b));
        }
    };
    row("weights", Some(step.weights), "");
    row("kv_cache", Some(step.kv_cache), "");
    row("state", Some(step.state), "");
    row(
        "activations",
        Some(step.activations.bytes),
        &format!("the {:?} layer's peak", step.activations.kind).to_lowercase(),
    );
    row("engine_buffers", step.engine_buffers, "");
    row("cuda_graphs", step.cuda_graphs, "given");
    row("communication", step.communication, "given");
    row("autotune", step.autotune, "given");
    row("allocator_reserve", step.allocator_reserve, "given");
    row("context", step.context, "given");
    row("other_process", step.other_process, "given");
    row("total", Some(step.total), "");
    if let (Some(l), Some((c, x))) = (&step.limit, &frontier) {
        println!();
        println!(
            "Against {}: {} counted, {} ({}).",
            l.limit.describe(),
            fmt_bytes(l.counted),
            if l.fits { "fits" } else { "does not fit" },
            if l.headroom < 0 {
                format!("short by {}", fmt_bytes(l.headroom.unsigned_abs()))
            } else {
                format!("{} to spare", fmt_bytes(l.headroom as u64))
            }
        );
        println!(
            "The frontier: at {context} tokens held, the largest chunk that fits is {} ({}); at a chunk of {chunk}, contexts up to {} fit{}.",
            c.largest_chunk
                .map_or("none".to_string(), |v| v.to_string()),
            c.floor.why,
            x.largest_context
                .map_or("none".to_string(), |v| v.to_string()),
            if x.capped { " (the search's cap)" } else { "" }
        );
    }
    Ok(0)
}
