//! `vramtrace model`: predicted tensors, peak, sweep and cliff for a model's `config.json`.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use vramtrace::cliff::{cliff_tokens, default_step, largest_peak_at, peaks_at};
use vramtrace::parse::parse_range;
use vramtrace_models::engine::transformers_5::GenerateChunked;

use vramtrace_models::units::{ByteUnit, fmt_bytes, parse_bytes};
use vramtrace_models::{
    DType, Kernel, Limit, ModelConfig, Tensor, Variant, WeightFormat, Workload, WorkloadOptions,
    gdn_state_per_seq, kv_cache_per_token, naive_sum, peak, replay, rounding, weight_bytes,
};

const VARIANTS_HELP: &str = "\
Variants (each read from one upstream version; never blended):
  GDN chunk forward (--kernel gdn):
    vllm-0.20.1  (default) vLLM 0.20.1 vendored fla: vllm/model_executor/layers/fla/ops/chunk.py;
                 fp32 A from chunk_scaled_dot_kkt.py:144 freed after solve_tril.py:539 makes Ai;
                 q/k keep the key heads; o = torch.empty_like(v) at chunk_o.py:161
    vllm-0.10.2  vLLM 0.10.2 vendored fla as models/qwen3_next.py calls it: in-kernel l2norm
                 copies of q and k, fp32 Ad [T,H,16] inside solve_tril.py
    fla-0.6.0    flash-linear-attention 0.6.0 (fla-core wheel): fla/ops/gated_delta_rule/chunk.py,
                 chunk_fwd.py fused kkt+solve_tril (one A in the input dtype), wy_fast.py,
                 common/chunk_delta_h.py, common/chunk_o.py
    fla-0.4.2    flash-linear-attention v0.4.2 (ca910f88): unfused fp32 A then Ai; no grouped
                 value heads (q/k repeated to HV heads by the caller)
  FlashAttention-2 varlen forward (--kernel fa):
    fa-2.8.3     (default) Dao-AILab v2.8.3 csrc/flash_attn/flash_api.cpp mha_varlen_fwd:
                 softmax_lse [H, total_q] fp32, as since v2.6.0
    fa-2.5.9     Dao-AILab v2.5.9: softmax_lse [B, H, max_seqlen_q] (padded by the query side)
    pytorch      PyTorch's copy behind aten::_flash_attention_forward (flash_attn/flash_api.cpp)
  MLP (--kernel ffn):
    vllm-0.20.1-mlp  vLLM 0.20.1 models/qwen2_moe.py Qwen2MoeMLP.forward (the dense MLP of
                 qwen3_5.py / qwen3_next.py), eager: gate_up [T,2I], act [T,I], down [T,hidden]
max_seqlen_k never sizes softmax_lse in any of them; it only feeds the split-KV heuristic of the
decode path (one query token with GQA), which adds softmax_lse_accum and out_accum.";

/// Arguments of `vramtrace model`.
#[derive(clap::Args, Debug)]
#[command(after_long_help = VARIANTS_HELP, after_help = VARIANTS_HELP)]
pub struct ModelArgs {
    /// Path to the model's config.json (multimodal configs: its text_config is read), or a GGUF
    /// for llama.cpp (`--runtime llama.cpp`).
    pub config: PathBuf,
    /// Which kernel, variant and batch.
    #[command(flatten)]
    pub select: KernelArgs,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Print the peak against tokens for T0..T1 (one sequence of T tokens).
    #[arg(long, value_name = "T0..T1")]
    pub sweep: Option<String>,
    /// Token step of --sweep (default: a multiple of 64 giving about 32 rows).
    #[arg(long)]
    pub step: Option<u64>,
    /// Bytes available to the process (e.g. 24GiB); with --resident, names the cliff.
    #[arg(long, requires = "resident")]
    pub capacity: Option<String>,
    /// Bytes already held when the kernel runs (weights, KV pool, other activations).
    #[arg(long, requires = "capacity")]
    pub resident: Option<String>,
    /// Weight format: bf16, fp8, int4 or int4:GROUP (default bf16; with --context, the
    /// runtime's own: bf16, or int4 for the reference workload).
    #[arg(long)]
    pub weights: Option<String>,
    /// The whole-step model (`--context`): every part of one serving step and its frontier.
    #[command(flatten)]
    pub whole: crate::commands::model_step::StepArgs,
    /// llama.cpp's flags, for a GGUF.
    #[command(flatten)]
    pub llama: crate::commands::model_llama::LlamaArgs,
}

/// Which kernel, variant and batch to model: shared by `vramtrace model` and `vramtrace compare`.
#[derive(clap::Args, Debug, Clone)]
pub struct KernelArgs {
    /// Which kernel to model: gdn, fa, ffn or all.
    #[arg(long, default_value = "all", value_parser = ["gdn", "fa", "ffn", "all"])]
    pub kernel: String,
    /// A variant by name (see the list below); implies its kernel.
    #[arg(long)]
    pub variant: Option<String>,
    /// Tokens of one sequence (a prefill chunk); vLLM's max-num-batched-tokens by default.
    #[arg(long, conflicts_with = "seqlens")]
    pub tokens: Option<u64>,
    /// Tokens of each packed sequence, comma-separated (varlen batch).
    #[arg(long, value_delimiter = ',')]
    pub seqlens: Option<Vec<u64>>,
    /// Tensor-parallel degree: heads and the MLP width are divided by it.
    #[arg(long, default_value_t = 1)]
    pub tp: u64,
    /// Activation dtype (default: the config's torch_dtype).
    #[arg(long)]
    pub dtype: Option<String>,
    /// max_seqlen_k passed to FlashAttention (default: the longest sequence).
    #[arg(long)]
    pub max_seqlen_k: Option<u64>,
    /// Streaming multiprocessors, for FlashAttention's split-KV heuristic (H200: 132, 3090: 82).
    #[arg(long, default_value_t = 132)]
    pub num_sms: u64,
    /// Override use_qk_l2norm_in_kernel for the GDN variants (default: what each version's
    /// Qwen3-Next layer passes).
    #[arg(long)]
    pub l2norm_in_kernel: Option<bool>,
    /// Override the config's GDN value heads (linear_num_value_heads).
    #[arg(long, help_heading = "Shape overrides")]
    pub value_heads: Option<u64>,
    /// Override the config's GDN key heads (linear_num_key_heads).
    #[arg(long, help_heading = "Shape overrides")]
    pub key_heads: Option<u64>,
    /// Override the config's GDN key head dim (linear_key_head_dim).
    #[arg(long, help_heading = "Shape overrides")]
    pub key_dim: Option<u64>,
    /// Override the config's GDN value head dim (linear_value_head_dim).
    #[arg(long, help_heading = "Shape overrides")]
    pub value_dim: Option<u64>,
    /// Override the config's attention query heads (num_attention_heads).
    #[arg(long, help_heading = "Shape overrides")]
    pub attention_heads: Option<u64>,
    /// Override the config's attention KV heads (num_key_value_heads).
    #[arg(long, help_heading = "Shape overrides")]
    pub kv_heads: Option<u64>,
    /// Override the config's attention head dim (head_dim).
    #[arg(long, help_heading = "Shape overrides")]
    pub head_dim: Option<u64>,
}

impl KernelArgs {
    /// Reads the config, applies the overrides, and returns it with the chosen variants and the
    /// batch options.
    pub fn resolve(
        &self,
        config: &std::path::Path,
    ) -> anyhow::Result<(ModelConfig, Vec<Variant>, WorkloadOptions)> {
        let mut cfg = ModelConfig::from_path(config)?;
        // Overrides obey the same bounds as the config's own counts.
        let set = |field: &mut u64, v: Option<u64>, flag: &str| -> anyhow::Result<()> {
            if let Some(v) = v {
                if !(1..=vramtrace_models::MAX_COUNT).contains(&v) {
                    bail!(
                        "{flag} {v}: give a count from 1 to {}",
                        vramtrace_models::MAX_COUNT
                    );
                }
                *field = v;
            }
            Ok(())
        };
        set(
            &mut cfg.linear_num_value_heads,
            self.value_heads,
            "--value-heads",
        )?;
        set(&mut cfg.linear_num_key_heads, self.key_heads, "--key-heads")?;
        set(&mut cfg.linear_key_head_dim, self.key_dim, "--key-dim")?;
        set(
            &mut cfg.linear_value_head_dim,
            self.value_dim,
            "--value-dim",
        )?;
        set(
            &mut cfg.num_attention_heads,
            self.attention_heads,
            "--attention-heads",
        )?;
        set(&mut cfg.num_key_value_heads, self.kv_heads, "--kv-heads")?;
        set(&mut cfg.head_dim, self.head_dim, "--head-dim")?;
        let variants = self.variants()?;
        let dtype = match &self.dtype {
            Some(d) => d.parse::<DType>().map_err(anyhow::Error::msg)?,
            None => cfg.dtype,
        };
        let seqlens = match (&self.seqlens, self.tokens) {
            (Some(s), _) => s.clone(),
            (None, Some(t)) => vec![t],
            (None, None) => vec![DEFAULT_TOKENS],
        };
        let opts = WorkloadOptions {
            seqlens,
            tp: self.tp,
            dtype,
            max_seqlen_k: self.max_seqlen_k,
            num_sms: self.num_sms,
            l2norm_in_kernel: self.l2norm_in_kernel,
        };
        Ok((cfg, variants, opts))
    }

    /// The variants chosen by `--variant` or `--kernel`.
    pub fn variants(&self) -> anyhow::Result<Vec<Variant>> {
        let args = self;
        if let Some(name) = &args.variant {
            let Some(v) = Variant::from_name(name) else {
                let names: Vec<&str> = Variant::ALL.iter().map(|v| v.name()).collect();
                bail!(
                    "there is no variant {name:?}; choose one of {}",
                    names.join(", ")
                );
            };
            if args.kernel != "all" && args.kernel != v.kernel().to_string() {
                bail!(
                    "variant {name} models the {} kernel, not {}; drop --kernel or pick a {} variant",
                    v.kernel(),
                    args.kernel,
                    args.kernel
                );
            }
            return Ok(vec![v]);
        }
        Ok(match args.kernel.as_str() {
            "gdn" => vec![Variant::default_for(Kernel::Gdn)],
            "fa" => vec![Variant::default_for(Kernel::Fa)],
            "ffn" => vec![Variant::default_for(Kernel::Ffn)],
            _ => vec![
                Variant::default_for(Kernel::Gdn),
                Variant::default_for(Kernel::Fa),
                Variant::default_for(Kernel::Ffn),
            ],
        })
    }
}

/// vLLM's default chunk for hybrid Qwen3-Next models in the field notes (max-num-batched-tokens).
const DEFAULT_TOKENS: u64 = 4128;

/// Runs `vramtrace model`.
pub fn run(args: ModelArgs) -> anyhow::Result<i32> {
    let gguf = args
        .config
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    if gguf || args.whole.runtime == "llama.cpp" {
        if !gguf {
            bail!(
                "--runtime llama.cpp reads the model from its GGUF: give MODEL.gguf, not {}",
                args.config.display()
            );
        }
        return crate::commands::model_llama::run(
            &args.config,
            &args.llama,
            args.whole.limit.as_deref(),
            &args.whole.known,
            args.json,
        );
    }
    let (cfg, variants, opts) = args.select.resolve(&args.config)?;
    let planner_limit = crate::commands::model_step::limit(&args.whole)?;
    if let Some(percent) = args.whole.cb_max_memory_percent {
        let total = match planner_limit {
            Some(Limit::Card { capacity }) => capacity,
            _ => bail!(
                "--cb-max-memory-percent takes the card's total as --limit, without a fraction"
            ),
        };
        let context = crate::commands::model_step::known_context(&args.whole.known)?;
        return crate::commands::model_engine::run_cb(
            cfg,
            total,
            percent,
            args.whole.cb_block_size,
            args.whole.cb_flash_attention,
            context,
            args.json,
        );
    }
    if let (Some(limit), "transformers") = (planner_limit, args.whole.runtime.as_str()) {
        if args.select.tokens.is_none() {
            bail!("--limit with --runtime transformers needs --tokens: the prefill_chunk_size");
        }
        if let Some(layers) = args.whole.layers {
            bail!(
                "--layers {layers} shortens the whole-step model only; the transformers planner runs the config's layers"
            );
        }
        let chunk = opts.seqlens.iter().sum::<u64>();
        let mut planner = GenerateChunked::new(cfg, chunk)?;
        planner.attention = args.whole.attn_implementation.parse()?;
        planner.expandable_segments = args.whole.expandable_segments;
        return crate::commands::model_engine::run(
            planner,
            limit,
            args.whole.context,
            args.whole.prompt_tokens,
            args.whole.calibrate.as_deref(),
            args.json,
        );
    }
    if let (Some(Limit::GpuMemoryUtilization { capacity, fraction }), "vllm-0.20.1") =
        (planner_limit, args.whole.runtime.as_str())
    {
        if let Some(layers) = args.whole.layers {
            bail!(
                "--layers {layers} shortens the whole-step model only; vLLM's planner runs the config's layers"
            );
        }
        let weights = match &args.weights {
            Some(w) => Some(w.parse::<WeightFormat>().map_err(anyhow::Error::msg)?),
            None => None,
        };
        let flags = crate::commands::model_vllm::flags(
            &cfg,
            capacity,
            fraction,
            opts.tp,
            weights,
            &args.whole,
        )?;
        let chunk = args.select.tokens.or(args.whole.max_num_batched_tokens);
        return crate::commands::model_vllm::run(cfg, flags, chunk, args.whole.context, args.json);
    }
    for (flag, given) in [
        (
            "--max-num-batched-tokens",
            args.whole.max_num_batched_tokens.is_some(),
        ),
        ("--max-model-len", args.whole.max_model_len.is_some()),
        ("--max-num-seqs", args.whole.max_num_seqs.is_some()),
        ("--enforce-eager", args.whole.enforce_eager),
        ("--no-cudagraph-estimate", args.whole.no_cudagraph_estimate),
        ("--non-torch", args.whole.non_torch.is_some()),
        ("--enable-prefix-caching", args.whole.enable_prefix_caching),
        (
            "--num-speculative-tokens",
            args.whole.num_speculative_tokens.is_some(),
        ),
        (
            "--mamba-ssm-cache-dtype",
            args.whole.mamba_ssm_cache_dtype.is_some(),
        ),
    ] {
        if given {
            bail!(
                "{flag} is vLLM's planner's: give --runtime vllm-0.20.1 with --limit and --gpu-memory-utilization"
            );
        }
    }
    if args.whole.context.is_none() {
        for (flag, given) in [
            ("--kv-dtype", args.whole.kv_dtype.is_some()),
            ("--block-size", args.whole.block_size.is_some()),
        ] {
            if given {
                bail!("{flag} shapes the whole-step model: give --context");
            }
        }
    }
    if args.whole.calibrate.is_some() {
        bail!("--calibrate calibrates the transformers planner: give --runtime transformers");
    }
    if args.whole.limit.is_some() && args.whole.context.is_none() {
        bail!(
            "--limit with --runtime {} needs --context",
            args.whole.runtime
        );
    }
    if args.whole.context.is_some() {
        let chunk = opts.seqlens.iter().sum::<u64>();
        if args.select.tokens.is_none() {
            bail!("--context needs --tokens: the chunk of new tokens the step prefills");
        }
        let weights = match &args.weights {
            Some(w) => Some(w.parse::<WeightFormat>().map_err(anyhow::Error::msg)?),
            None => None,
        };
        return crate::commands::model_step::run(
            cfg,
            chunk,
            opts.tp,
            weights,
            &args.whole,
            args.json,
        );
    }
    let weights: WeightFormat = args
        .weights
        .as_deref()
        .unwrap_or("bf16")
        .parse()
        .map_err(anyhow::Error::msg)?;

    if let (Some(cap), Some(res)) = (&args.capacity, &args.resident) {
        let cap = parse_bytes(cap).context("--capacity")?;
        let res = parse_bytes(res).context("--resident")?;
        return cliff(&cfg, &variants, &opts, cap, res, args.json);
    }
    if let Some(range) = &args.sweep {
        let (t0, t1) = parse_range(range)?;
        return sweep(&cfg, &variants, &opts, t0, t1, args.step, args.json);
    }

    let workload = Workload::from_config(&cfg, &opts)?;
    let mut runs = Vec::new();
    for v in &variants {
        runs.push((*v, v.tensors(&workload)?));
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json_report(&cfg, &opts, &runs))?
        );
    } else {
        print!("{}", human_report(&cfg, &opts, &runs, weights)?);
    }
    Ok(0)
}

/// The most rows one `--sweep` prints; a finer step over a wide range is refused, not ground
/// through (each row is a full prediction).
pub const MAX_SWEEP_ROWS: u64 = 10_000;

fn sweep(
    cfg: &ModelConfig,
    variants: &[Variant],
    opts: &WorkloadOptions,
    t0: u64,
    t1: u64,
    step: Option<u64>,
    as_json: bool,
) -> anyhow::Result<i32> {
    let step = step.unwrap_or_else(|| default_step(t0, t1));
    if step == 0 {
        bail!("--step must be at least 1");
    }
    // Rows: t0, t0 + step, ... below t1, then t1.
    let rows_wanted = (t1 - t0).div_ceil(step) + 1;
    if rows_wanted > MAX_SWEEP_ROWS {
        bail!(
            "--sweep {t0}..{t1} with --step {step} gives {rows_wanted} rows, more than {MAX_SWEEP_ROWS}; choose a larger --step or a narrower range"
        );
    }
    let mut rows = Vec::new();
    let mut t = t0;
    loop {
        rows.push((t, peaks_at(cfg, variants, opts, t)?));
        if t >= t1 {
            break;
        }
        t = t.saturating_add(step).min(t1);
    }
    if as_json {
        let list: Vec<Value> = rows
            .iter()
            .map(|(t, p)| {
                let per: serde_json::Map<String, Value> = variants
                    .iter()
                    .zip(p)
                    .map(|(v, b)| (v.name().to_string(), json!(b)))
                    .collect();
                json!({"tokens": t, "peak_bytes": p.iter().max(), "per_variant": per})
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"model": cfg.display_name(), "tp": opts.tp, "sweep": list})
            )?
        );
        return Ok(0);
    }
    let mut out = String::new();
    let _ = write!(out, "{:>10}", "tokens");
    for v in variants {
        let _ = write!(out, "  {:>16}", v.name());
    }
    let _ = writeln!(out);
    for (t, p) in &rows {
        let _ = write!(out, "{t:>10}");
        for b in p {
            let _ = write!(out, "  {:>16}", fmt_bytes(*b));
        }
        let _ = writeln!(out);
    }
    print!("{out}");
    Ok(0)
}

fn cliff(
    cfg: &ModelConfig,
    variants: &[Variant],
    opts: &WorkloadOptions,
    capacity: u64,
    resident: u64,
    as_json: bool,
) -> anyhow::Result<i32> {
    let Some(budget) = capacity.checked_sub(resident) else {
        bail!(
            "the resident bytes ({}) already exceed the capacity ({}); nothing fits",
            fmt_bytes(resident),
            fmt_bytes(capacity)
        );
    };
    let peak_of = |t: u64| largest_peak_at(cfg, variants, opts, t);
    let cliff = cliff_tokens(cfg, variants, opts, budget)?;
    let names: Vec<&str> = variants.iter().map(|v| v.name()).collect();
    match cliff {
        Some(t) => {
            let p = peak_of(t)?;
            let below = if t > 1 { peak_of(t - 1)? } else { 0 };
            if as_json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&json!({
                        "model": cfg.display_name(), "variants": names, "tp": opts.tp,
                        "capacity_bytes": capacity, "resident_bytes": resident,
                        "budget_bytes": budget, "cliff_tokens": t,
                        "peak_bytes_at_cliff": p, "peak_bytes_below_cliff": below,
                    }))?
                );
            } else {
                println!(
                    "cliff: {t} tokens. At {t} tokens the peak of {} is {} ({} B), over the {} ({} B) left by capacity {} minus resident {}; at {} tokens it is {} and fits.",
                    names.join(" / "),
                    fmt_bytes(p),
                    p,
                    fmt_bytes(budget),
                    budget,
                    fmt_bytes(capacity),
                    fmt_bytes(resident),
                    t - 1,
                    fmt_bytes(below)
                );
            }
        }
        None => {
            if as_json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&json!({
                        "model": cfg.display_name(), "variants": names, "budget_bytes": budget,
                        "cliff_tokens": Value::Null,
                    }))?
                );
            } else {
                println!(
                    "no cliff below 2^40 tokens: the peak stays within {}",
                    fmt_bytes(budget)
                );
            }
        }
    }
    Ok(0)
}

fn tensor_json(t: &Tensor, kernel: Kernel, variant: Variant) -> Value {
    let r = rounding(t.bytes);
    json!({
        "name": t.name, "shape": t.shape, "dtype": t.dtype, "bytes": t.bytes,
        "alloc_at": t.alloc_at, "freed_at": t.freed_at,
        "lifetime": if t.freed_at.is_some() { "freed" } else { "returned" },
        "kernel": kernel, "variant": variant.name(), "source": t.source,
        "block_bytes": r.block, "pool": r.pool, "segment_bytes": r.segment,
    })
}

fn json_report(
    cfg: &ModelConfig,
    opts: &WorkloadOptions,
    runs: &[(Variant, Vec<Tensor>)],
) -> Value {
    let mut all = Vec::new();
    let mut kernels = Vec::new();
    let mut overall = 0;
    for (v, ts) in runs {
        let p = peak(ts);
        overall = overall.max(p.bytes);
        let seg = replay(ts, None);
        let list: Vec<Value> = ts.iter().map(|t| tensor_json(t, v.kernel(), *v)).collect();
        all.extend(list.iter().cloned());
        kernels.push(json!({
            "kernel": v.kernel(), "variant": v.name(), "source": v.source(),
            "tensors": list, "peak_bytes": p.bytes, "peak_step": p.step,
            "peak_live": p.live.iter().map(|&i| ts[i].name.clone()).collect::<Vec<_>>(),
            "naive_sum_bytes": naive_sum(ts),
            "allocator": {"peak_reserved_bytes": seg.peak_reserved, "segments": seg.events},
        }));
    }
    json!({
        "model": cfg.display_name(), "config": cfg.path, "tp": opts.tp, "dtype": opts.dtype,
        "seqlens": opts.seqlens, "max_seqlen_k": opts.max_seqlen_k, "num_sms": opts.num_sms,
        "tensors": all, "peak_bytes": overall,
        "peak_rule": "each kernel call is measured on its own, above its inputs; peak_bytes is the largest of them",
        "kernels": kernels,
    })
}

fn human_report(
    cfg: &ModelConfig,
    opts: &WorkloadOptions,
    runs: &[(Variant, Vec<Tensor>)],
    weights: WeightFormat,
) -> anyhow::Result<String> {
    let mut o = String::new();
    let seq = if opts.seqlens.len() == 1 {
        format!("{} tokens", opts.seqlens[0])
    } else {
        format!(
            "{} sequences ({:?}), {} tokens",
            opts.seqlens.len(),
            opts.seqlens,
            opts.seqlens.iter().map(|&t| u128::from(t)).sum::<u128>()
        )
    };
    let _ = writeln!(
        o,
        "{}: {} layers ({} GDN + {} attention), TP {}, {}, {}",
        cfg.display_name(),
        cfg.num_hidden_layers,
        cfg.num_linear_layers(),
        cfg.num_attention_layers(),
        opts.tp,
        opts.dtype,
        seq
    );
    for (v, ts) in runs {
        let p = peak(ts);
        let _ = writeln!(o, "\n{} — {}", v.name(), v.source());
        let _ = writeln!(
            o,
            "  {:>3}  {:<28} {:<24} {:<9} {:>13} {:>9}  {:>5}  {:>5}  at peak",
            "#", "tensor", "shape", "dtype", "bytes", "MiB", "alloc", "free"
        );
        for (i, t) in ts.iter().enumerate() {
            let _ = writeln!(
                o,
                "  {:>3}  {:<28} {:<24} {:<9} {:>13} {:>9}  {:>5}  {:>5}  {}",
                i,
                t.name,
                t.shape_string(),
                t.dtype.to_string(),
                t.bytes,
                ByteUnit::MiB.number(t.bytes as f64, 2),
                t.alloc_at,
                t.freed_at.map_or("ret".to_string(), |f| f.to_string()),
                if p.live.contains(&i) { "live" } else { "" }
            );
        }
        let _ = writeln!(
            o,
            "  peak: {} B ({}) after step {}, {} tensors live",
            p.bytes,
            fmt_bytes(p.bytes),
            p.step,
            p.live.len()
        );
        let naive = naive_sum(ts);
        if naive > p.bytes {
            let gone: Vec<String> = ts
                .iter()
                .enumerate()
                .filter(|(i, t)| !p.live.contains(i) && t.freed_at.is_some_and(|f| f <= p.step))
                .map(|(_, t)| {
                    let freed = t.freed_at.unwrap_or(0);
                    let next = ts.iter().find(|u| u.alloc_at > freed);
                    match next {
                        Some(n) => format!(
                            "{} ({}) is freed at step {}, before {} is allocated at step {}",
                            t.name,
                            fmt_bytes(t.bytes),
                            freed,
                            n.name,
                            n.alloc_at
                        ),
                        None => format!(
                            "{} ({}) is freed before the peak",
                            t.name,
                            fmt_bytes(t.bytes)
                        ),
                    }
                })
                .collect();
            let _ = writeln!(
                o,
                "  a naive sum of every tensor ({}) over-counts the peak by {}: {}.",
                fmt_bytes(naive),
                fmt_bytes(naive - p.bytes),
                gone.join("; ")
            );
        }
        let seg = replay(ts, None);
        let _ = writeln!(
            o,
            "  PyTorch caching allocator, empty cache: {} reserved in {} segment(s) at most",
            fmt_bytes(seg.peak_reserved),
            seg.events.len()
        );
    }

    let _ = writeln!(o, "\nper-model memory (TP {}):", opts.tp);
    for kv in [DType::BF16, DType::F8] {
        match kv_cache_per_token(cfg, opts.tp, kv) {
            Ok(k) => {
                let _ = writeln!(
                    o,
                    "  KV cache, {}: {} B per token ({} attention layers x {} B)",
                    kv, k.bytes_per_token, k.layers, k.bytes_per_layer
                );
            }
            Err(e) => {
                let _ = writeln!(o, "  KV cache: {e}");
            }
        }
    }
    match gdn_state_per_seq(cfg, opts.tp, opts.dtype, opts.dtype, 0) {
        Ok(s) => {
            let _ = writeln!(
                o,
                "  GDN state per sequence: {} ({} B; conv {:?} + recurrent {:?} {} per layer, {} layers)",
                fmt_bytes(s.bytes_per_seq),
                s.bytes_per_seq,
                s.conv_shape,
                s.ssm_shape,
                s.ssm_dtype,
                s.layers
            );
        }
        Err(e) => {
            let _ = writeln!(o, "  GDN state: {e}");
        }
    }
    let w = weight_bytes(cfg, weights, opts.tp)?;
    let _ = writeln!(
        o,
        "  weights ({:?}, text model, estimated from the config): {} ({} linear + {} other parameters per rank)",
        weights,
        fmt_bytes(w.bytes),
        w.linear_params,
        w.other_params
    );
    Ok(o)
}
