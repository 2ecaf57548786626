//! `vramtrace demo`: the whole tool in one command. Runs the reference workload's model-shaped
//! chunked prefill (Qwen3.6-27B by default) on a 24 GiB card until it runs out of memory,
//! records it, and attributes the failed allocation and the peak to named tensors against the
//! model. With no GPU (or with `--simulate`) the identical allocation sequence runs on the
//! stand-in driver.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::commands::compare::render;
use crate::commands::run::report_exit;
use crate::launch;
use crate::trace_dir::{new_out_dir, prepare_out_dir};
use vramtrace::attribution::{Moment, attribute};
use vramtrace::observe::{At, observe};
use vramtrace::summary::{SummaryOptions, render as render_summary, summarize};
use vramtrace::trace::Trace;
use vramtrace_models::units::{fmt_bytes, parse_bytes};
use vramtrace_models::{ModelConfig, Variant, Workload, WorkloadOptions};

/// The config the demo uses unless told otherwise (shipped in `samples/models/`).
const QWEN36_27B: &str = include_str!("../../../samples/models/Qwen3.6-27B/config.json");
/// The workload binary, expected next to `vramtrace`.
const WORKLOAD: &str = "vramtrace-workload";
/// The name the workload gives the allocation that shrinks a real card to `--capacity`.
const BALLAST: &str = "capacity ballast";

/// Arguments of `vramtrace demo`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Without a GPU the demo runs on vramtrace's stand-in driver (a libcuda.so.1 that keeps\nhost-side books) with the same allocations, so the trace, the failure and the attribution are\nthose of the real workload. With a GPU, the real kernels run and --capacity is enforced by a\nnamed ballast allocation, so the driver itself refuses the allocation that does not fit."
)]
pub struct DemoArgs {
    /// Directory for the trace (default: a new `vramtrace-demo-<time>` directory).
    #[arg(long, short)]
    pub out: Option<PathBuf>,
    /// Run on the stand-in driver even if a GPU is present.
    #[arg(long)]
    pub simulate: bool,
    /// Device memory the run may use, like a smaller card (`24GiB`, `23.5GiB`, `22000MB`).
    #[arg(long, default_value = "24GiB", value_parser = parse_bytes)]
    pub capacity: u64,
    /// Prompt length in tokens (long enough to reach the cliff on the default card).
    #[arg(long, default_value_t = 262_144)]
    pub prompt_tokens: u64,
    /// Prefill chunk (vLLM's max-num-batched-tokens).
    #[arg(long, default_value_t = 4128)]
    pub chunk: u64,
    /// Weight format of the stand-in weights: bf16, fp8 or int4 (a 24 GiB card serves a
    /// 27B model in 4 bits).
    #[arg(long, default_value = "int4")]
    pub weights: String,
    /// A HuggingFace config.json instead of Qwen3.6-27B's.
    #[arg(long, value_name = "CONFIG")]
    pub model: Option<PathBuf>,
}

/// Runs `vramtrace demo`.
pub fn run(args: DemoArgs) -> anyhow::Result<i32> {
    let exe = std::env::current_exe().context("cannot find the vramtrace binary's own path")?;
    let bin_dir = exe.parent().unwrap_or(Path::new(".")).to_path_buf();
    let workload = bin_dir.join(WORKLOAD);
    if !workload.is_file() {
        bail!(
            "{} is missing: build everything with `cargo build --release --workspace` (the demo runs the reference workload next to this binary)",
            workload.display()
        );
    }
    let preload = launch::locate(None)?;
    let out = match &args.out {
        Some(d) => prepare_out_dir(d)?,
        None => new_out_dir("demo".as_ref())?,
    };
    let config = match &args.model {
        Some(p) => std::path::absolute(p)?,
        None => {
            // In a directory named after the model: the model's display name comes from it.
            let dir = out.join("Qwen3.6-27B");
            std::fs::create_dir_all(&dir)?;
            let p = dir.join("config.json");
            std::fs::write(&p, QWEN36_27B)
                .with_context(|| format!("cannot write {}", p.display()))?;
            p
        }
    };
    let cfg = ModelConfig::from_path(&config)?;

    let gpu = !args.simulate && gpu_present();
    let mut env: Vec<(OsString, OsString)> = Vec::new();
    let mut cmd: Vec<OsString> = vec![
        workload.clone().into(),
        "prefill".into(),
        "--config".into(),
        config.clone().into(),
        "--prompt-tokens".into(),
        args.prompt_tokens.to_string().into(),
        "--chunk".into(),
        args.chunk.to_string().into(),
        "--weights".into(),
        args.weights.clone().into(),
        "--capacity".into(),
        args.capacity.to_string().into(),
    ];
    if gpu {
        eprintln!(
            "vramtrace demo: a GPU is present: running the real kernels, limited to {}",
            fmt_bytes(args.capacity)
        );
    } else {
        env = launch::stand_in_env(&out, Some(args.capacity))?;
        cmd.push("--simulate".into());
        eprintln!(
            "vramtrace demo: no GPU{}: the same allocations on the stand-in driver, a {} card",
            if args.simulate {
                " requested"
            } else {
                " found"
            },
            fmt_bytes(args.capacity)
        );
    }
    eprintln!(
        "vramtrace demo: {} prefill of {} tokens in chunks of {}, weights {}; recording into {}",
        cfg.display_name(),
        args.prompt_tokens,
        args.chunk,
        args.weights,
        out.display()
    );
    crate::commands::versions::write(&out, &cmd, &env);
    let started = std::time::Instant::now();
    let status = launch::run_traced(&preload, &out, &cmd, &env, launch::Options { stacks: true })?;
    let code = report_exit(cmd[0].as_os_str(), status);
    eprintln!(
        "vramtrace demo: the workload exited with {code} after {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let trace = Trace::open(&out)?;
    // The workload's frames, named while its binary is here (a trace read elsewhere keeps them).
    if let Err(e) = vramtrace::symbolize::write_stored_symbols(&trace) {
        eprintln!("vramtrace demo: the native frames could not be stored with the trace: {e:#}");
    }
    print!(
        "{}",
        render_summary(
            &summarize(&trace, SummaryOptions { top: 5, frames: 0 })?,
            false
        )
    );
    let mut failure_live: Option<Vec<String>> = None;
    let mut resident = None;
    let mut failed_kernel = None;
    let mut failed_chunk: Option<u64> = None;
    for (at, what) in [
        (At::Failure(0), "the failed allocation"),
        (At::Peak, "the peak"),
    ] {
        let m = match observe(&trace, None, None, at) {
            Ok(m) => m,
            Err(e) => {
                println!("\n{what}: {e}");
                continue;
            }
        };
        let live: Vec<String> = m
            .observed
            .iter()
            .filter(|o| !o.failed)
            .map(|o| o.ptr.clone())
            .collect();
        if m.moment == Moment::Peak && failure_live.as_deref() == Some(&live[..]) {
            println!("\n=== the peak is the moment of the failure: the same live set as above ===");
            continue;
        }
        // The kernel that was running: from the label of the failed request, or of the
        // allocation that set the peak.
        let label = match m.moment {
            Moment::Failure => m
                .observed
                .iter()
                .rev()
                .find(|o| o.failed)
                .and_then(|o| o.label.clone()),
            _ => m
                .observed
                .iter()
                .max_by_key(|o| o.t_ns)
                .and_then(|o| o.label.clone()),
        }
        .unwrap_or_default();
        let Some(variant) = kernel_of(&label) else {
            println!(
                "\n{what} happened outside a modelled kernel ({label:?}); see `vramtrace summary {}`",
                out.display()
            );
            continue;
        };
        let tokens = chunk_tokens(&label, args.prompt_tokens, args.chunk);
        let opts = WorkloadOptions {
            seqlens: vec![tokens],
            tp: 1,
            dtype: cfg.dtype,
            max_seqlen_k: None,
            num_sms: 132,
            // The workload calls GDN as vLLM's layer does: q/k l2-normalised inside the kernel.
            l2norm_in_kernel: Some(true),
        };
        let tensors = variant.tensors(&Workload::from_config(&cfg, &opts)?)?;
        let a = attribute(&tensors, m.observed.clone(), 1, m.moment);
        if m.moment == Moment::Failure {
            failure_live = Some(live);
            // What the kernel had to fit beside: everything live that is not the kernel's own,
            // nor the ballast that stands for the memory a smaller card does not have.
            let ballast: u64 = a
                .observed
                .iter()
                .filter(|o| !o.failed && o.name.as_deref() == Some(BALLAST))
                .map(|o| o.size)
                .sum();
            resident = Some(a.observed_bytes - a.attributed_bytes - ballast);
            failed_kernel = Some((variant, tokens));
            failed_chunk = vramtrace::report::step::chunk_of_label(&label);
        }
        println!("\n=== {what}, against {} ===", variant.name());
        print!(
            "{}",
            render(&m, variant, &cfg.display_name(), &[tokens], &a)
        );
    }
    let cfg_arg = config.display().to_string();
    let dir = out.display();
    // The binary as it can be typed from here, so every line runs as printed.
    let vt = shown_path(&exe);
    println!("\nNext:");
    println!(
        "  {vt} report {dir} --model {cfg_arg} -o {dir}-report   # the verdict, the whole-step model, the levers, the plots"
    );
    println!(
        "  {vt} summary {dir}            # every process, peak and failure, with native stacks"
    );
    println!("  {vt} events {dir} | jq 'select(.kind == \"alloc_failed\")'");
    if let Some((variant, tokens)) = failed_kernel {
        let l2 = if variant.kernel() == vramtrace_models::Kernel::Gdn {
            " --l2norm-in-kernel true"
        } else {
            ""
        };
        println!(
            "  {vt} compare {dir} --model {cfg_arg} --variant {}{l2} --tokens {tokens} --at oom",
            variant.name()
        );
        if let Some(n) = failed_chunk {
            // The whole step that failed against the card, and its frontier: the largest
            // context at this chunk, the largest chunk (vLLM's block floor) at this context.
            println!(
                "  {vt} model {cfg_arg} --tokens {tokens} --context {} --runtime workload --limit {} --block-size {tokens}   # the whole step against the card and its frontier",
                (n + 1) * tokens,
                args.capacity
            );
        } else if let Some(res) = resident {
            // Only the kernel is known: its cliff beside what was held.
            println!(
                "  {vt} model {cfg_arg} --variant {}{l2} --capacity {} --resident {res}   # the kernel's cliff beside the {} held then",
                variant.name(),
                args.capacity,
                vramtrace_models::units::fmt_bytes(res)
            );
        }
    }
    Ok(0)
}

/// `path` relative to the current directory when it lies below it (`target/release/vramtrace`),
/// else whole: a command a user can paste as printed.
fn shown_path(path: &Path) -> String {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| path.strip_prefix(cwd).ok().map(Path::to_path_buf))
        .map(|rel| rel.display().to_string())
        .unwrap_or_else(|| path.display().to_string())
}

/// The modelled kernel a range label is inside, if any.
fn kernel_of(label: &str) -> Option<Variant> {
    if label.contains("chunk_gated_delta_rule") {
        Some(Variant::GdnFla060)
    } else if label.contains("flash_attention") || label.contains("/attention") {
        Some(Variant::FaPytorch)
    } else if label.contains("mlp") {
        Some(Variant::FfnVllm0201)
    } else {
        None
    }
}

/// Tokens of the chunk a label names (`.../chunk.N/...`): the chunk size, or what is left of the
/// prompt for the last one.
fn chunk_tokens(label: &str, prompt: u64, chunk: u64) -> u64 {
    let n = label
        .split('/')
        .find_map(|p| p.strip_prefix("chunk.").and_then(|n| n.parse::<u64>().ok()))
        .unwrap_or(0);
    prompt.saturating_sub(n * chunk).min(chunk).max(1)
}

/// Whether a CUDA driver with at least one device can be loaded in this process.
fn gpu_present() -> bool {
    // Safety: dlopen/dlsym of the system driver; the functions are called with their documented
    // signatures, and the handle is never closed (closing a driver is not safe).
    unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if h.is_null() {
            return false;
        }
        let init = libc::dlsym(h, c"cuInit".as_ptr());
        let count = libc::dlsym(h, c"cuDeviceGetCount".as_ptr());
        if init.is_null() || count.is_null() {
            return false;
        }
        let init: extern "C" fn(u32) -> i32 = std::mem::transmute(init);
        let count: extern "C" fn(*mut i32) -> i32 = std::mem::transmute(count);
        let mut n = 0;
        init(0) == 0 && count(&mut n) == 0 && n > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_pick_the_kernel_and_the_chunk() {
        let l = "prefill/chunk.3/layer.12/gdn/chunk_gated_delta_rule/chunk_fwd_o";
        assert_eq!(kernel_of(l), Some(Variant::GdnFla060));
        assert_eq!(chunk_tokens(l, 20_000, 4128), 4128);
        assert_eq!(
            chunk_tokens(
                "prefill/chunk.4/layer.3/attention/_flash_attention_forward",
                20_000,
                4128
            ),
            20_000 - 4 * 4128
        );
        assert_eq!(
            kernel_of("prefill/chunk.0/layer.0/attention/_flash_attention_forward"),
            Some(Variant::FaPytorch)
        );
        assert_eq!(kernel_of("prefill/weights"), None);
    }
}
