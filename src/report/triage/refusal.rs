//! The refusal at a failure: the limit that was enforced (PyTorch's per-process limit read from
//! its refusal, vLLM's `--gpu-memory-utilization`, a card given with `--capacity`, else the
//! card), the bytes the request lacked against it, the bytes of other processes and of the
//! context inside it, and the caching allocator's reserve.

use vramtrace_models::Limit;

use super::torch_oom::torch_segment_size;
use super::{EnforcedLimit, InsideLimit, TriageOptions, gib};
use crate::categoriser::{Breakdown, Category};
use crate::report::{FailureReport, Report};
use crate::summary::Failure;
use crate::torch_replay::TorchOom;

/// What the triage reads of a refusal, for the whole-step model, the verdict and the levers.
pub(super) struct Refusal<'a> {
    /// The failed request, as `summary` sees it.
    pub(super) failure: &'a Failure,
    /// The device's total bytes.
    pub(super) total: u64,
    /// The limit enforced.
    pub(super) limit: EnforcedLimit,
    /// Bytes the request lacked against it.
    pub(super) shortfall: u64,
    /// Of `other_process` and `context`, the bytes inside the limit.
    pub(super) inside: InsideLimit,
    /// Bytes reserved but not allocated in PyTorch's segments: its own figures when it refused,
    /// else the `allocator_reserve` category's.
    pub(super) reserve: u64,
}

/// Reads the refusal of `f`, whose moment `b` is the breakdown of.
pub(super) fn refusal<'a>(
    report: &Report,
    opts: &TriageOptions,
    f: &'a FailureReport,
    b: &Breakdown,
) -> Refusal<'a> {
    let fl = &f.failure;
    let total = report
        .device(f.process, f.device)
        .and_then(|d| d.total_bytes)
        .filter(|&t| t > 0)
        .unwrap_or(fl.total_bytes);
    let torch = fl.torch.as_ref();
    let limit = enforced(opts, torch, total);
    let shortfall = shortfall(fl, &limit, total, b);
    let (other_in, context_in) = inside_limit(b, total, &limit.limit);
    let inside = InsideLimit {
        other_process: other_in,
        context: context_in,
        outside: match limit.limit {
            Limit::Card { capacity } | Limit::GpuMemoryUtilization { capacity, .. } => {
                total.saturating_sub(capacity)
            }
            _ => 0,
        },
    };
    let reserve = match torch {
        Some(tl) => tl.reserved.saturating_sub(tl.allocated),
        None => b.bytes(Category::AllocatorReserve),
    };
    Refusal {
        failure: fl,
        total,
        limit,
        shortfall,
        inside,
        reserve,
    }
}

/// The limit enforced when the request was refused: PyTorch's own when it refused under one,
/// else `--gpu-memory-utilization`, `--capacity` or the card.
fn enforced(opts: &TriageOptions, torch: Option<&TorchOom>, total: u64) -> EnforcedLimit {
    let (limit, source) = match (torch.filter(|t| t.limit > 0), opts.capacity) {
        (None, c) if opts.gpu_memory_utilization.is_some() => {
            let fraction = opts.gpu_memory_utilization.unwrap_or(1.0);
            let capacity = c.unwrap_or(total);
            (
                Limit::Card { capacity },
                format!(
                    "the card: {} — vLLM's --gpu-memory-utilization {fraction} is spent at start (its KV pool fills ⌈{fraction} × total⌉ = {}), and at run time the driver refuses past the card",
                    gib(capacity),
                    gib((capacity as f64 * fraction).ceil() as u64)
                ),
            )
        }
        (Some(tl), _) => (
            Limit::PerProcessFraction {
                capacity: total,
                fraction: tl.limit as f64 / total as f64,
            },
            format!(
                "PyTorch's per-process limit of {} (`set_per_process_memory_fraction`), read from its refusal",
                gib(tl.limit)
            ),
        ),
        (None, Some(c)) => (
            Limit::Card { capacity: c },
            format!("a card of {} (given with --capacity)", gib(c)),
        ),
        (None, None) => (
            Limit::Card { capacity: total },
            format!("the card: {} total", gib(total)),
        ),
    };
    let bytes = match torch.filter(|t| t.limit > 0) {
        Some(tl) => tl.limit,
        None => limit.bytes().unwrap_or(total),
    };
    EnforcedLimit {
        limit,
        bytes,
        source,
    }
}

/// The bytes the request lacked against the limit: PyTorch's figures when it refused (the
/// segment it asked for beyond its limit, or beyond what was free), else the request beyond
/// what was free (under vLLM's budget, beyond what the budget had left).
fn shortfall(fl: &Failure, limit: &EnforcedLimit, total: u64, b: &Breakdown) -> u64 {
    let torch = fl.torch.as_ref();
    let limit_bytes = limit.bytes;
    let limit = &limit.limit;
    let segment = torch.map(|tl| torch_segment_size(tl.requested));
    match torch {
        Some(tl) if tl.limit > 0 => (tl.reserved + segment.unwrap_or(tl.requested))
            .saturating_sub(tl.limit)
            .max(1),
        Some(tl) => segment
            .unwrap_or(tl.requested)
            .saturating_sub(tl.free)
            .max(1),
        None => match *limit {
            // The budget counts this process, its context included; other processes are
            // outside it.
            Limit::GpuMemoryUtilization { capacity, .. } => {
                let (other_in, _) = inside_limit(b, total, limit);
                let outside = total.saturating_sub(capacity);
                let used = total
                    .saturating_sub(fl.free_bytes)
                    .saturating_sub(outside)
                    .saturating_sub(other_in);
                (used + fl.size)
                    .saturating_sub(limit_bytes)
                    .max(fl.size.saturating_sub(fl.free_bytes))
                    .max(1)
            }
            _ => fl.size.saturating_sub(fl.free_bytes).max(1),
        },
    }
}

/// The bytes of `other_process` and `context` inside the limit: under a card smaller than the
/// device (`--capacity` with a ballast), the device's bytes past the card are other processes'
/// first (the ballast), then the context's.
fn inside_limit(b: &Breakdown, device_total: u64, limit: &Limit) -> (u64, u64) {
    let other = b.bytes(Category::OtherProcess);
    let context = b.bytes(Category::Context);
    match limit {
        Limit::Card { capacity } | Limit::GpuMemoryUtilization { capacity, .. }
            if *capacity < device_total =>
        {
            let outside = device_total - capacity;
            let other_out = other.min(outside);
            let context_out = context.min(outside - other_out);
            (other - other_out, context - context_out)
        }
        _ => (other, context),
    }
}
