//! Where in the run a step was, read from the trace: the chunk of a labelled run (the reference
//! workload), the forward of transformers' `generate` loop (its prefill chunks and decode steps,
//! counted by the embedding's output under the loop's own frames), the step of an unlabelled
//! PyTorch loop (its first line allocating again), and the step live at a peak.

use std::collections::HashMap;
use std::ops::ControlFlow;

use serde::Serialize;
use vramtrace_format::TensorAction;
use vramtrace_models::ModelConfig;

use crate::categoriser::{self, At};
use crate::report::FailureReport;
use crate::torch_replay::TensorReplay;
use crate::trace::{Item, Trace};

/// The tokens an embedding output of `bytes` holds at `per_token` bytes a token (the config's
/// hidden size × dtype); the allocator rounds blocks up to 512 bytes, so up to 511 more are
/// allowed. `None` when the bytes are not such an output.
pub(crate) fn embedding_tokens(bytes: u64, per_token: u64) -> Option<u64> {
    let tokens = bytes.checked_div(per_token)?;
    (tokens > 0 && bytes - tokens * per_token < 512).then_some(tokens)
}

/// Whether the embedding outputs of `process` (tensors allocated in PyTorch's `embedding`) hold
/// a whole number of tokens of `per_token` bytes (a config's hidden size × dtype): exactly by
/// the bytes requested where the trace has them, else within the block's 512-byte rounding.
/// `Some(true)` when one does, `Some(false)` when there are some and none does, `None` when the
/// trace shows no embedding (it cannot tell).
pub(crate) fn embedding_outputs_match(
    trace: &Trace,
    process: usize,
    per_token: u64,
) -> crate::Result<Option<bool>> {
    let p = &trace.processes[process];
    let mut embeddings: HashMap<u32, bool> = HashMap::new();
    let (mut any, mut matched) = (false, false);
    trace.for_each_item(|pi, it| {
        if let Item::Tensor(t) = &it
            && pi == process
            && t.action == TensorAction::Alloc
            && *embeddings.entry(t.stack).or_insert_with(|| {
                categoriser::py_frames(p, t.stack)
                    .first()
                    .is_some_and(categoriser::is_embedding)
            })
        {
            any = true;
            matched = if t.requested > 0 {
                per_token > 0 && t.requested.is_multiple_of(per_token)
            } else {
                embedding_tokens(t.size, per_token).is_some()
            };
            if matched {
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    })?;
    Ok(any.then_some(matched))
}

/// Calls `f` with each tensor allocation of `at`'s process and device made before `at`, and its
/// place in the replay.
fn for_each_alloc_before(
    trace: &Trace,
    at: At,
    mut f: impl FnMut(&vramtrace_format::TensorEvent, At),
) -> crate::Result<()> {
    let mut i = 0usize;
    trace.for_each_item(|pi, it| {
        if i >= at.seq {
            return ControlFlow::Break(());
        }
        i += 1;
        if let Item::Tensor(t) = &it
            && pi == at.process
            && t.device == at.device
            && t.action == TensorAction::Alloc
        {
            f(t, At { seq: i - 1, ..at });
        }
        ControlFlow::Continue(())
    })?;
    Ok(())
}

/// Where in the run the failing step was, read from the trace.
#[derive(Debug, Clone, Serialize)]
pub struct StepPosition {
    /// The step's index (0 = the first chunk).
    pub chunk_index: u64,
    /// New tokens of the step, when the trace tells them.
    pub chunk_tokens: Option<u64>,
    /// Tokens held at the end of the step (`(chunk_index + 1) × chunk_tokens`), when known.
    pub context_tokens: Option<u64>,
    /// How they were read, in words.
    pub source: String,
    /// Whether they were read from the engine's own loop (transformers' `generate`), so that
    /// the engine's planner can be set beside the step.
    #[serde(skip)]
    pub from_engine_loop: bool,
    /// Where each forward of the engine's loop of the step's kind began, the step's last (its
    /// first allocation, the embedding's output); empty when not read from the loop.
    #[serde(skip)]
    pub forward_starts: Vec<At>,
}

/// `prefill/chunk.27/layer.0/…` → 27.
pub fn chunk_of_label(label: &str) -> Option<u64> {
    let i = label.find("chunk.")?;
    let rest = &label[i + "chunk.".len()..];
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// `q bf16[1, 4128, 16, 128]` → `(q, [1, 4128, 16, 128])`.
pub(crate) fn name_and_shape(t: &str) -> Option<(&str, Vec<u64>)> {
    let open = t.rfind('[')?;
    let dims = t[open + 1..].strip_suffix(']')?;
    let shape: Option<Vec<u64>> = dims.split(',').map(|d| d.trim().parse().ok()).collect();
    let name = t[..open].trim_end().rsplit_once(' ').map_or("", |(n, _)| n);
    Some((name, shape?))
}

/// The step of a labelled run (the reference workload): the chunk in the failure's label, its
/// tokens from the annotated query of that chunk (`q [1, T, H, D]`).
pub(crate) fn step_from_labels(f: &FailureReport) -> Option<StepPosition> {
    let label = f.failure.label.as_deref()?;
    let n = chunk_of_label(label)?;
    let prefix = format!("chunk.{n}/");
    let tokens = f
        .failure
        .live
        .iter()
        .filter(|a| a.label.as_deref().is_some_and(|l| l.contains(&prefix)))
        .filter_map(|a| name_and_shape(a.tensor.as_deref()?))
        .find(|(name, s)| matches!(*name, "q" | "k" | "v") && s.len() >= 3 && s[0] == 1)
        .map(|(_, s)| s[1]);
    Some(StepPosition {
        chunk_index: n,
        chunk_tokens: tokens,
        context_tokens: tokens.map(|t| (n + 1) * t),
        source: match tokens {
            Some(t) => format!(
                "the failure's label `{label}` names chunk {n}; that chunk's annotated `q` has {t} tokens"
            ),
            None => format!("the failure's label `{label}` names chunk {n}"),
        },
        from_engine_loop: false,
        forward_starts: Vec::new(),
    })
}

/// Which forward of transformers' `generate` a tensor's stack is in: the embedding's output
/// (`torch/nn/functional.py` `embedding`, the model's first tensor of a forward) under the
/// innermost frame of `generation/utils.py`, which is `_prefill` for a prefill forward (each
/// chunk of `prefill_chunk_size`, `generation/utils.py:4111-4150` in transformers 5.17) and the
/// decoding loop (`_sample`, `_beam_search`, …) for a decode step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GenerateForward {
    Prefill,
    Decode,
    /// A step of continuous batching's loop (`generation/continuous_batching/continuous_api.py`
    /// `_generation_step`, transformers 5.17: `:551`): one forward of the batch the scheduler
    /// packed, its query tokens sliced from the static input buffer (`input_outputs.py:471-477`).
    Batch,
}

/// The frame of the engine's loop a forward runs under: continuous batching's step, else the
/// innermost frame of `generation/utils.py`.
fn loop_frame<'a, 'b>(py: &'b [categoriser::PyFrame<'a>]) -> Option<&'b categoriser::PyFrame<'a>> {
    py.iter()
        .find(|f| {
            f.function == "_generation_step"
                && f.file.ends_with("continuous_batching/continuous_api.py")
        })
        .or_else(|| py.iter().find(|f| f.file.ends_with("generation/utils.py")))
}

pub(crate) fn generate_forward(py: &[categoriser::PyFrame<'_>]) -> Option<GenerateForward> {
    if !py.first().is_some_and(categoriser::is_embedding) {
        return None;
    }
    let f = loop_frame(py)?;
    Some(if f.function == "_generation_step" {
        GenerateForward::Batch
    } else if f.function == "_prefill" {
        GenerateForward::Prefill
    } else {
        GenerateForward::Decode
    })
}

/// The step of transformers' `generate` at `at`, from the engine's own loop: every forward of
/// the call (a prefill chunk or a decode step) begins with the embedding's output, allocated
/// under `generation/utils.py`'s `_prefill` or its decoding loop; the step is the last forward
/// begun before `at`, its tokens that tensor's bytes over the config's hidden size × dtype, the
/// context every forward's tokens of the call so far. A prefill forward after a decode step
/// begins a new call. `None` when no forward of `generate` is in the trace.
pub(crate) fn step_from_generate(
    trace: &Trace,
    at: At,
    cfg: Option<&ModelConfig>,
) -> crate::Result<Option<StepPosition>> {
    Ok(loop_step(trace, at, cfg)?.map(|(_, s)| s))
}

/// The step of continuous batching's loop at `at` ([`GenerateForward::Batch`]), when the last
/// forward begun before it is one.
pub(crate) fn batch_step_at(
    trace: &Trace,
    at: At,
    cfg: Option<&ModelConfig>,
) -> crate::Result<Option<StepPosition>> {
    Ok(loop_step(trace, at, cfg)?
        .filter(|(k, _)| *k == GenerateForward::Batch)
        .map(|(_, s)| s))
}

fn loop_step(
    trace: &Trace,
    at: At,
    cfg: Option<&ModelConfig>,
) -> crate::Result<Option<(GenerateForward, StepPosition)>> {
    let p = &trace.processes[at.process];
    let mut kinds: HashMap<u32, Option<(GenerateForward, String)>> = HashMap::new();
    // The forwards of the current call: kind, embedding bytes, site, where it began.
    let mut call: Vec<(GenerateForward, u64, String, At)> = Vec::new();
    for_each_alloc_before(trace, at, |t, here| {
        let kind = kinds.entry(t.stack).or_insert_with(|| {
            let py = categoriser::py_frames(p, t.stack);
            let k = generate_forward(&py)?;
            let site = loop_frame(&py).map(ToString::to_string).unwrap_or_default();
            Some((k, site))
        });
        if let Some((k, site)) = kind.clone() {
            if k == GenerateForward::Prefill
                && call
                    .last()
                    .is_some_and(|(l, ..)| *l == GenerateForward::Decode)
            {
                call.clear();
            }
            call.push((k, t.size, site, here));
        }
    })?;
    let Some((kind, bytes, site, _)) = call.last().cloned() else {
        return Ok(None);
    };
    let index = call.iter().filter(|(k, ..)| *k == kind).count() as u64 - 1;
    let per_token = cfg.map(|c| c.hidden_size * c.dtype.size_bytes());
    let tokens_of = |b: u64| per_token.and_then(|pt| embedding_tokens(b, pt));
    let tokens = tokens_of(bytes);
    let what = match kind {
        GenerateForward::Prefill => format!("prefill chunk {index}"),
        GenerateForward::Decode => format!("decode step {index}"),
        GenerateForward::Batch => {
            let step = batch_step(index, bytes, tokens.zip(per_token), &site);
            return Ok(Some((kind, step)));
        }
    };
    let all: Option<u64> = call.iter().map(|(_, b, ..)| tokens_of(*b)).sum();
    let source = match (tokens, all, per_token) {
        (Some(t), Some(c), Some(pt)) => format!(
            "transformers' generate loop (`{site}`): {what} (forward {} of the call); its embedding output is {bytes} B = {t} tokens × {pt} B (hidden size × dtype), {c} tokens held at its end",
            call.len()
        ),
        _ => format!(
            "transformers' generate loop (`{site}`): {what} (forward {} of the call), its embedding output {bytes} B; give --model with the run's config for its tokens",
            call.len()
        ),
    };
    Ok(Some((
        kind,
        StepPosition {
            chunk_index: index,
            chunk_tokens: tokens,
            context_tokens: all,
            source,
            from_engine_loop: kind == GenerateForward::Prefill,
            forward_starts: call.iter().filter(|f| f.0 == kind).map(|f| f.3).collect(),
        },
    )))
}

/// A step of continuous batching's loop: its index among the loop's forwards so far, the query
/// tokens of its batch from the embedding's output (`tokens`: the tokens and the bytes a token,
/// when the config gives them). The context the batch's requests hold is in
/// the paged pool, allocated whole at start, so no size in the trace tells it.
fn batch_step(index: u64, bytes: u64, tokens: Option<(u64, u64)>, site: &str) -> StepPosition {
    let source = match tokens {
        Some((t, pt)) => format!(
            "transformers' continuous batching loop (`{site}`): batch step {index}; its embedding output is {bytes} B = {t} query tokens × {pt} B (hidden size × dtype), as the batch was laid out for the forward; the context its requests hold is in the paged pool, which no allocation size tells"
        ),
        _ => format!(
            "transformers' continuous batching loop (`{site}`): batch step {index}, its embedding output {bytes} B; give --model with the run's config for its tokens"
        ),
    };
    StepPosition {
        chunk_index: index,
        chunk_tokens: tokens.map(|(t, _)| t),
        context_tokens: None,
        source,
        from_engine_loop: false,
        forward_starts: Vec::new(),
    }
}

/// The step of an unlabelled PyTorch run, from the Python lines of its tensors: a step begins
/// each time the latest phase's first line allocates again ([`categoriser::Steps`]' rule); the
/// step's first tensor is its input, `tokens × hidden × dtype` bytes of the config's hidden size.
pub(crate) fn step_from_tensors(
    trace: &Trace,
    at: At,
    cfg: Option<&ModelConfig>,
) -> crate::Result<Option<StepPosition>> {
    #[derive(Default)]
    struct Phase {
        first_site: String,
        steps: u64,
        input_bytes: u64,
    }
    let p = &trace.processes[at.process];
    let mut phases: Vec<Phase> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut by_stack: HashMap<u32, Option<(usize, String)>> = HashMap::new();
    let mut latest: Option<usize> = None;
    for_each_alloc_before(trace, at, |t, _| {
        let place = by_stack.entry(t.stack).or_insert_with(|| {
            let py = crate::categoriser::py_frames(p, t.stack);
            if py
                .iter()
                .all(|f| categoriser::is_probe_frame(f.file, f.function))
            {
                return None;
            }
            let key = categoriser::phase_of(&py);
            let site = categoriser::site_of(&py, &[]);
            let n = phases.len();
            let ph = *index.entry(key).or_insert(n);
            if ph == n {
                phases.push(Phase {
                    first_site: site.clone(),
                    ..Phase::default()
                });
            }
            Some((ph, site))
        });
        if let Some((ph, site)) = place.clone() {
            let phase = &mut phases[ph];
            if phase.first_site == site {
                phase.steps += 1;
                phase.input_bytes = t.size;
            }
            latest = Some(ph);
        }
    })?;
    let Some(ph) = latest.map(|l| &phases[l]) else {
        return Ok(None);
    };
    if ph.steps == 0 {
        return Ok(None);
    }
    let n = ph.steps - 1;
    let per_token = cfg.map(|c| c.hidden_size * c.dtype.size_bytes());
    let tokens = per_token
        .filter(|&b| b > 0 && ph.input_bytes > 0 && ph.input_bytes.is_multiple_of(b))
        .map(|b| ph.input_bytes / b);
    let source = match (tokens, per_token) {
        (Some(t), Some(b)) => format!(
            "step {n} of the loop whose first line is `{}` (it allocated {} times); that line's tensor, the step's input, is {} B = {t} tokens × {b} B (hidden size × dtype)",
            ph.first_site, ph.steps, ph.input_bytes
        ),
        _ => format!(
            "step {n} of the loop whose first line is `{}` (it allocated {} times, its input {} B); give --model for the token count",
            ph.first_site, ph.steps, ph.input_bytes
        ),
    };
    Ok(Some(StepPosition {
        chunk_index: n,
        chunk_tokens: tokens,
        context_tokens: tokens.map(|t| (n + 1) * t),
        source,
        from_engine_loop: false,
        forward_starts: Vec::new(),
    }))
}

/// The step live at a moment without a failure, from the embedding's output (the step's input
/// hidden states, `tokens × hidden × dtype` bytes) among the live tensors: the tokens of the
/// forward that was running.
pub(crate) fn step_at_peak(
    trace: &Trace,
    at: At,
    cfg: &ModelConfig,
) -> crate::Result<Option<StepPosition>> {
    let p = &trace.processes[at.process];
    let mut live = TensorReplay::new();
    let mut i = 0usize;
    trace.for_each_item(|pi, it| {
        if i > at.seq {
            return ControlFlow::Break(());
        }
        if let Item::Tensor(t) = &it
            && pi == at.process
            && t.device == at.device
        {
            live.apply(pi, i, t);
        }
        i += 1;
        ControlFlow::Continue(())
    })?;
    let per_token = cfg.hidden_size * cfg.dtype.size_bytes();
    if per_token == 0 {
        return Ok(None);
    }
    let mut found: Option<(u64, String)> = None;
    for t in live.live_set(at.process, at.device) {
        let (size, stack) = (t.event.size, t.event.stack);
        let py = crate::categoriser::py_frames(p, stack);
        let Some(f) = py.iter().find(|f| categoriser::is_embedding(f)) else {
            continue;
        };
        let Some(tokens) = embedding_tokens(size, per_token) else {
            continue;
        };
        if found.as_ref().is_none_or(|(t, _)| tokens > *t) {
            let site = f.to_string();
            found = Some((
                tokens,
                format!(
                    "the embedding's output live at the peak ({site}): {size} B = {tokens} tokens × {per_token} B (hidden size × dtype)"
                ),
            ));
        }
    }
    Ok(found.map(|(tokens, source)| StepPosition {
        chunk_index: 0,
        chunk_tokens: Some(tokens),
        context_tokens: Some(tokens),
        source,
        from_engine_loop: false,
        forward_starts: Vec::new(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_and_shapes_from_labels_and_names() {
        assert_eq!(
            chunk_of_label("prefill/chunk.27/layer.0/gdn/chunk_gated_delta_rule"),
            Some(27)
        );
        assert_eq!(chunk_of_label("prefill/weights"), None);
        assert_eq!(
            name_and_shape("q bf16[1, 4128, 16, 128]"),
            Some(("q", vec![1, 4128, 16, 128]))
        );
        assert_eq!(name_and_shape("weights"), None);
    }
}
