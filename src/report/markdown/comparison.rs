//! The model set beside a moment: every tensor with what its match rests on.

use super::*;

/// What a row's match rests on, or why a tensor of the same size was not matched (the words of
/// `vramtrace compare`'s evidence column).
pub(super) fn evidence_words(e: &Evidence) -> String {
    match e {
        Evidence::Label => "named as the tensor".into(),
        Evidence::Frame { frame } => format!("frame {} in the modelled file", code(&cell(frame))),
        Evidence::SizeOnly { same_size } => format!("size and order only ({same_size} alike)"),
        Evidence::Ambiguous { candidates } => {
            format!("**ambiguous**: {candidates} live allocations of this size")
        }
        Evidence::Contradicted { frame, expected } => format!(
            "**other code**: allocated at {}, not in {}",
            code(&cell(frame)),
            code(&cell(expected))
        ),
        Evidence::Shape { op } => format!("shape and dtype of {}", code(&cell(op))),
    }
}

/// Where a matched allocation came from: what the trace says it holds (dtype and shape) and its
/// innermost Python frame.
pub(super) fn allocation_words(c: &Comparison, oi: usize) -> String {
    let o = &c.attribution.observed[oi];
    let what = match c.held.get(oi).and_then(Option::as_deref) {
        _ if o.failed => "the request".to_string(),
        Some(h) => code(&cell(h)),
        None if o.op.is_some() => code(&cell(&o.op.as_ref().expect("checked").describe())),
        None if o.api == "pytorch" => "a PyTorch tensor".to_string(),
        None => code(o.api),
    };
    match o.frames.first() {
        Some(f) => format!("{what} at {}", code(&cell(f))),
        None => format!("{what}, no Python frame recorded"),
    }
}

/// The model set beside one moment: every tensor with what its match rests on and where the
/// allocation was made, then the headline.
pub(super) fn comparison(out: &mut String, r: &Report, c: &Comparison) {
    let a = &c.attribution;
    let failure = a.moment == Moment::Failure;
    let (tokens, name) = match &r.model {
        Some(m) => (m.opts.seqlens.iter().sum::<u64>(), m.cfg.display_name()),
        None => (0, String::new()),
    };
    let _ = writeln!(
        out,
        "The model at {}: **{}** on {name}, {tokens} tokens ({}); {}.\n",
        if failure { "that moment" } else { "the peak" },
        c.variant.name(),
        c.choice,
        c.variant.source()
    );
    let _ = writeln!(
        out,
        "| tensor | shape | dtype | predicted | observed | difference | matched by | evidence | allocation |\n| --- | --- | --- | ---: | ---: | ---: | --- | --- | --- |"
    );
    for row in &a.rows {
        let failed = a.failed_tensor == Some(row.tensor);
        let (obs, diff) = match row.observed {
            Some(_) if failed => ("**the failed request**".to_string(), "—".to_string()),
            Some(_) => (
                exact(row.observed_bytes),
                row.difference.unwrap_or(0).to_string(),
            ),
            None => (
                match &row.evidence {
                    Some(_) => "not matched",
                    None if failure => "not live",
                    None if !row.live_at_predicted_peak => "not live at the model's peak",
                    None => "not observed",
                }
                .to_string(),
                "—".to_string(),
            ),
        };
        let how = match row.matched_by {
            Some(MatchedBy::Label) => "name",
            Some(MatchedBy::Frame) => "frame and size",
            Some(MatchedBy::OrderAndSize) => "order and size",
            Some(MatchedBy::Size) => "size",
            None => "",
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {obs} | {diff} | {how} | {} | {} |",
            code(&cell(&row.name)),
            cell(&row.shape),
            row.dtype,
            exact(row.predicted_bytes),
            row.evidence
                .as_ref()
                .map(evidence_words)
                .unwrap_or_default(),
            row.observed
                .map(|oi| allocation_words(c, oi))
                .unwrap_or_default()
        );
    }
    let _ = writeln!(
        out,
        "\nOf {} live: matched to the model {}, named but not in the model {}, neither {}.",
        both(a.observed_bytes),
        both(a.attributed_bytes),
        both(a.named_only_bytes),
        both(a.unexplained_bytes)
    );
    evidence_headline(out, a);
    if !failure {
        let _ = writeln!(out);
        return;
    }
    match a.failed_tensor {
        Some(ti) => {
            let row = &a.rows[ti];
            let _ = writeln!(
                out,
                "The failed request is {} {} {} ({} predicted), allocated at {}.\n",
                code(&row.name),
                row.dtype,
                row.shape,
                both(row.predicted_bytes),
                code(&row.source)
            );
        }
        None => {
            let _ = writeln!(out, "The failed request matches no tensor of this model.\n");
        }
    }
}

/// What the matched bytes rest on, the tensors left unmatched among look-alikes or by their
/// frames, and the sentence that says the program ran another implementation.
pub(super) fn evidence_headline(out: &mut String, a: &Attribution) {
    let ev = &a.evidence;
    let _ = writeln!(
        out,
        "Of the matched: backed by a name or a frame in the modelled file {}, by size and order alone {}; {} tensor(s) ambiguous among look-alikes, {} contradicted by their frames.",
        both(ev.evidence_bytes),
        both(ev.size_only_bytes),
        ev.ambiguous,
        ev.contradicted
    );
    if ev.size_only_bytes > 0 && ev.evidence_bytes == 0 {
        let _ = writeln!(
            out,
            "Size and order alone do not show that these allocations are the model's tensors: record with the Python probe (its frames) or name the tensors to confirm it."
        );
    }
    if let Some(n) = &ev.other_implementation {
        let _ = writeln!(out, "**{}.**", upper_first(n));
    }
}
