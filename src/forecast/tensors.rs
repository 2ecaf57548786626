//! The live view's per-tensor table (issue 20 item 3): the modelled step's tensors beside the
//! live allocations at the cursor, each with what its match rests on — `vramtrace compare` at
//! the cursor.
//!
//! The step is the whole-step model's at the current context ([`super::LiveModel`]); each of
//! its layer kinds' peaks (GDN, attention, MLP, logits: [`StepBreakdown::layers`]) is set beside
//! the live set with [`attribution::attribute`] at [`Moment::Peak`] (the tensors live at that
//! layer's modelled peak are the candidates), and the layer whose matches rest on evidence for
//! the most bytes is shown ([`Attribution::outranks`]); on a tie the step's activations peak
//! (the largest). Matches are weighed as `compare` weighs them ([`crate::evidence`]): one that
//! rests on a size shared by several live allocations, or that the allocation's frames
//! contradict, is not kept, and the row says `unmatched` with why. Weights, KV cache and state
//! are whole figures in the model (the category table), not named tensors, so they have no rows.

use vramtrace_models::{LayerPeak, StepBreakdown};
use vramtrace_view_model::{ModelTensor, ModelTensors, format_count};

use crate::attribution::{self, Attribution, MatchedBy, Moment, Observed};
use crate::evidence::{Evidence, python_site, source_file};

/// The table of the step `step` (prefilling `chunk` tokens at `context`) beside `observed`,
/// the live allocations at the cursor in time order.
pub(crate) fn table(
    step: &StepBreakdown,
    chunk: u64,
    context: u64,
    observed: Vec<Observed>,
) -> ModelTensors {
    let live: Vec<&Observed> = observed.iter().filter(|o| !o.failed).collect();
    let (live_count, live_bytes) = (live.len(), live.iter().map(|o| o.size).sum());
    let compare =
        |l: &LayerPeak| attribution::attribute(&l.tensors, observed.clone(), 1, Moment::Peak);
    let mut best = (&step.activations, compare(&step.activations));
    for l in step
        .layers
        .iter()
        .filter(|l| l.kind != step.activations.kind)
    {
        let a = compare(l);
        if a.outranks(&best.1) {
            best = (l, a);
        }
    }
    let (layer, a) = best;
    ModelTensors {
        title: format!(
            "{} layer's peak, chunk {} at context {}",
            layer.kind,
            format_count(chunk),
            format_count(context)
        ),
        rows: rows(layer, &a),
        live_count,
        live_bytes,
    }
}

/// One row per tensor live at the layer's modelled peak, in the model's order.
fn rows(layer: &LayerPeak, a: &Attribution) -> Vec<ModelTensor> {
    a.rows
        .iter()
        .filter(|r| r.live_at_predicted_peak)
        .map(|r| {
            let o = r.observed.map(|oi| &a.observed[oi]);
            let line = match (o, &r.evidence) {
                // The frame in the cited file (`modeling_qwen3_5.py:568 forward` rather than
                // torch's `linear.py:134 forward` under it).
                (Some(_), Some(Evidence::Frame { frame })) => frame.clone(),
                (Some(o), _) => match (o.frames.first(), &o.label, &o.name) {
                    (Some(f), _, _) => f.clone(),
                    // The range it was made in says where (`prefill/chunk.3/layer.0/gdn`).
                    (None, Some(l), Some(n)) if l != n => format!("{l}: {n}"),
                    (None, Some(l), _) => l.clone(),
                    (None, None, Some(n)) => n.clone(),
                    (None, None, None) => format!("{} {}", o.api, o.ptr),
                },
                (None, Some(Evidence::Contradicted { frame, .. })) => frame.clone(),
                (None, _) => {
                    let source = layer.tensors[r.tensor].source;
                    match (python_site(source), source_file(source)) {
                        (Some(site), _) => format!("model: {site}"),
                        (None, Some(file)) => format!("model: {file}"),
                        (None, None) => format!("model: {source}"),
                    }
                }
            };
            ModelTensor {
                name: r.name.clone(),
                modelled_bytes: r.predicted_bytes,
                observed_bytes: o.map(|o| o.size),
                line,
                basis: basis(
                    r.matched_by,
                    r.evidence.as_ref(),
                    python_site(layer.tensors[r.tensor].source).is_some_and(|s| s.line.is_some()),
                ),
            }
        })
        .collect()
}

/// What a row's match rests on, in the table's words (`cites_line`: the model cites the line,
/// not only the file).
fn basis(how: Option<MatchedBy>, evidence: Option<&Evidence>, cites_line: bool) -> String {
    match (how, evidence) {
        (_, Some(Evidence::Ambiguous { candidates })) => {
            format!("unmatched: {candidates} alike")
        }
        (_, Some(Evidence::Contradicted { .. })) => "unmatched: other code".into(),
        (None, _) => "unmatched".into(),
        (Some(_), Some(Evidence::Label)) => "name".into(),
        (Some(_), Some(Evidence::LabelOtherSize { .. })) => "name, other size".into(),
        (Some(_), Some(Evidence::Frame { .. })) if cites_line => "frame at its line".into(),
        (Some(_), Some(Evidence::Frame { .. })) => "frame in its file".into(),
        (Some(_), Some(Evidence::Shape { .. })) => "operator and shape".into(),
        (Some(MatchedBy::OrderAndSize), _) => "order and size".into(),
        (Some(_), _) => "size only".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basis_words() {
        assert_eq!(basis(None, None, true), "unmatched");
        assert_eq!(
            basis(None, Some(&Evidence::Ambiguous { candidates: 3 }), true),
            "unmatched: 3 alike"
        );
        assert_eq!(
            basis(
                Some(MatchedBy::Frame),
                Some(&Evidence::Frame {
                    frame: "chunk_o.py:565 chunk_fwd_o".into()
                }),
                true
            ),
            "frame at its line"
        );
        assert_eq!(
            basis(
                Some(MatchedBy::Frame),
                Some(&Evidence::Frame {
                    frame: "modeling_qwen3_5.py:912 forward".into()
                }),
                false
            ),
            "frame in its file"
        );
        assert_eq!(
            basis(
                Some(MatchedBy::OrderAndSize),
                Some(&Evidence::SizeOnly { same_size: 1 }),
                false
            ),
            "order and size"
        );
        assert_eq!(
            basis(
                Some(MatchedBy::Size),
                Some(&Evidence::SizeOnly { same_size: 2 }),
                false
            ),
            "size only"
        );
        assert_eq!(
            basis(Some(MatchedBy::Label), Some(&Evidence::Label), false),
            "name"
        );
    }
}
