//! `report --model MODEL.gguf` on a llama.cpp trace: the buffers llama.cpp makes and its VMM
//! pool, predicted from the GGUF's header and the flags the traced process was started with
//! (`models/src/engine/llama_cpp.rs`), set beside what the trace holds at the report's moment.

use serde::Serialize;
use vramtrace_models::engine::llama_cpp::{
    FillShape, LlamaCppContext, boot_buffers, compute_buffer, pool_mapped,
};
use vramtrace_models::gguf::{GgufHeader, ggml_type_by_name};
use vramtrace_models::{Category, ModelError};

use crate::replay::Pool;
use crate::report::{Attached, Report};

/// llama.cpp's flags as a process's command line gives them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LlamaFlags {
    /// `-c` (llama-bench: `-p` + `-n`); the model's training context when absent.
    pub n_ctx: u64,
    /// `-ub` (default 512).
    pub n_ubatch: u64,
    /// `-b` (default 2048).
    pub n_batch: u64,
    /// `-fa` (on for `auto`: the CUDA backend takes it).
    pub flash_attn: bool,
    /// `-ctk`, `-ctv` by name (f16 by default).
    pub cache_types: (String, String),
    /// The prompt's tokens, when the command line says (llama-bench's `-p`).
    pub prompt_tokens: Option<u64>,
}

/// One part, predicted and seen.
#[derive(Debug, Clone, Serialize)]
pub struct LlamaRow {
    /// The buffer.
    pub part: &'static str,
    /// From the header and the flags (`None`: not modelled, the basis says why).
    pub predicted: Option<u64>,
    /// In the trace, at the report's moment (the pool: its highest mapping).
    pub observed: Option<u64>,
    /// What the prediction rests on.
    pub basis: String,
}

/// The view.
#[derive(Debug, Clone, Serialize)]
pub struct LlamaCppView {
    /// The GGUF.
    pub gguf: String,
    /// The process it is set beside (its pid).
    pub pid: u32,
    /// The flags read from its command line.
    pub flags: LlamaFlags,
    /// Model buffer, KV cache, the recurrent state (hybrids), compute buffer, VMM pool.
    pub rows: Vec<LlamaRow>,
    /// For a trace made by `vramtrace attach`: what was made before it, which the trace cannot
    /// hold, set against what NVML saw the process hold at the attach.
    pub before_attach: Option<String>,
}

/// The value of the first of `names` on `argv`.
fn value<'a>(argv: &'a [String], names: &[&str]) -> Option<&'a str> {
    argv.windows(2)
        .find(|w| names.contains(&w[0].as_str()))
        .map(|w| w[1].as_str())
}

/// Reads llama.cpp's flags from a command line (llama-cli, llama-completion, llama-server,
/// llama-bench), with llama.cpp's defaults.
pub fn flags(argv: &[String], header: &GgufHeader) -> Result<LlamaFlags, String> {
    let num = |names: &[&str]| -> Result<Option<u64>, String> {
        value(argv, names)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| format!("{} {v:?} is not a number", names[0]))
            })
            .transpose()
    };
    let bench = argv
        .first()
        .is_some_and(|a| a.rsplit('/').next().is_some_and(|n| n.contains("bench")));
    let prompt = if bench {
        num(&["-p", "--n-prompt"])?
    } else {
        None
    };
    let n_ctx = match (num(&["-c", "--ctx-size"])?, prompt) {
        (Some(c), _) if c > 0 => c,
        (_, Some(p)) => p + num(&["-n", "--n-gen"])?.unwrap_or(0),
        _ => header.arch_int("context_length").ok_or_else(|| {
            "no -c on the command line and no context_length in the GGUF".to_string()
        })?,
    };
    let fa = match value(argv, &["-fa", "--flash-attn"]) {
        None | Some("auto" | "on" | "1" | "true") => true,
        Some("off" | "0" | "false") => false,
        Some(other) => return Err(format!("-fa {other:?}: not on, off or auto")),
    };
    let cache = |names: &[&str]| value(argv, names).unwrap_or("f16").to_ascii_lowercase();
    Ok(LlamaFlags {
        n_ctx,
        n_ubatch: num(&["-ub", "--ubatch-size"])?.unwrap_or(512),
        n_batch: num(&["-b", "--batch-size"])?.unwrap_or(2048),
        flash_attn: fa,
        cache_types: (
            cache(&["-ctk", "--cache-type-k"]),
            cache(&["-ctv", "--cache-type-v"]),
        ),
        prompt_tokens: prompt,
    })
}

/// The view for `header` beside the report's process that ran llama.cpp (its command line names
/// a `.gguf`), or why none can be made. `attached`: the trace was made by `vramtrace attach`.
pub fn view(
    r: &Report,
    gguf: &std::path::Path,
    header: &GgufHeader,
    attached: Option<&Attached>,
) -> Result<LlamaCppView, String> {
    let (process, p) = r
        .summary
        .processes
        .iter()
        .enumerate()
        .find(|(_, p)| p.command.iter().any(|a| a.ends_with(".gguf")))
        .ok_or("no traced process was started with a .gguf on its command line")?;
    let f = flags(&p.command, header)?;
    let ty = |name: &str| {
        ggml_type_by_name(name).ok_or_else(|| format!("cache type {name:?} is not a ggml type"))
    };
    let ctx = LlamaCppContext {
        n_ctx: f.n_ctx,
        type_k: ty(&f.cache_types.0)?,
        type_v: ty(&f.cache_types.1)?,
    };
    let err = |e: ModelError| e.to_string();
    let boot = boot_buffers(header, &ctx).map_err(err)?;
    let ub = f.n_ubatch.min(f.n_batch);
    // The hybrids' graph is not placed: their compute row says so.
    let compute = compute_buffer(header, &ctx, ub, f.flash_attn);
    let filled = f.prompt_tokens.unwrap_or(boot.kv_cells.saturating_sub(4));
    let shape = FillShape {
        n_ubatch: ub,
        flash_attn: f.flash_attn,
        n_sm: 132,
    };
    let pool = pool_mapped(header, &ctx, &shape, filled).map_err(err)?;
    // The report's moment on this process's device, and its pool of mappings.
    let cats = r
        .categories()
        .filter(|(pi, _, _)| *pi == process)
        .map(|(_, _, c)| &c.breakdown);
    let seen = |c: Category| cats.map(|b| b.bytes(c));
    let mapped = p
        .devices
        .iter()
        .flat_map(|d| &d.other_pools)
        .find(|x| x.pool == Pool::Mapped)
        .map(|x| x.peak_bytes);
    let mut rows = vec![
        LlamaRow {
            part: "model buffer",
            predicted: Some(boot.model_buffer_bytes),
            observed: seen(Category::Weights),
            basis: "every tensor but token_embd, each padded to 128 B".into(),
        },
        LlamaRow {
            part: "KV cache",
            predicted: Some(boot.kv_cache_bytes),
            observed: seen(Category::KvCache),
            basis: format!(
                "{} cells in {}/{} over {} attention layers",
                boot.kv_cells, f.cache_types.0, f.cache_types.1, boot.layers.attention
            ),
        },
        LlamaRow {
            part: "compute buffer",
            observed: seen(Category::Activations),
            basis: match &compute {
                Ok(_) => format!("the prompt graph of {ub} tokens as ggml's allocator places it"),
                Err(e) => e.to_string(),
            },
            predicted: compute.ok(),
        },
        LlamaRow {
            part: "VMM pool (highest mapping)",
            predicted: Some(pool),
            observed: mapped,
            basis: format!(
                "the largest op's scratch over a fill of {filled} tokens{}{}",
                if f.prompt_tokens.is_some() {
                    " (the command line's prompt)"
                } else {
                    " (the whole context: the prompt is not on the command line)"
                },
                if r.failures.iter().any(|x| x.process == process) {
                    "; the run stopped at a failed allocation, with what the trace shows mapped (`vramtrace model --limit` gives the fill ceiling)"
                } else {
                    ""
                }
            ),
        },
    ];
    if boot.rs_bytes > 0 {
        rows.insert(
            2,
            LlamaRow {
                part: "recurrent state",
                predicted: Some(boot.rs_bytes),
                observed: seen(Category::State),
                basis: format!(
                    "the conv and SSM state of {} Gated DeltaNet layers, f32, one sequence",
                    boot.layers.recurrent
                ),
            },
        );
    }
    let before_attach = attached
        .filter(|a| a.pid == p.pid)
        .map(|a| before_attach(&mut rows, a));
    Ok(LlamaCppView {
        gguf: gguf.display().to_string(),
        pid: p.pid,
        flags: f,
        rows,
        before_attach,
    })
}

/// llama.cpp makes its model, cache and compute buffers at start: in a trace begun by an attach
/// they are absent, not empty. Their rows say so, and the sentence returned sets their
/// predicted sum against what NVML saw the process hold at the attach (the rest is the CUDA
/// context, cuBLAS and the pool).
fn before_attach(rows: &mut [LlamaRow], a: &Attached) -> String {
    let mut made = 0;
    for row in rows.iter_mut().filter(|r| !r.part.starts_with("VMM pool")) {
        if row.observed == Some(0) {
            row.observed = None;
            row.basis
                .push_str("; made before the attach, so not in the trace");
            made += row.predicted.unwrap_or(0);
        }
    }
    let held = match a.process_bytes {
        Some(b) => format!(
            "NVML saw it hold {} then",
            vramtrace_models::units::fmt_bytes(b)
        ),
        None => "NVML did not say what it held then".to_string(),
    };
    format!(
        "The trace begins at `vramtrace attach` (pid {}): {held}; the buffers predicted as made before it sum to {}.",
        a.pid,
        vramtrace_models::units::fmt_bytes(made)
    )
}
