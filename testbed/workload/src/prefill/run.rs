//! Running a plan: the persistent stand-ins, then each chunk through every
//! layer, and the out-of-memory failure turned into an outcome.

use std::collections::HashMap;
use std::time::Instant;

use vramtrace_models::LayerKind;

use super::capacity::BALLAST;
use super::layers::{HostInputs, KvTarget, attention_layer, gdn_layer, mlp};
use super::outcome::{ChunkReport, Failure, Held, PrefillOutcome};
use super::plan::{ChunkSpan, KvCacheMode, PrefillPlan};
use crate::dtype::DType;
use crate::error::{AllocFailure, Error, Result};
use crate::tensor::{DeviceTensor, Session, TensorSpec};

/// Where the run is, for the failure report.
#[derive(Default)]
struct Position {
    chunk: Option<ChunkSpan>,
    layer: Option<usize>,
}

/// Run the prefill of `plan`, allocating a `ballast` of that many bytes first
/// when it is not 0, and calling `progress` after each chunk. An allocation
/// the device refuses for lack of memory ends the run cleanly: the outcome
/// says where ([`PrefillOutcome::failure`]) and every tensor is freed. Other
/// errors are returned.
pub fn run(
    s: &Session<'_>,
    plan: &PrefillPlan,
    ballast: usize,
    progress: &mut dyn FnMut(&ChunkReport),
) -> Result<PrefillOutcome> {
    let mut out = PrefillOutcome::default();
    let mut at = Position::default();
    let result = {
        let _r = s.range("prefill");
        body(s, plan, ballast, progress, &mut out, &mut at)
    };
    out.peak = s.peak();
    match result {
        Ok(()) => Ok(out),
        Err(Error::Alloc(a)) if a.out_of_memory => {
            out.failure = Some(failure(plan, &at, out.persistent, *a));
            Ok(out)
        }
        Err(e) => Err(e),
    }
}

/// Where and what the allocation `a` that did not fit was, with `persistent`
/// held then.
fn failure(plan: &PrefillPlan, at: &Position, persistent: Held, a: AllocFailure) -> Failure {
    let AllocFailure {
        name,
        dtype,
        shape,
        bytes,
        message,
        stage: label,
        live_bytes,
        device_free,
        ..
    } = a;
    let mut held = persistent;
    held.activations = live_bytes.saturating_sub(held.persistent());
    let in_layer = match (at.chunk, at.layer) {
        (Some(c), Some(l)) => format!("prefill/chunk.{}/layer.{l}/", c.index),
        _ => "prefill/".into(),
    };
    let stage = label
        .strip_prefix(&in_layer)
        .or_else(|| label.strip_prefix("prefill/"))
        .unwrap_or(&label)
        .to_string();
    Failure {
        name,
        dtype,
        shape,
        bytes,
        label,
        chunk: at.chunk,
        layer: at.layer,
        layer_kind: at.layer.map(|l| plan.layers[l]),
        stage,
        tokens_prefilled: at.chunk.map_or(0, |c| c.start),
        held,
        device_free,
        message,
    }
}

/// Every tensor that outlives a layer, in allocation order: freed newest
/// first at the end of a run, oldest first (as the vector drops) when it fails.
struct Persistent<'s, 'b> {
    tensors: Vec<DeviceTensor<'s, 'b>>,
    /// Per layer, where its recurrent state is in `tensors` (GDN layers).
    ssm: Vec<Option<usize>>,
    /// Per layer, where its current KV block is in `tensors` (attention
    /// layers): the run's when preallocated, the current chunk's when the
    /// cache grows.
    kv_block: Vec<Option<usize>>,
}

fn body<'s, 'b>(
    s: &'s Session<'b>,
    plan: &PrefillPlan,
    ballast: usize,
    progress: &mut dyn FnMut(&ChunkReport),
    out: &mut PrefillOutcome,
    at: &mut Position,
) -> Result<()> {
    let layers = plan.layers.len();
    let mut held = Persistent {
        tensors: Vec::new(),
        ssm: vec![None; layers],
        kv_block: vec![None; layers],
    };
    allocate_persistent(s, plan, ballast, &mut held, out, at)?;
    let mut hosts = HostInputs {
        seed: plan.options.seed,
        gdn: HashMap::new(),
        fa: HashMap::new(),
    };
    s.take_window_peak();
    for span in plan.chunks() {
        let started = Instant::now();
        at.chunk = Some(span);
        if plan.options.kv_cache == KvCacheMode::Grow {
            let chunk = Some(span.index);
            allocate_kv_blocks(s, plan, chunk, span.tokens, &mut held, out, at)?;
        }
        run_chunk(s, plan, span, &held, &mut hosts, at)?;
        let report = ChunkReport {
            span,
            tokens_done: span.start + span.tokens,
            kv_cache_bytes: out.persistent.kv_cache,
            live_bytes: s.live_bytes(),
            peak_bytes: s.take_window_peak(),
            seconds: started.elapsed().as_secs_f64(),
        };
        progress(&report);
        out.chunks.push(report);
    }
    at.chunk = None;
    // With --check-style capture (the emulator tests): the carried recurrent
    // states and the KV cache as written.
    if s.is_capturing() {
        for t in &held.tensors {
            let name = &t.spec().name;
            if name.ends_with(".ssm_state") || name.contains(".kv") {
                s.capture(t)?;
            }
        }
    }
    while let Some(t) = held.tensors.pop() {
        drop(t);
    }
    Ok(())
}

/// Before the first chunk: the ballast, the weights, the GDN states and, when
/// preallocated, the KV cache.
fn allocate_persistent<'s, 'b>(
    s: &'s Session<'b>,
    plan: &PrefillPlan,
    ballast: usize,
    held: &mut Persistent<'s, 'b>,
    out: &mut PrefillOutcome,
    at: &mut Position,
) -> Result<()> {
    if ballast > 0 {
        let _r = s.range("capacity");
        held.tensors
            .push(s.empty(TensorSpec::new(BALLAST, DType::U8, &[ballast]))?);
        out.persistent.ballast += ballast;
    }
    {
        let _r = s.range("weights");
        for spec in &plan.weights {
            held.tensors.push(s.empty(spec.clone())?);
            out.persistent.weights += spec.bytes();
        }
    }
    // Zeroed: a sequence's first chunk starts from no state (vLLM zeroes the
    // gathered state of sequences without one: `initial_state[~has_initial_state] = 0`).
    {
        let _r = s.range("gdn_state");
        for st in &plan.states {
            held.tensors.push(s.zeros(st.conv.clone())?);
            held.tensors.push(s.zeros(st.ssm.clone())?);
            held.ssm[st.layer] = Some(held.tensors.len() - 1);
            out.persistent.gdn_state += st.conv.bytes() + st.ssm.bytes();
        }
    }
    if let KvCacheMode::Preallocate { tokens } = plan.options.kv_cache {
        allocate_kv_blocks(s, plan, None, tokens, held, out, at)?;
    }
    Ok(())
}

/// One KV block of `tokens` per attention layer, under `prefill/kv_cache`:
/// the run's (`chunk` is `None`) or chunk `chunk`'s.
fn allocate_kv_blocks<'s, 'b>(
    s: &'s Session<'b>,
    plan: &PrefillPlan,
    chunk: Option<usize>,
    tokens: usize,
    held: &mut Persistent<'s, 'b>,
    out: &mut PrefillOutcome,
    at: &mut Position,
) -> Result<()> {
    let _r = s.range("kv_cache");
    for (l, kind) in plan.layers.iter().enumerate() {
        if *kind == LayerKind::FullAttention {
            at.layer = Some(l);
            let spec = plan.kv_block(l, chunk, tokens);
            let bytes = spec.bytes();
            // Counted once allocated: a block that fails to allocate is not held.
            held.tensors.push(s.empty(spec)?);
            out.persistent.kv_cache += bytes;
            held.kv_block[l] = Some(held.tensors.len() - 1);
        }
    }
    at.layer = None;
    Ok(())
}

/// Every layer in order on one chunk, under `prefill/chunk.{i}/layer.{l}/`.
fn run_chunk(
    s: &Session<'_>,
    plan: &PrefillPlan,
    span: ChunkSpan,
    held: &Persistent<'_, '_>,
    hosts: &mut HostInputs,
    at: &mut Position,
) -> Result<()> {
    let _c = s.range(&format!("chunk.{}", span.index));
    for (l, kind) in plan.layers.iter().enumerate() {
        at.layer = Some(l);
        let _l = s.range(&format!("layer.{l}"));
        match kind {
            LayerKind::LinearAttention => {
                let state = &held.tensors[held.ssm[l].expect("every GDN layer has a state")];
                let host = hosts.gdn(s, plan, span.tokens);
                gdn_layer(s, plan, span.tokens, state, host)?;
            }
            LayerKind::FullAttention => {
                let block =
                    &held.tensors[held.kv_block[l].expect("every attention layer has a KV block")];
                let target = match plan.options.kv_cache {
                    KvCacheMode::Grow => KvTarget {
                        block,
                        capacity: span.tokens,
                        start: 0,
                    },
                    KvCacheMode::Preallocate { tokens } => KvTarget {
                        block,
                        capacity: tokens,
                        start: span.start,
                    },
                };
                let host = hosts.fa(s, plan, span.tokens);
                attention_layer(s, plan, span.tokens, &target, host)?;
            }
        }
        mlp(s, plan, span.tokens)?;
    }
    at.layer = None;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Recorded, RecordingBackend};
    use crate::prefill::fixtures::{options, tiny};
    use crate::tensor::LedgerEvent;

    #[test]
    fn one_chunk_layer_by_layer() {
        let cfg = tiny();
        let p = PrefillPlan::new(&cfg, options(40, 32)).unwrap();
        let rec = RecordingBackend::new();
        let s = Session::new(&rec, false);
        let out = run(&s, &p, 0, &mut |_| {}).unwrap();
        assert!(out.failure.is_none());
        assert_eq!(out.chunks.len(), 2);
        assert_eq!(rec.live_bytes(), 0);
        // Chunk 1's attention layer 1 writes K then V behind chunk 1's KV block.
        let ledger = s.ledger();
        let block = ledger
            .iter()
            .find_map(|e| match e {
                LedgerEvent::Alloc { spec, ptr, .. } if spec.name == "layer.1.kv.chunk.1" => {
                    Some(*ptr)
                }
                _ => None,
            })
            .unwrap();
        let copies: Vec<(u64, usize)> = rec
            .log()
            .iter()
            .filter_map(|r| match r {
                // The block is [2, 8, 2, 32] bf16: 2048 bytes.
                Recorded::Copy { dst, bytes, .. } if *dst >= block && *dst < block + 2048 => {
                    Some((*dst - block, *bytes))
                }
                _ => None,
            })
            .collect();
        // 8 tokens x 2 KV heads x 32 x bf16 = 1024 bytes per half.
        assert_eq!(copies, vec![(0, 1024), (1024, 1024)]);
    }

    #[test]
    fn out_of_memory_is_an_outcome_not_an_error() {
        let cfg = tiny();
        let p = PrefillPlan::new(&cfg, options(40, 32)).unwrap();
        let persistent = p.weight_bytes() + p.state_bytes();
        // Room for the persistent tensors and chunk 0's KV blocks, and a little more.
        let rec = RecordingBackend::with_capacity(persistent + 2 * 32 * 256 + 1000);
        let s = Session::new(&rec, false);
        let out = run(&s, &p, 0, &mut |_| {}).unwrap();
        let f = out.failure.expect("it does not fit");
        assert_eq!(f.chunk.map(|c| c.index), Some(0));
        assert_eq!(f.layer, Some(0));
        assert_eq!(f.layer_kind, Some(LayerKind::LinearAttention));
        assert!(
            f.label.starts_with("prefill/chunk.0/layer.0/gdn/"),
            "{}",
            f.label
        );
        assert_eq!(f.label, format!("prefill/chunk.0/layer.0/{}", f.stage));
        assert_eq!(f.tokens_prefilled, 0);
        assert_eq!(f.held.weights, p.weight_bytes());
        assert_eq!(f.held.kv_cache, 2 * 32 * 256);
        let capacity = persistent + 2 * 32 * 256 + 1000;
        assert_eq!(f.device_free, Some(capacity - f.held.total()));
        assert!(f.held.total() + f.bytes > capacity);
        assert_eq!(f.stage, "gdn/inputs");
        assert_eq!(f.name, "q");
        assert_eq!(rec.live_bytes(), 0, "everything is freed");
    }
}
