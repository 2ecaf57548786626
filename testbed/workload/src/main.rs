//! `vramtrace-workload`: parse the command line, run one action, exit.

mod cli;

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use serde_json::{Value, json};
use vramtrace_workload::backend::Backend;
use vramtrace_workload::cuda::CudaBackend;
use vramtrace_workload::dump::{self, Role};
use vramtrace_workload::fa::{self, FaApi, FaConfig};
use vramtrace_workload::gdn::{self, GdnConfig, RunTiming};
use vramtrace_workload::prefill::{self, ChunkReport, PrefillPlan, PrefillReport};
use vramtrace_workload::report::Report;
use vramtrace_workload::{DType, Session, annotate, check};

use cli::{Cli, Command, Common, FaArgs, GdnArgs, PrefillArgs, SelfcheckArgs};

/// Gives SIGPIPE back its default action, as `vramtrace`'s own `main` does: `vramtrace demo |
/// head -1` closes the pipe this program prints its report into, and Rust's runtime ignores
/// SIGPIPE before `main`, so the next `println!` would panic ("failed printing to stdout").
/// With the default action the program ends the way `cat` does; it has nothing to flush or undo.
fn restore_sigpipe() {
    // Safety: `signal` with a valid signal number and `SIG_DFL` has no other precondition, and
    // it runs first in `main`, before any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Exit status of a prefill that ran out of device memory (2 is for usage and
/// other errors).
const EXIT_OUT_OF_MEMORY: u8 = 3;

fn main() -> ExitCode {
    restore_sigpipe();
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Gdn(a) => gdn_command(a),
        Command::Fa(a) => fa_command(a),
        Command::Selfcheck(a) => selfcheck_command(a),
        Command::Prefill(a) => prefill_command(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Device `device` for `--simulate` (driver calls only), or with the kernels
/// compiled for `dtype`.
fn open_backend(simulate: bool, device: usize, dtype: DType) -> Result<CudaBackend> {
    Ok(if simulate {
        CudaBackend::simulate(device)?
    } else {
        CudaBackend::real(device, dtype)?
    })
}

fn gdn_config_json(c: &GdnConfig, seed: u64) -> Value {
    json!({
        "tokens": c.tokens(),
        "seqlens": c.seqlens,
        "varlen": c.varlen,
        "heads": c.heads,
        "key_heads": c.key_heads,
        "key_dim": c.key_dim,
        "value_dim": c.value_dim,
        "dtype": c.dtype.name(),
        "scale": c.scale(),
        "qk_l2norm": c.qk_l2norm,
        "initial_state": c.initial_state,
        "chunks": c.chunks(),
        "seed": seed,
    })
}

fn fa_config_json(c: &FaConfig, seed: u64) -> Value {
    json!({
        "seqlens_q": c.seqlens_q,
        "seqlens_k": c.seqlens_k,
        "heads": c.heads,
        "kv_heads": c.kv_heads,
        "head_dim": c.head_dim,
        "dtype": c.dtype.name(),
        "causal": c.causal,
        "scale": c.scale(),
        "padded_lse": c.padded_lse,
        "max_seqlen_q": c.max_seqlen_q(),
        "max_seqlen_k": c.max_seqlen_k(),
        "api": match c.api { FaApi::Torch => "torch", FaApi::FlashAttn => "flash-attn" },
        "preallocated_out": c.preallocated_out,
        "seed": seed,
    })
}

/// What both subcommands do after the run: report, dump, check.
struct Finish<'a> {
    common: &'a Common,
    kernel: &'static str,
    variant: String,
    config: Value,
    roles: fn(&str) -> Role,
}

impl Finish<'_> {
    fn finish(
        &self,
        backend: &CudaBackend,
        session: &Session<'_>,
        outcome: vramtrace_workload::Result<RunTiming>,
        check: impl FnOnce() -> Vec<check::Comparison>,
    ) -> Result<ExitCode> {
        let report = Report {
            kernel: self.kernel,
            variant: self.variant.clone(),
            config: self.config.clone(),
            device: backend.describe(),
            simulated: !backend.executes_kernels(),
            annotated: annotate::available(),
            ledger: session.ledger(),
            timing: outcome.as_ref().copied().unwrap_or_default(),
            stages: session.timings(),
        };
        if let Err(e) = outcome {
            // Show what was allocated up to the failure, then the failure.
            if self.common.json {
                let mut json = report.to_json();
                json["error"] = json!(e.to_string());
                println!("{}", serde_json::to_string_pretty(&json)?);
            } else {
                print!("{}", report.to_text());
            }
            return Err(e.into());
        }
        let mut json = report.to_json();
        if let Some(dir) = &self.common.dump {
            dump::write(
                dir,
                self.kernel,
                &self.config,
                &session.captured(),
                self.roles,
            )
            .with_context(|| format!("dumping to {}", dir.display()))?;
            json["dump"] = json!(dir.display().to_string());
        }
        let mut passed = true;
        let mut check_text = String::new();
        if self.common.check {
            let rows = check();
            let (text, ok) = check::render(
                "check: device tensors against the CPU reference (max abs error)",
                &rows,
            );
            passed = ok;
            check_text = text;
            json["check"] = json!(
                rows.iter()
                    .map(|r| json!({
                        "tensor": r.name,
                        "max_abs_err": r.max_abs_err,
                        "max_ref": r.max_ref,
                        "tolerance": r.tolerance,
                        "passed": r.passed(),
                    }))
                    .collect::<Vec<_>>()
            );
        }
        if self.common.json {
            println!("{}", serde_json::to_string_pretty(&json)?);
        } else {
            print!("{}", report.to_text());
            if let Some(dir) = &self.common.dump {
                println!(
                    "dumped inputs, intermediates and outputs to {}",
                    dir.display()
                );
            }
            if self.common.check {
                print!("\n{check_text}");
            }
        }
        Ok(if passed {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        })
    }
}

fn gdn_command(a: &GdnArgs) -> Result<ExitCode> {
    let cfg = a.config();
    cfg.validate()?;
    let backend = open_backend(a.common.simulate, a.common.device, cfg.dtype)?;
    let host = backend
        .executes_kernels()
        .then(|| gdn::generate_inputs(&cfg, a.common.seed));
    let session = Session::new(&backend, a.common.check || a.common.dump.is_some());
    let outcome = gdn::run(&session, &cfg, host.as_ref());
    let finish = Finish {
        common: &a.common,
        kernel: "gdn",
        variant:
            "fla-0.6.0 chunk_gated_delta_rule (fla-core 0.6.0, chunk 64, fused kkt + solve_tril)"
                .into(),
        config: gdn_config_json(&cfg, a.common.seed),
        roles: |name| match name {
            "q" | "k" | "v" | "g" | "beta" | "initial_state" | "cu_seqlens" => Role::Input,
            "o" | "final_state" => Role::Output,
            _ => Role::Intermediate,
        },
    };
    finish.finish(&backend, &session, outcome, || {
        check::gdn(
            &cfg,
            host.as_ref().expect("--check runs kernels"),
            &session.captured(),
        )
    })
}

fn fa_command(a: &FaArgs) -> Result<ExitCode> {
    let cfg = a.config();
    cfg.validate()?;
    let backend = open_backend(a.common.simulate, a.common.device, cfg.dtype)?;
    let host = backend
        .executes_kernels()
        .then(|| fa::generate_inputs(&cfg, a.common.seed));
    let session = Session::new(&backend, a.common.check || a.common.dump.is_some());
    let outcome = fa::run(&session, &cfg, host.as_ref());
    let variant = match (cfg.api, cfg.padded_lse) {
        (FaApi::Torch, false) => {
            "PyTorch _flash_attention_forward (FlashAttention-2 mha_varlen_fwd, softmax_lse [H, total_q])"
        }
        (FaApi::Torch, true) => {
            "PyTorch _flash_attention_forward with the pre-2.6 padded softmax_lse [B, H, max_seqlen_q]"
        }
        (FaApi::FlashAttn, false) => "flash-attn >= 2.6 varlen_fwd (softmax_lse [H, total_q])",
        (FaApi::FlashAttn, true) => {
            "flash-attn <= 2.5.9 varlen_fwd (padded softmax_lse [B, H, max_seqlen_q])"
        }
    };
    let finish = Finish {
        common: &a.common,
        kernel: "fa",
        variant: variant.into(),
        config: fa_config_json(&cfg, a.common.seed),
        roles: |name| match name {
            "q" | "k" | "v" | "cu_seqlens_q" | "cu_seqlens_k" => Role::Input,
            _ => Role::Output,
        },
    };
    finish.finish(&backend, &session, outcome, || {
        check::fa(
            &cfg,
            host.as_ref().expect("--check runs kernels"),
            &session.captured(),
        )
    })
}

fn prefill_command(a: &PrefillArgs) -> Result<ExitCode> {
    let options = a.options().map_err(anyhow::Error::msg)?;
    let cfg = vramtrace_models::ModelConfig::from_path(&a.config)?;
    let plan = PrefillPlan::new(&cfg, options)?;
    let backend = open_backend(a.simulate, a.device, plan.dtype)?;
    // Right after the context (and, for real runs, the kernel module) exists,
    // before this run holds anything.
    let capacity = prefill::plan_capacity(
        a.capacity.map(|c| c as usize),
        !a.simulate,
        backend.mem_info(),
    )?;
    if let Some(note) = &capacity.note
        && !a.quiet
    {
        eprintln!("prefill: {note}");
    }
    let session = Session::new(&backend, false);
    let chunks = plan.chunks().len();
    let quiet = a.quiet;
    let mut progress = |c: &ChunkReport| {
        if !quiet {
            eprintln!(
                "prefill: chunk {} done ({} of {chunks}): {} tokens, KV cache {}, live {} (chunk peak {}), {:.2} s",
                c.span.index,
                c.span.index + 1,
                c.tokens_done,
                vramtrace_models::units::fmt_bytes(c.kv_cache_bytes as u64),
                vramtrace_models::units::fmt_bytes(c.live_bytes as u64),
                vramtrace_models::units::fmt_bytes(c.peak_bytes as u64),
                c.seconds
            );
        }
    };
    let started = std::time::Instant::now();
    let outcome = prefill::run(&session, &plan, capacity.ballast, &mut progress)?;
    let report = PrefillReport {
        plan: &plan,
        outcome: &outcome,
        config_path: a.config.display().to_string(),
        device: backend.describe(),
        simulated: !backend.executes_kernels(),
        annotated: annotate::available(),
        capacity: &capacity,
        seconds: started.elapsed().as_secs_f64(),
        ledger: a.ledger.then(|| session.ledger()),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        print!("{}", report.to_text());
    }
    Ok(match report.failure_line() {
        Some(line) => {
            eprintln!("error: {line}");
            ExitCode::from(EXIT_OUT_OF_MEMORY)
        }
        None => ExitCode::SUCCESS,
    })
}

/// Small problems covering the kernels' edge cases: partial and single-token
/// chunks, several sequences, grouped heads, K up to 256, l2norm, initial state.
fn gdn_cases(dtype: DType) -> Vec<GdnConfig> {
    let base = GdnConfig {
        seqlens: vec![1, 63, 64, 65, 200],
        varlen: true,
        heads: 4,
        key_heads: 2,
        key_dim: 64,
        value_dim: 48,
        dtype,
        scale: None,
        qk_l2norm: false,
        initial_state: true,
    };
    vec![
        base.clone(),
        GdnConfig {
            seqlens: vec![300],
            varlen: false,
            heads: 3,
            key_heads: 3,
            key_dim: 128,
            value_dim: 128,
            qk_l2norm: true,
            initial_state: false,
            ..base.clone()
        },
        GdnConfig {
            seqlens: vec![130, 7],
            heads: 2,
            key_heads: 1,
            key_dim: 256,
            value_dim: 33,
            scale: Some(0.5),
            ..base
        },
    ]
}

fn fa_cases(dtype: DType) -> Vec<FaConfig> {
    let base = FaConfig::new(&[1, 17, 130, 257], 8, 2, 64, dtype);
    vec![
        base.clone(),
        FaConfig::new(&[5, 100], 8, 2, 128, dtype)
            .with_kv_seqlens(&[300, 100])
            .with_max_seqlen_k(Some(4096)),
        base.clone()
            .with_causal(false)
            .with_padded_lse(true)
            .with_max_seqlen_q(Some(400))
            .with_api(FaApi::FlashAttn),
        FaConfig::new(&[70], 4, 4, 256, dtype),
    ]
}

fn selfcheck_command(a: &SelfcheckArgs) -> Result<ExitCode> {
    let dtypes = match a.dtype {
        Some(d) => vec![d],
        None => vec![DType::BF16, DType::F16, DType::F32],
    };
    let (mut passed, mut total) = (0, 0);
    for dtype in dtypes {
        let backend = CudaBackend::real(a.device, dtype)?;
        println!("{}", backend.describe());
        for (i, cfg) in gdn_cases(dtype).into_iter().enumerate() {
            let host = gdn::generate_inputs(&cfg, 100 + i as u64);
            let session = Session::new(&backend, true);
            gdn::run(&session, &cfg, Some(&host))?;
            let rows = check::gdn(&cfg, &host, &session.captured());
            let (text, ok) = check::render(
                &format!(
                    "gdn {dtype} seqlens={:?} HV={} HK={} K={} V={} l2norm={} h0={}",
                    cfg.seqlens,
                    cfg.heads,
                    cfg.key_heads,
                    cfg.key_dim,
                    cfg.value_dim,
                    cfg.qk_l2norm,
                    cfg.initial_state
                ),
                &rows,
            );
            print!("{text}");
            total += 1;
            passed += ok as usize;
        }
        if dtype == DType::F32 {
            continue; // FlashAttention has no fp32 path.
        }
        for (i, cfg) in fa_cases(dtype).into_iter().enumerate() {
            let host = fa::generate_inputs(&cfg, 200 + i as u64);
            let session = Session::new(&backend, true);
            fa::run(&session, &cfg, Some(&host))?;
            let rows = check::fa(&cfg, &host, &session.captured());
            let (text, ok) = check::render(
                &format!(
                    "fa {dtype} q={:?} k={:?} H={} Hkv={} D={} causal={} padded_lse={}",
                    cfg.seqlens_q,
                    cfg.seqlens_k,
                    cfg.heads,
                    cfg.kv_heads,
                    cfg.head_dim,
                    cfg.causal,
                    cfg.padded_lse
                ),
                &rows,
            );
            print!("{text}");
            total += 1;
            passed += ok as usize;
        }
    }
    println!("selfcheck: {passed}/{total} cases within tolerance");
    Ok(if passed == total {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
