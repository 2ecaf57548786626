//! What `prefill` prints: the plan, how far the prompt got, the peak, and the
//! allocation that did not fit; as text or as JSON.

use serde_json::{Value, json};
use vramtrace_models::LayerKind;
use vramtrace_models::units::fmt_bytes;

use super::{
    BALLAST, CapacityPlan, ChunkReport, Failure, Held, KvCacheMode, PrefillOutcome, PrefillPlan,
    weight_format_name,
};
use crate::tensor::LedgerEvent;

/// Everything the report needs about one prefill.
pub struct PrefillReport<'a> {
    /// What was run.
    pub plan: &'a PrefillPlan,
    /// What happened.
    pub outcome: &'a PrefillOutcome,
    /// The config.json it came from.
    pub config_path: String,
    /// The device description.
    pub device: String,
    /// Whether kernels ran.
    pub simulated: bool,
    /// Whether the preload's annotation ABI was found.
    pub annotated: bool,
    /// How `--capacity` applied.
    pub capacity: &'a CapacityPlan,
    /// Wall time of the whole run, in seconds.
    pub seconds: f64,
    /// Every allocation and free, when asked for.
    pub ledger: Option<Vec<LedgerEvent>>,
}

fn b(n: usize) -> String {
    fmt_bytes(n as u64)
}

fn kind_name(k: LayerKind) -> &'static str {
    match k {
        LayerKind::LinearAttention => "gdn",
        LayerKind::FullAttention => "attention",
    }
}

fn held_json(h: &Held) -> Value {
    json!({
        "ballast": h.ballast,
        "weights": h.weights,
        "kv_cache": h.kv_cache,
        "gdn_state": h.gdn_state,
        "activations": h.activations,
        "total": h.total(),
    })
}

fn chunk_json(c: &ChunkReport) -> Value {
    json!({
        "index": c.span.index,
        "start": c.span.start,
        "tokens": c.span.tokens,
        "tokens_done": c.tokens_done,
        "kv_cache_bytes": c.kv_cache_bytes,
        "live_bytes": c.live_bytes,
        "peak_bytes": c.peak_bytes,
        "seconds": c.seconds,
    })
}

fn failure_json(f: &Failure) -> Value {
    json!({
        "tensor": f.name,
        "dtype": f.dtype,
        "shape": f.shape,
        "bytes": f.bytes,
        "label": f.label,
        "chunk": f.chunk.map(|c| c.index),
        "chunk_start": f.chunk.map(|c| c.start),
        "chunk_tokens": f.chunk.map(|c| c.tokens),
        "layer": f.layer,
        "layer_kind": f.layer_kind.map(kind_name),
        "stage": f.stage,
        "tokens_prefilled": f.tokens_prefilled,
        "held": held_json(&f.held),
        "device_free": f.device_free,
        "error": f.message,
    })
}

impl PrefillReport<'_> {
    fn kv_mode(&self) -> (&'static str, Option<usize>) {
        match self.plan.options.kv_cache {
            KvCacheMode::Grow => ("grow", None),
            KvCacheMode::Preallocate { tokens } => ("preallocate", Some(tokens)),
        }
    }

    /// The machine-readable report.
    pub fn to_json(&self) -> Value {
        let p = self.plan;
        let o = self.outcome;
        let chunks = p.chunks();
        let (mode, kv_tokens) = self.kv_mode();
        let mut j = json!({
            "kernel": "prefill",
            "model": p.model,
            "config": self.config_path,
            "device": self.device,
            "simulated": self.simulated,
            "annotated": self.annotated,
            "capacity": {
                "requested": self.capacity.requested,
                "device_total": self.capacity.device_total,
                "device_free_at_start": self.capacity.device_free,
                "ballast_bytes": self.capacity.ballast,
                "note": self.capacity.note,
            },
            "options": {
                "prompt_tokens": p.options.prompt_tokens,
                "chunk": p.options.chunk,
                "chunks": chunks.len(),
                "weights": weight_format_name(p.options.weights),
                "kv_cache": mode,
                "kv_tokens": kv_tokens,
                "kv_dtype": p.options.kv_dtype.name(),
            },
            "layers": {
                "gdn": p.layers.len() - p.attention_layers(),
                "attention": p.attention_layers(),
                "kinds": p.layers.iter().map(|k| kind_name(*k)).collect::<Vec<_>>(),
            },
            "persistent": {
                "weights_bytes": p.weight_bytes(),
                "weights_note": "an estimate from config.json (vramtrace_models::weight_bytes), one allocation per layer",
                "weights": p.weights.iter().map(|w| json!({
                    "name": w.name, "dtype": w.dtype.name(), "shape": w.shape, "bytes": w.bytes(),
                })).collect::<Vec<_>>(),
                "gdn_state_bytes": p.state_bytes(),
                "gdn_states": p.states.iter().map(|s| json!({
                    "layer": s.layer,
                    "conv": {"name": s.conv.name, "dtype": s.conv.dtype.name(), "shape": s.conv.shape, "bytes": s.conv.bytes()},
                    "ssm": {"name": s.ssm.name, "dtype": s.ssm.dtype.name(), "shape": s.ssm.shape, "bytes": s.ssm.bytes()},
                })).collect::<Vec<_>>(),
                "kv_bytes_per_token_per_layer": p.kv_bytes_per_token,
                "kv_bytes_per_token": p.kv_bytes_per_token * p.attention_layers(),
            },
            "chunks": o.chunks.iter().map(chunk_json).collect::<Vec<_>>(),
            "tokens_prefilled": o.chunks.last().map_or(0, |c| c.tokens_done),
            "held_at_end": held_json(&o.persistent),
            "peak": o.peak.as_ref().map(|pk| json!({
                "bytes": pk.bytes,
                "tensor": pk.spec.name,
                "dtype": pk.spec.dtype.name(),
                "shape": pk.spec.shape,
                "label": pk.stage,
            })),
            "outcome": if o.failure.is_some() { "out_of_memory" } else { "completed" },
            "failure": o.failure.as_ref().map(failure_json),
            "seconds": self.seconds,
        });
        if let Some(ledger) = &self.ledger {
            j["events"] = ledger
                .iter()
                .map(|e| {
                    let (kind, spec, ptr, stage) = match e {
                        LedgerEvent::Alloc { spec, ptr, stage } => ("alloc", spec, ptr, stage),
                        LedgerEvent::Free { spec, ptr, stage } => ("free", spec, ptr, stage),
                    };
                    json!({
                        "event": kind,
                        "name": spec.name,
                        "dtype": spec.dtype.name(),
                        "shape": spec.shape,
                        "bytes": spec.bytes(),
                        "ptr": format!("{ptr:#x}"),
                        "label": stage,
                    })
                })
                .collect();
        }
        j
    }

    /// The report as text.
    pub fn to_text(&self) -> String {
        let p = self.plan;
        let o = self.outcome;
        let chunks = p.chunks();
        let mut t = String::new();
        let last = chunks.last().map_or(0, |c| c.tokens);
        t += &format!(
            "prefill of {}: {} prompt tokens in {} chunk{} of {}{}; {} GDN + {} attention layers\n",
            p.model,
            p.options.prompt_tokens,
            chunks.len(),
            if chunks.len() == 1 { "" } else { "s" },
            p.options.chunk.min(p.options.prompt_tokens),
            if chunks.len() > 1 && last != p.options.chunk {
                format!(" (the last {last})")
            } else {
                String::new()
            },
            p.layers.len() - p.attention_layers(),
            p.attention_layers(),
        );
        t += &format!("  device:    {}\n", self.device);
        let c = self.capacity;
        t += &format!(
            "  capacity:  {}\n",
            match (c.requested, c.ballast) {
                (None, _) => match c.device_total {
                    Some(total) => format!("the whole device ({})", b(total)),
                    None => "the whole device".into(),
                },
                (Some(req), 0) => format!(
                    "{}{}",
                    b(req),
                    if self.simulated {
                        " (the stand-in's own)"
                    } else {
                        ""
                    }
                ),
                (Some(req), ballast) => format!(
                    "{} (a {} ballast named \"{}\" on a card with {} free)",
                    b(req),
                    b(ballast),
                    BALLAST,
                    b(c.device_free.unwrap_or(0))
                ),
            }
        );
        if let Some(note) = &c.note {
            t += &format!("             note: {note}\n");
        }
        t += &format!(
            "  weights:   {} in {} allocations, {} (an estimate from config.json)\n",
            b(p.weight_bytes()),
            p.weights.len(),
            weight_format_name(p.options.weights)
        );
        if let Some(s) = p.states.first() {
            t += &format!(
                "  GDN state: {} ({} layers x conv {:?} {} + recurrent {:?} {})\n",
                b(p.state_bytes()),
                p.states.len(),
                s.conv.shape,
                s.conv.dtype,
                s.ssm.shape,
                s.ssm.dtype
            );
        }
        let per_token = p.kv_bytes_per_token * p.attention_layers();
        t += &format!(
            "  KV cache:  {} per token ({} layers x {}, {}); {}\n",
            b(per_token),
            p.attention_layers(),
            b(p.kv_bytes_per_token),
            p.options.kv_dtype,
            match p.options.kv_cache {
                KvCacheMode::Grow => "one block per chunk and layer, as the context grows".into(),
                KvCacheMode::Preallocate { tokens } => format!(
                    "preallocated for {tokens} tokens ({})",
                    b(per_token * tokens)
                ),
            }
        );
        t += "\n";
        let done = o.chunks.last().map_or(0, |c| c.tokens_done);
        t += &format!(
            "chunks completed: {} of {} ({} of {} tokens), KV cache {}, {:.1} s\n",
            o.chunks.len(),
            chunks.len(),
            done,
            p.options.prompt_tokens,
            b(o.persistent.kv_cache),
            self.seconds
        );
        if let Some(pk) = &o.peak {
            t += &format!(
                "peak:             {}, reached allocating {} at {}\n",
                b(pk.bytes),
                pk.spec,
                pk.stage
            );
        }
        if let Some(f) = &o.failure {
            t += "\n";
            t += &failure_text(f, p.options.prompt_tokens);
        }
        t
    }

    /// One line for stderr when an allocation did not fit.
    pub fn failure_line(&self) -> Option<String> {
        let f = self.outcome.failure.as_ref()?;
        Some(format!(
            "out of memory allocating {} ({} {:?}, {} bytes) at {} after {} prefilled tokens",
            f.name, f.dtype, f.shape, f.bytes, f.label, f.tokens_prefilled
        ))
    }
}

fn failure_text(f: &Failure, prompt: usize) -> String {
    let mut t = String::from("OUT OF MEMORY");
    match (f.chunk, f.layer) {
        (Some(c), Some(l)) => {
            t += &format!(
                " in chunk {} (tokens {}..{}), layer {} ({}), stage {}\n",
                c.index,
                c.start,
                c.start + c.tokens,
                l,
                f.layer_kind.map_or("?", kind_name),
                f.stage
            )
        }
        (Some(c), None) => {
            t += &format!(
                " before chunk {} (tokens {}..{}), stage {}\n",
                c.index,
                c.start,
                c.start + c.tokens,
                f.stage
            )
        }
        _ => t += &format!(" before the first chunk, stage {}\n", f.stage),
    }
    t += &format!(
        "  could not allocate {} {} {:?} ({}): {}\n",
        f.name,
        f.dtype,
        f.shape,
        b(f.bytes),
        f.message
    );
    t += &format!("  label:            {}\n", f.label);
    t += &format!("  tokens prefilled: {} of {prompt}\n", f.tokens_prefilled);
    let h = &f.held;
    let mut parts = vec![
        format!("weights {}", b(h.weights)),
        format!("KV cache {}", b(h.kv_cache)),
        format!("GDN state {}", b(h.gdn_state)),
        format!("activations {}", b(h.activations)),
    ];
    if h.ballast > 0 {
        parts.push(format!("ballast {}", b(h.ballast)));
    }
    t += &format!(
        "  held then:        {} = {}\n",
        b(h.total()),
        parts.join(" + ")
    );
    if let Some(free) = f.device_free {
        t += &format!("  device free then: {}\n", b(free));
    }
    t
}
