//! The levers of a triage, most useful first: with the whole-step model, each change (the
//! allocator's setting, CUDA graphs, the chunk, the context, the limit, the KV dtype, the
//! tensor-parallel degree) checked against the limit with its ceiling; with an engine's planner,
//! its own levers (`engine_view.rs`); without a model, what the trace alone says (the allocator's
//! setting, the limit the request needed).

use vramtrace_models::{DType, KnownParts, Limit, Runtime};

use super::whole_step::what_if;
use super::{Triage, TriageOptions, VerdictClass, gib};
use crate::report::engine_view;
use crate::report::model_view::{Lever, ModelView};

/// vLLM's utilisation lever (docs/vllm-0.20.1-planner-notes.md, section 2.9): the pool fills
/// what the budget leaves, so lowering `--gpu-memory-utilization` by `short / card` shrinks the
/// pool by `short` and leaves the step that much more of the card; raising it takes room away.
fn lower_util(u: f64, short: u64, card: u64, what: &str) -> Lever {
    let to = ((u - short as f64 / card as f64) * 1000.0).floor() / 1000.0;
    Lever {
        change: format!("--gpu-memory-utilization {to:.3} (lower)"),
        fits: Some(to > 0.0),
        ceiling: if short == 0 {
            format!(
                "{what} fits the card at {u}: vLLM's pool takes the budget at start, so a lower value only adds slack"
            )
        } else {
            format!(
                "vLLM sizes its KV pool at start to fill ⌈U × total⌉: {u} → {to:.3} makes the pool {} smaller, which {what} lacked on the card (fewer tokens cached); raising it would take that room away",
                gib(short)
            )
        },
        feasible: to > 0.0,
    }
}

fn ceiling(largest: Option<u64>, chunk: u64) -> String {
    match largest {
        Some(l) => format!("contexts up to {l} tokens at a chunk of {chunk}"),
        None => format!("no context fits at a chunk of {chunk}"),
    }
}

pub(super) fn levers(
    opts: &TriageOptions,
    t: &Triage,
    model: Option<&ModelView>,
    limit: &Limit,
    class: VerdictClass,
    reserve: u64,
    request: u64,
) -> Vec<Lever> {
    let mut out = Vec::new();
    let frag = class == VerdictClass::Fragmentation;
    if let (Some(m), Some(mi)) = (model.filter(|m| m.engine.is_some()), opts.model.as_ref()) {
        return engine_view::transformers_levers(
            &mi.cfg,
            m,
            limit,
            frag.then_some((reserve, request)),
        );
    }
    let Some(m) = model else {
        if frag {
            out.push(Lever {
                change: "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".into(),
                fits: None,
                ceiling: format!(
                    "the {} free inside segments becomes one mappable range, more than the {} request (give --model for the new ceiling)",
                    gib(reserve),
                    gib(request)
                ),
                feasible: true,
            });
        }
        // What the limit would have to be for this request, from the trace alone: everything
        // the limit counted then, the request's share included.
        if let (Some(u), Some(short), Some(v)) = (opts.gpu_memory_utilization, t.shortfall, &t.vllm)
        {
            out.push(lower_util(u, short, v.card_bytes, "this request"));
            return out;
        }
        if let (Some(limit_bytes), Some(short)) = (t.limit.as_ref().map(|l| l.bytes), t.shortfall) {
            let needed = limit_bytes + short;
            let (change, feasible) = match limit {
                Limit::PerProcessFraction { capacity, .. } => {
                    let f = needed as f64 / *capacity as f64;
                    (
                        format!(
                            "set_per_process_memory_fraction({:.3})",
                            (f * 1000.0).ceil() / 1000.0
                        ),
                        f <= 1.0,
                    )
                }
                Limit::GpuMemoryUtilization { capacity, .. } => {
                    let f = needed as f64 / *capacity as f64;
                    (
                        format!(
                            "--gpu-memory-utilization {:.3}",
                            (f * 1000.0).ceil() / 1000.0
                        ),
                        f <= 1.0,
                    )
                }
                Limit::Card { .. } => (
                    format!("a card (or a budget) of {} or more", gib(needed)),
                    true,
                ),
            };
            out.push(Lever {
                change,
                fits: None,
                ceiling: format!(
                    "this request fits with {} more; the rest of the step is not known without --model",
                    gib(short)
                ),
                feasible,
            });
        }
        return out;
    };
    let chunk = m.shape.chunk_tokens;
    let context = m.shape.context_tokens;
    // vLLM's flags for the programs that take them (the workload stands in for vLLM's
    // chunked prefill); plain words for the others.
    let vllm_flags = matches!(m.runtime, Runtime::Vllm | Runtime::Workload);
    if frag {
        let known = KnownParts {
            allocator_reserve: None,
            ..m.known.clone()
        };
        if let Some((fits, ctx)) = what_if(opts, m, known, &m.shape, limit) {
            out.push(Lever {
                change: "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".into(),
                fits: Some(fits),
                ceiling: format!(
                    "{} (the {} reserve usable)",
                    ceiling(ctx, chunk),
                    gib(reserve)
                ),
                feasible: true,
            });
        }
    }
    if let Some(graphs) = m.known.cuda_graphs {
        let known = KnownParts {
            cuda_graphs: None,
            ..m.known.clone()
        };
        if let Some((fits, ctx)) = what_if(opts, m, known, &m.shape, limit) {
            out.push(Lever {
                change: "--enforce-eager (or fewer --cuda-graph-sizes)".into(),
                fits: Some(fits),
                ceiling: format!(
                    "{} (frees {} of graph pools)",
                    ceiling(ctx, chunk),
                    gib(graphs)
                ),
                feasible: true,
            });
        }
    }
    let f = &m.chunk_frontier;
    out.push(match f.largest_chunk {
        Some(c) => Lever {
            change: if vllm_flags {
                format!("--max-num-batched-tokens {c}")
            } else {
                format!("a prefill chunk of {c} tokens")
            },
            fits: Some(c >= 1),
            ceiling: format!(
                "the largest chunk that fits at this context ({context} tokens) is {c}{}",
                if f.floor.multiple > 1 {
                    format!(
                        " (a multiple of {} tokens, the smallest chunk the engine schedules)",
                        f.floor.multiple
                    )
                } else {
                    String::new()
                }
            ),
            feasible: true,
        },
        None => Lever {
            change: if vllm_flags {
                "--max-num-batched-tokens (smaller chunk)".into()
            } else {
                "a smaller prefill chunk".into()
            },
            fits: Some(false),
            ceiling: format!(
                "no chunk fits at this context ({context} tokens): even the floor of {} tokens counts {} against {}",
                f.floor.min_tokens.max(f.floor.multiple).max(1),
                gib(f.at_floor),
                gib(f.limit_bytes)
            ),
            feasible: false,
        },
    });
    let cf = &m.context_frontier;
    out.push(Lever {
        change: match cf.largest_context {
            Some(l) if vllm_flags => format!("--max-model-len {l}"),
            Some(l) => format!("contexts of at most {l} tokens"),
            None if vllm_flags => "--max-model-len".into(),
            None => "a shorter context".into(),
        },
        // It refuses this request's context up front instead of fitting it.
        fits: cf.largest_context.filter(|&l| l >= context).map(|_| true),
        ceiling: ceiling(cf.largest_context, chunk),
        feasible: cf.largest_context.is_some(),
    });
    // The limit needed for this step; under vLLM, the utilisation that leaves it room.
    let needed = m.counted;
    if let (Some(u), Limit::Card { capacity }) = (opts.gpu_memory_utilization, limit) {
        let short = needed.saturating_sub(*capacity);
        out.push(lower_util(u, short, *capacity, "this step"));
    }
    let (change, feasible) = match limit {
        Limit::GpuMemoryUtilization { capacity, .. }
        | Limit::PerProcessFraction { capacity, .. } => {
            let frac = needed as f64 / *capacity as f64;
            (
                if matches!(limit, Limit::GpuMemoryUtilization { .. }) {
                    format!(
                        "--gpu-memory-utilization {:.3}",
                        (frac * 1000.0).ceil() / 1000.0
                    )
                } else {
                    format!(
                        "set_per_process_memory_fraction({:.3})",
                        (frac * 1000.0).ceil() / 1000.0
                    )
                },
                frac <= 1.0,
            )
        }
        Limit::Card { .. } => (
            format!(
                "a card (or a --gpu-memory-utilization budget) of {} or more",
                gib(needed)
            ),
            true,
        ),
    };
    out.push(Lever {
        change,
        fits: Some(feasible),
        ceiling: format!("this step counts {} against the limit", gib(needed)),
        feasible,
    });
    let mut fp8 = m.shape.clone();
    if fp8.kv_dtype.size_bytes() > 1 {
        fp8.kv_dtype = DType::F8;
        if let Some((fits, ctx)) = what_if(opts, m, m.known.clone(), &fp8, limit) {
            let same = ctx == m.context_frontier.largest_context;
            out.push(Lever {
                change: "--kv-cache-dtype fp8".into(),
                fits: Some(fits),
                ceiling: if same {
                    format!(
                        "{} (unchanged: the {} runtime's model keeps K/V in the activation dtype)",
                        ceiling(ctx, chunk),
                        m.runtime.name()
                    )
                } else {
                    ceiling(ctx, chunk)
                },
                feasible: !same,
            });
        }
    }
    let mut tp2 = m.shape.clone();
    tp2.tp = m.shape.tp * 2;
    if let Some((fits, ctx)) = what_if(opts, m, m.known.clone(), &tp2, limit) {
        out.push(Lever {
            change: if vllm_flags {
                format!("--tensor-parallel-size {}", tp2.tp)
            } else {
                format!("a tensor-parallel degree of {}", tp2.tp)
            },
            fits: Some(fits),
            ceiling: format!("{} per rank", ceiling(ctx, chunk)),
            feasible: true,
        });
    }
    let _ = t;
    // Most useful first: those that fit the failing step, then those that cap it, then those
    // that do not help; infeasible last.
    out.sort_by_key(|l| {
        (
            !l.feasible,
            match l.fits {
                Some(true) => 0,
                None => 1,
                Some(false) => 2,
            },
        )
    });
    out
}
