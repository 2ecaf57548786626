//! `vramtrace model MODEL.gguf --runtime llama.cpp`: what llama.cpp allocates on the GPU for a
//! GGUF and its flags (`models/src/engine/llama_cpp.rs`), from the file's header alone.

use std::path::Path;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use vramtrace_models::engine::llama_cpp::{
    FillCeiling, FillShape, LlamaCppContext, boot_buffers, compute_buffer, fill_ceiling,
    is_quantized, pool_mapped,
};
use vramtrace_models::gguf::{GgufHeader, ggml_type_by_name};
use vramtrace_models::units::{fmt_bytes, parse_bytes};

/// llama.cpp's flags as `vramtrace model` takes them (its own spellings: `-c`, `-ub`, `-b`,
/// `--cache-type-k`, `--cache-type-v`, `--flash-attn`).
#[derive(clap::Args, Debug, Clone, Default)]
#[command(next_help_heading = "llama.cpp (a GGUF as the model, --runtime llama.cpp)")]
pub struct LlamaArgs {
    /// `-c`: the context in tokens (llama.cpp's default is the model's training context; here
    /// it must be given).
    #[arg(short = 'c', long = "ctx-size", value_name = "N")]
    pub ctx_size: Option<u64>,
    /// `-ub`: the physical batch, the tokens of one pass through the model (default 512).
    #[arg(long = "ubatch-size", value_name = "U")]
    pub ubatch_size: Option<u64>,
    /// `-b`: the logical batch (default 2048).
    #[arg(short = 'b', long = "batch-size", value_name = "B")]
    pub batch_size: Option<u64>,
    /// The K cache's type (f16, q8_0, q4_0, ...; default f16).
    #[arg(long = "cache-type-k", value_name = "TYPE")]
    pub cache_type_k: Option<String>,
    /// The V cache's type (default f16).
    #[arg(long = "cache-type-v", value_name = "TYPE")]
    pub cache_type_v: Option<String>,
    /// `-fa on`: flash attention.
    #[arg(long = "flash-attn")]
    pub flash_attn: bool,
    /// llama.cpp's own compute buffer (its `CUDA0 compute buffer size` line, in bytes or with a
    /// unit), for a graph the model does not place (a hybrid other than qwen35, or a qwen35
    /// setting it refuses); the levers still predict their own.
    #[arg(long = "compute-buffer", value_name = "BYTES")]
    pub compute_buffer: Option<String>,
}

/// What a llama.cpp process holds besides its buffers when `--known context=` does not say: its
/// CUDA context, cuBLAS's handles and the kernel modules it loaded, as the calibration run on the
/// H200 measured it (f16 weights, no flash attention; 623 MB with Q4_K_M and flash attention,
/// which never call cuBLAS; docs/validation.md, "llama.cpp's fill ceiling").
const DEFAULT_CONTEXT: u64 = 692_371_456;

/// One change of the flags and its fill ceiling.
struct Lever {
    name: String,
    n_ubatch: u64,
    /// Only `-ub` changed (a candidate for the best `-ub`).
    ubatch_only: bool,
    fill: FillCeiling,
}

fn empty_fill(n_ctx: u64) -> FillCeiling {
    FillCeiling {
        boot_bytes: 0,
        cublas_workspace_bytes: 0,
        outside_bytes: 0,
        pool_bytes: 0,
        fill_tokens: 0,
        max_prompt_tokens: n_ctx,
        boots: false,
    }
}

/// Each of llama.cpp's levers one step from the flags, with its fill ceiling on `limit`: `-ub`
/// from 64 to 4096, flash attention switched, the caches in q8_0 and q4_0 (flash attention on:
/// a quantized V cache needs it), and half the context. A lever the model cannot place (a
/// hybrid's compute buffer in a setting `compute_buffer` refuses) is left out, with its name and
/// why, in the second list.
fn levers(
    header: &GgufHeader,
    ctx: &LlamaCppContext,
    shape: &FillShape,
    batch: u64,
    limit: u64,
    outside: u64,
) -> (Vec<Lever>, Vec<(String, String)>) {
    let (mut out, mut left_out) = (Vec::new(), Vec::new());
    let mut push = |name: String, n_ubatch: u64, ubatch_only: bool, fill| match fill {
        Ok(fill) => out.push(Lever {
            name,
            n_ubatch,
            ubatch_only,
            fill,
        }),
        Err(e) => left_out.push((name, format!("{e}"))),
    };
    for ub in [64u64, 128, 256, 512, 1024, 2048, 4096] {
        if ub == shape.n_ubatch {
            continue;
        }
        let s = FillShape {
            n_ubatch: ub,
            ..*shape
        };
        push(
            format!("-ub {ub} -b {}", batch.max(ub)),
            ub,
            true,
            fill_ceiling(header, ctx, &s, batch.max(ub), limit, outside, None),
        );
    }
    let fa = FillShape {
        flash_attn: !shape.flash_attn,
        ..*shape
    };
    // Without flash attention llama.cpp refuses a quantized V cache.
    if !(shape.flash_attn && is_quantized(ctx.type_v)) {
        push(
            format!("-fa {}", if shape.flash_attn { "off" } else { "on" }),
            shape.n_ubatch,
            false,
            fill_ceiling(header, ctx, &fa, batch, limit, outside, None),
        );
    }
    for t in ["q8_0", "q4_0"] {
        let id = ggml_type_by_name(t).expect("a ggml type");
        if ctx.type_k == id && ctx.type_v == id {
            continue;
        }
        let c = LlamaCppContext {
            type_k: id,
            type_v: id,
            ..ctx.clone()
        };
        let s = FillShape {
            flash_attn: true,
            ..*shape
        };
        push(
            format!("-fa on -ctk {t} -ctv {t}"),
            shape.n_ubatch,
            false,
            fill_ceiling(header, &c, &s, batch, limit, outside, None),
        );
    }
    let half = LlamaCppContext {
        n_ctx: (ctx.n_ctx / 2).max(256),
        ..ctx.clone()
    };
    push(
        format!("-c {}", half.n_ctx),
        shape.n_ubatch,
        false,
        fill_ceiling(header, &half, shape, batch, limit, outside, None),
    );
    (out, left_out)
}

/// `-ub` is llama.cpp's spelling of the physical batch: one dash, two letters, which a command
/// line parser reads as `-u -b`. It is taken as `--ubatch-size` before parsing.
pub fn spell_ubatch(args: impl Iterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    args.map(|a| {
        if a == "-ub" {
            "--ubatch-size".into()
        } else {
            a
        }
    })
    .collect()
}

fn cache_type(name: Option<&str>, flag: &str) -> anyhow::Result<u32> {
    let name = name.unwrap_or("f16");
    ggml_type_by_name(&name.to_ascii_lowercase()).with_context(|| {
        format!(
            "{flag} {name}: not a ggml type (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl)"
        )
    })
}

/// Runs `vramtrace model MODEL.gguf --runtime llama.cpp`.
pub fn run(
    gguf: &Path,
    a: &LlamaArgs,
    limit: Option<&str>,
    known: &[String],
    json: bool,
) -> anyhow::Result<i32> {
    let Some(n_ctx) = a.ctx_size else {
        bail!("a GGUF model needs -c N (--ctx-size): the context llama.cpp makes");
    };
    if n_ctx == 0 {
        bail!("-c 0: llama.cpp would take the model's training context; give it as a number");
    }
    let header = GgufHeader::read(gguf)?;
    let ctx = LlamaCppContext {
        n_ctx,
        type_k: cache_type(a.cache_type_k.as_deref(), "--cache-type-k")?,
        type_v: cache_type(a.cache_type_v.as_deref(), "--cache-type-v")?,
    };
    let b = boot_buffers(&header, &ctx)?;
    let ubatch = a.ubatch_size.unwrap_or(512);
    let batch = a.batch_size.unwrap_or(2048);
    let limit = limit.map(parse_bytes).transpose().context("--limit")?;
    let given_compute = a
        .compute_buffer
        .as_deref()
        .map(parse_bytes)
        .transpose()
        .context("--compute-buffer")?;
    let compute = match given_compute {
        Some(c) => c,
        None => compute_buffer(&header, &ctx, ubatch.min(batch), a.flash_attn)?,
    };
    let boot = b.model_buffer_bytes + b.kv_cache_bytes + b.rs_bytes + compute;
    let parts = crate::commands::model_step::known_parts(known)?;
    let outside_given = parts.context.is_some() || parts.other_process.is_some();
    let outside = parts.context.unwrap_or(DEFAULT_CONTEXT) + parts.other_process.unwrap_or(0);
    let shape = FillShape {
        n_ubatch: ubatch.min(batch),
        flash_attn: a.flash_attn,
        n_sm: 132,
    };
    let ceiling = match limit {
        Some(l) => Some(fill_ceiling(
            &header,
            &ctx,
            &shape,
            batch,
            l,
            outside,
            Some(compute),
        )?),
        None => None,
    };
    let full_pool = pool_mapped(&header, &ctx, &shape, b.kv_cells.saturating_sub(4))?;
    let (levers, levers_left_out) = match limit {
        Some(l) => levers(&header, &ctx, &shape, batch, l, outside),
        None => (Vec::new(), Vec::new()),
    };
    let best_ubatch = levers
        .iter()
        .filter(|x| x.ubatch_only)
        .chain(std::iter::once(&Lever {
            name: String::new(),
            n_ubatch: shape.n_ubatch,
            ubatch_only: true,
            fill: ceiling.clone().unwrap_or_else(|| empty_fill(n_ctx)),
        }))
        .filter(|x| x.fill.boots)
        .max_by_key(|x| (x.fill.fill_tokens, x.n_ubatch))
        .map(|x| x.n_ubatch);
    let mut out: Value = json!({
        "runtime": "llama.cpp",
        "model": gguf.display().to_string(),
        "architecture": header.architecture(),
        "n_ctx": n_ctx,
        "n_ubatch": ubatch,
        "n_batch": batch,
        "flash_attn": a.flash_attn,
        "weights_bytes": b.model_buffer_bytes,
        "host_weights_bytes": b.host_model_bytes,
        "kv_cache_bytes": b.kv_cache_bytes,
        "kv_cells": b.kv_cells,
        "layers": b.layers,
        "recurrent_state_bytes": b.rs_bytes,
        "compute_buffer_bytes": compute,
        "compute_buffer_basis": if given_compute.is_some() { "given" } else { "predicted" },
        "boot_bytes": boot,
        "pool_at_full_bytes": full_pool,
        "outside_bytes": outside,
        "outside_basis": if outside_given { "given" } else { "default" },
        "limit_bytes": limit,
        "boot_fits": limit.map(|l| boot + outside <= l),
        "frontier": match &ceiling {
            Some(c) => json!({
                "fill_tokens": c.fill_tokens,
                "max_prompt_tokens": c.max_prompt_tokens,
                "pool_bytes": c.pool_bytes,
                "cublas_workspace_bytes": c.cublas_workspace_bytes,
                "fills_the_context": c.fill_tokens == c.max_prompt_tokens,
            }),
            None => json!({"fill_tokens": Value::Null, "why": "give --limit BYTES (the card, or what is free when llama.cpp starts)"}),
        },
    });
    if limit.is_some() {
        out["best_ubatch"] = json!(best_ubatch);
        out["levers"] = levers
            .iter()
            .map(|x| {
                json!({
                    "lever": x.name,
                    "boots": x.fill.boots,
                    "fill_tokens": x.fill.fill_tokens,
                    "max_prompt_tokens": x.fill.max_prompt_tokens,
                    "boot_bytes": x.fill.boot_bytes,
                })
            })
            .collect();
        if !levers_left_out.is_empty() {
            out["levers_left_out"] = levers_left_out
                .iter()
                .map(|(lever, why)| json!({"lever": lever, "why": why}))
                .collect();
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(0);
    }
    println!(
        "llama.cpp, {} ({}), -c {n_ctx} -ub {ubatch}{}",
        gguf.display(),
        header.architecture().unwrap_or("?"),
        if a.flash_attn { " -fa on" } else { "" }
    );
    println!(
        "  model buffer (CUDA0)   {:>12}   every tensor but token_embd, each padded to 128 B",
        fmt_bytes(b.model_buffer_bytes)
    );
    println!(
        "  model on the host      {:>12}   token_embd.weight (llama.cpp keeps the input layer there)",
        fmt_bytes(b.host_model_bytes)
    );
    println!(
        "  KV cache (CUDA0)       {:>12}   {} cells (-c padded to 256) over {} attention layers",
        fmt_bytes(b.kv_cache_bytes),
        b.kv_cells,
        b.layers.attention
    );
    if b.rs_bytes > 0 {
        println!(
            "  recurrent state (CUDA0) {:>11}   conv and SSM state of {} Gated DeltaNet layers (f32, one sequence)",
            fmt_bytes(b.rs_bytes),
            b.layers.recurrent
        );
    }
    if given_compute.is_some() {
        println!(
            "  compute buffer (CUDA0) {:>12}   given (--compute-buffer)",
            fmt_bytes(compute)
        );
    } else {
        println!(
            "  compute buffer (CUDA0) {:>12}   the prompt graph of {} tokens as ggml's allocator places it",
            fmt_bytes(compute),
            ubatch.min(batch).min(b.kv_cells)
        );
    }
    println!("  at start               {:>12}", fmt_bytes(boot));
    println!(
        "  VMM pool at a full fill {:>10}   the largest op's scratch{} (2 MiB pieces, never unmapped)",
        fmt_bytes(full_pool),
        if a.flash_attn {
            ": the weight matmuls', whatever the fill"
        } else {
            ": the f16 copy of the scores over the filled context"
        }
    );
    if let (Some(l), Some(c)) = (limit, &ceiling) {
        println!(
            "  against {}, with {} held besides ({}){}:",
            fmt_bytes(l),
            fmt_bytes(outside),
            if outside_given {
                "given"
            } else {
                "default, measured on the H200: the CUDA context, cuBLAS's handles, kernel modules; give --known context=BYTES"
            },
            if c.cublas_workspace_bytes > 0 {
                format!(
                    " and ggml's cuBLAS workspace of {}",
                    fmt_bytes(c.cublas_workspace_bytes)
                )
            } else {
                String::new()
            }
        );
        if !c.boots {
            println!("  llama.cpp cannot make this context: its buffers at start do not fit");
        } else if c.fill_tokens == c.max_prompt_tokens {
            println!(
                "  the whole context fills: a prompt of {} tokens (-c padded less 4), the pool at {}",
                c.fill_tokens,
                fmt_bytes(c.pool_bytes)
            );
        } else {
            println!(
                "  it boots, but fills only {} of {} tokens: past them the pool needs more than the card has (fill ceiling)",
                c.fill_tokens, c.max_prompt_tokens
            );
        }
        println!();
        if !levers.is_empty() || !levers_left_out.is_empty() {
            println!("  levers (one at a time):");
        }
        for x in &levers {
            println!(
                "    {:<40} {}",
                x.name,
                if !x.fill.boots {
                    "cannot make the context".to_string()
                } else if x.fill.fill_tokens == x.fill.max_prompt_tokens {
                    format!("fills all {} tokens", x.fill.max_prompt_tokens)
                } else {
                    format!(
                        "fills {} of {} tokens",
                        x.fill.fill_tokens, x.fill.max_prompt_tokens
                    )
                }
            );
        }
        for (name, why) in &levers_left_out {
            println!("    {name:<40} left out: {why}");
        }
        if let Some(u) = best_ubatch {
            println!("  the -ub that fills the most: {u} (ties to the larger, the faster prefill)");
        }
    }
    Ok(0)
}
