//! Attribution: which observed allocation is which predicted tensor.
//!
//! Given a model's tensor list (in the order the upstream code allocates) and the allocations a
//! trace shows at one moment (a peak, a failed allocation) or over a window, each predicted
//! tensor is matched to at most one observed allocation, in four passes:
//! 1. **label**: an allocation named through the annotation ABI, or made inside a range whose
//!    innermost name is the tensor's name, matches that tensor;
//! 2. **frame and size**: an allocation of the tensor's size with a Python frame at the module
//!    path and line the model cites for it (`fla/ops/common/chunk_o.py:565` for fla 0.6.0's
//!    `o`; see [`crate::evidence::PythonSite`]);
//! 3. **order and size**: the remaining tensors, in allocation order, take the next remaining
//!    allocation (in time order) of the same size — a kernel allocates in program order;
//! 4. **size**: what is left pairs by equal size regardless of order.
//!
//! An allocation named through the annotation ABI is only ever matched by its name: one named
//! `input g` is not fla's `g (cumsum)`, even though both are fp32 `[T, H]`.
//!
//! Sizes compare after rounding both up to `align` bytes (1 for driver-level traces with
//! PyTorch's caching off; 512 to compare with PyTorch's block sizes). The result lists every
//! tensor with its predicted and observed bytes, and every observed allocation nothing explains.
//!
//! Every match is then weighed ([`weigh`]): what it rests on is said per tensor in the words of
//! [`crate::evidence`], and a match that rests on nothing but a size shared by several live
//! allocations, or that the allocation's frames contradict, is dropped. The observed side of a
//! moment comes from [`crate::observe`].

use serde::Serialize;

use vramtrace_models::Tensor;

use crate::evidence::{Evidence, EvidenceSummary, frame_file, python_site};

/// One allocation seen in a trace, as attribution needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Observed {
    /// Bytes requested.
    pub size: u64,
    /// When it was made (ns, trace clock).
    pub t_ns: u64,
    /// Pointer, hex.
    pub ptr: String,
    /// The driver function.
    pub api: &'static str,
    /// Name given through the annotation ABI.
    pub name: Option<String>,
    /// Range label active when it was made.
    pub label: Option<String>,
    /// True for the request that failed (the moment attributed is its failure).
    pub failed: bool,
    /// Its Python frames, innermost first, as `file.py:LINE function` (the PyTorch probe's own
    /// frames skipped): what [`crate::evidence`] weighs a size match against.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frames: Vec<String>,
    /// The path of each of `frames` as the interpreter recorded it
    /// (`/site/fla/ops/common/chunk_o.py`): a frame backs a tensor only at the module path and
    /// line the model cites ([`crate::evidence::PythonSite`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frame_files: Vec<String>,
    /// The operator output it holds (`vramtrace run --torch-shapes`): a description, not a
    /// name, so the allocation is still matched by size and its shape is weighed as evidence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<OpOutput>,
}

/// An operator's output tensor as the PyTorch probe described it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OpOutput {
    /// The operator (`empty_like`).
    pub op: String,
    /// PyTorch's dtype name (`bfloat16`), empty if none was given.
    pub dtype: String,
    /// The shape, outermost first.
    pub shape: Vec<i64>,
}

impl OpOutput {
    /// `empty_like [1, 4128, 48, 128] bfloat16`.
    pub fn describe(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(i64::to_string).collect();
        format!("{} [{}] {}", self.op, dims.join(", "), self.dtype)
            .trim_end()
            .to_string()
    }

    /// Whether it is an output of the operator the model names for `t` ([`Tensor::op`]),
    /// compared without the namespace (the probe records `_flash_attention_forward` for
    /// `aten::_flash_attention_forward`). A tensor whose operator the model does not name is
    /// the output of none.
    pub fn is_output_of(&self, t: &Tensor) -> bool {
        let bare = |s: &str| s.rsplit("::").next().unwrap_or(s).to_string();
        t.op.as_deref().is_some_and(|op| bare(op) == bare(&self.op))
    }

    /// Whether it has the model tensor's shape and dtype.
    pub fn is_shaped_like(&self, t: &Tensor) -> bool {
        self.shape.len() == t.shape.len()
            && self
                .shape
                .iter()
                .zip(&t.shape)
                .all(|(a, b)| u64::try_from(*a).is_ok_and(|a| a == *b))
            && self.dtype.parse::<vramtrace_models::DType>().ok() == Some(t.dtype)
    }
}

/// How a tensor was matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MatchedBy {
    /// Annotation name or range label.
    Label,
    /// Equal size, and a Python frame at the module path and line the model cites for it.
    Frame,
    /// Allocation order and equal size.
    OrderAndSize,
    /// Equal size only.
    Size,
}

/// One predicted tensor beside what was observed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// Index in the model's list.
    pub tensor: usize,
    /// Tensor name.
    pub name: String,
    /// Shape as PyTorch prints it.
    pub shape: String,
    /// Element type.
    pub dtype: String,
    /// Predicted bytes.
    pub predicted_bytes: u64,
    /// Whether the model has it live at the model's own peak.
    pub live_at_predicted_peak: bool,
    /// Index into the observed list of the allocation it matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed: Option<usize>,
    /// Observed bytes (0 if unmatched).
    pub observed_bytes: u64,
    /// Observed minus predicted (for matched tensors).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub difference: Option<i64>,
    /// How it was matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matched_by: Option<MatchedBy>,
    /// The upstream line the model cites.
    pub source: String,
    /// What the match rests on (see [`crate::evidence`]); for a tensor left unmatched because
    /// several live allocations look alike, or because the frames show other code, why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evidence: Option<Evidence>,
}

/// The outcome of matching.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attribution {
    /// Every predicted tensor, in the model's order.
    pub rows: Vec<Row>,
    /// The observed allocations, in time order (the failed request included, if any).
    pub observed: Vec<Observed>,
    /// Indices of observed allocations that matched no tensor.
    pub unexplained: Vec<usize>,
    /// Bytes of live (not failed) observed allocations.
    pub observed_bytes: u64,
    /// Of those, bytes matched to a predicted tensor.
    pub attributed_bytes: u64,
    /// Of those, bytes not matched to the model but named through the annotation ABI.
    pub named_only_bytes: u64,
    /// Of those, bytes neither matched nor named.
    pub unexplained_bytes: u64,
    /// What was compared.
    pub moment: Moment,
    /// The tensor the failed request was for, if the moment is a failure and it matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_tensor: Option<usize>,
    /// Of `attributed_bytes`, what rests on evidence (a name, or a frame in the modelled file)
    /// and what on size and order alone; ambiguous and contradicted matches.
    pub evidence: EvidenceSummary,
}

impl Attribution {
    /// Whether this attribution of a moment explains it better than `other` (another variant's
    /// of the same moment): more bytes backed by evidence (a name on an allocation of the
    /// tensor's size, a frame at the cited line, a shape from the named operator); the bytes
    /// matched without evidence (size and order alone, a name of another size) only break a tie.
    /// How `compare`, `report` and the plots choose a variant when none is named.
    pub fn outranks(&self, other: &Attribution) -> bool {
        let rank = |a: &Attribution| (a.evidence.evidence_bytes, a.attributed_bytes);
        rank(self) > rank(other)
    }

    /// Share of the observed live bytes that is matched to the model or named.
    pub fn named_fraction(&self) -> f64 {
        if self.observed_bytes == 0 {
            return 1.0;
        }
        (self.attributed_bytes + self.named_only_bytes) as f64 / self.observed_bytes as f64
    }
}

/// Letters and digits only, lower case: `g (cumsum)` and `g_cumsum` compare equal.
fn normalize(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// The innermost component of a label or name path (`prefill/layer.3/gdn/o` → `o`).
fn innermost(s: &str) -> &str {
    s.rsplit(['/', ':']).next().unwrap_or(s)
}

fn names_match(tensor: &str, observed: &str) -> bool {
    let t = normalize(tensor);
    !t.is_empty() && (normalize(observed) == t || normalize(innermost(observed)) == t)
}

fn round_up(v: u64, align: u64) -> u64 {
    if align <= 1 {
        v
    } else {
        v.div_ceil(align) * align
    }
}

/// What the observed allocations are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Moment {
    /// The live set at a peak: compared with the tensors live at the model's peak.
    Peak,
    /// The live set at a failed allocation plus the failed request (marked `failed`): compared
    /// with the tensors live just before each tensor the request could be, keeping the best.
    Failure,
    /// Every allocation of a window, live or not: compared with the whole list, in order.
    Window,
}

type Matches = (Vec<Option<(usize, MatchedBy)>>, Vec<bool>);

/// Matches the tensors flagged in `candidates` against `observed`, in the four passes.
fn match_set(
    tensors: &[Tensor],
    candidates: &[bool],
    observed: &[Observed],
    align: u64,
) -> Matches {
    let mut taken: Vec<Option<(usize, MatchedBy)>> = vec![None; tensors.len()];
    let mut used = vec![false; observed.len()];
    let size_ok = |t: &Tensor, o: &Observed| round_up(t.bytes, align) == round_up(o.size, align);
    let open =
        |ti: usize, taken: &[Option<(usize, MatchedBy)>]| candidates[ti] && taken[ti].is_none();

    // 1. Labels: the annotation name first, then the innermost range name, in time order.
    for (oi, o) in observed.iter().enumerate() {
        let Some(label) = o.name.as_deref().or(o.label.as_deref()) else {
            continue;
        };
        if let Some(ti) =
            (0..tensors.len()).find(|&ti| open(ti, &taken) && names_match(&tensors[ti].name, label))
        {
            taken[ti] = Some((oi, MatchedBy::Label));
            used[oi] = true;
        }
    }
    // 2. Frame and size: an allocation made at the line the model cites for the tensor (fla's
    //    `w` and `o` have one size; `wy_fast.py:273` and `chunk_o.py:565` tell them apart).
    for ti in 0..tensors.len() {
        if !open(ti, &taken) {
            continue;
        }
        let Some(site) = python_site(tensors[ti].source) else {
            continue;
        };
        if let Some(oi) = (0..observed.len()).find(|&oi| {
            let o = &observed[oi];
            !used[oi]
                && o.name.is_none()
                && size_ok(&tensors[ti], o)
                && site.find_in(&o.frames, &o.frame_files).is_some()
        }) {
            taken[ti] = Some((oi, MatchedBy::Frame));
            used[oi] = true;
        }
    }
    // 3. Order and size.
    let mut cursor = 0;
    for ti in 0..tensors.len() {
        if !open(ti, &taken) {
            continue;
        }
        if let Some(oi) = (cursor..observed.len()).find(|&oi| {
            !used[oi] && observed[oi].name.is_none() && size_ok(&tensors[ti], &observed[oi])
        }) {
            taken[ti] = Some((oi, MatchedBy::OrderAndSize));
            used[oi] = true;
            cursor = oi + 1;
        }
    }
    // 4. Size alone.
    for ti in 0..tensors.len() {
        if !open(ti, &taken) {
            continue;
        }
        if let Some(oi) = (0..observed.len()).find(|&oi| {
            !used[oi] && observed[oi].name.is_none() && size_ok(&tensors[ti], &observed[oi])
        }) {
            taken[ti] = Some((oi, MatchedBy::Size));
            used[oi] = true;
        }
    }
    (taken, used)
}

fn matched_bytes(observed: &[Observed], used: &[bool]) -> u64 {
    observed
        .iter()
        .zip(used)
        .filter(|(o, u)| **u && !o.failed)
        .map(|(o, _)| o.size)
        .sum()
}

/// The `api` of observations that are blocks of PyTorch's caching allocator (TENSOR records).
pub const PYTORCH_BLOCK_API: &str = "pytorch";

/// PyTorch's caching allocator rounds every block up to this many bytes.
pub const PYTORCH_BLOCK: u64 = 512;

/// Matches `tensors` (model order) against `observed` (time order) at a [`Moment`]. Sizes
/// compare after rounding up to `align` bytes, and to at least [`PYTORCH_BLOCK`] when the
/// observations are PyTorch's blocks.
pub fn attribute(
    tensors: &[Tensor],
    observed: Vec<Observed>,
    align: u64,
    moment: Moment,
) -> Attribution {
    // PyTorch's caching allocator hands out blocks in multiples of 512 bytes: a 16-byte
    // `rng_state` is a 512-byte block.
    let align = if observed.iter().any(|o| o.api == PYTORCH_BLOCK_API) {
        align.max(PYTORCH_BLOCK)
    } else {
        align
    };
    let peak = vramtrace_models::peak(tensors);
    let all = vec![true; tensors.len()];
    let (taken, used) = match moment {
        Moment::Window => match_set(tensors, &all, &observed, align),
        Moment::Peak => {
            let mut c = vec![false; tensors.len()];
            for &i in &peak.live {
                c[i] = true;
            }
            match_set(tensors, &c, &observed, align)
        }
        Moment::Failure => {
            // The request is one of the tensors; the live set is what the model holds just
            // before that tensor is allocated. Try each tensor the request could be.
            let failed: Vec<usize> = (0..observed.len())
                .filter(|&oi| observed[oi].failed)
                .collect();
            let mut best: Option<(u64, Matches)> = None;
            for j in 0..tensors.len() {
                let t = &tensors[j];
                let fits = failed.iter().any(|&oi| {
                    let o = &observed[oi];
                    round_up(o.size, align) == round_up(t.bytes, align)
                        || o.label.as_deref().is_some_and(|l| names_match(&t.name, l))
                });
                if !fits {
                    continue;
                }
                let step = t.alloc_at;
                let mut c: Vec<bool> = tensors
                    .iter()
                    .map(|x| step > 0 && x.is_live_after(step - 1))
                    .collect();
                c[j] = true;
                let m = match_set(tensors, &c, &observed, align);
                let score = matched_bytes(&observed, &m.1)
                    + u64::from(m.0[j].is_some_and(|(oi, _)| observed[oi].failed));
                if best.as_ref().is_none_or(|(b, _)| score > *b) {
                    best = Some((score, m));
                }
            }
            best.map(|(_, m)| m)
                .unwrap_or_else(|| match_set(tensors, &all, &observed, align))
        }
    };

    let rows = tensors
        .iter()
        .enumerate()
        .map(|(ti, t)| {
            let m = taken[ti];
            let observed_bytes = m.map_or(0, |(oi, _)| observed[oi].size);
            Row {
                tensor: ti,
                name: t.name.clone(),
                shape: t.shape_string(),
                dtype: t.dtype.to_string(),
                predicted_bytes: t.bytes,
                live_at_predicted_peak: peak.live.contains(&ti),
                observed: m.map(|(oi, _)| oi),
                observed_bytes,
                difference: m.map(|_| observed_bytes as i64 - t.bytes as i64),
                matched_by: m.map(|(_, how)| how),
                source: t.source.to_string(),
                evidence: None,
            }
        })
        .collect();
    let failed_tensor = taken
        .iter()
        .position(|m| m.is_some_and(|(oi, _)| observed[oi].failed));
    let mut a = Attribution {
        rows,
        unexplained: (0..observed.len()).filter(|&oi| !used[oi]).collect(),
        observed_bytes: 0,
        attributed_bytes: 0,
        named_only_bytes: 0,
        unexplained_bytes: 0,
        failed_tensor,
        moment,
        observed: Vec::new(),
        evidence: Default::default(),
    };
    for (oi, o) in observed.iter().enumerate() {
        if o.failed {
            continue;
        }
        a.observed_bytes += o.size;
        if used[oi] {
            a.attributed_bytes += o.size;
        } else if o.name.is_some() {
            a.named_only_bytes += o.size;
        } else {
            a.unexplained_bytes += o.size;
        }
    }
    a.observed = observed;
    weigh(&mut a, tensors, align);
    a
}

/// Weighs every match of `a` (made by [`attribute`]) and drops those that
/// are ambiguous or contradicted, moving their bytes to the unexplained.
pub fn weigh(a: &mut Attribution, tensors: &[Tensor], align: u64) {
    let mut s = EvidenceSummary::default();
    // Pass 1: names and frames.
    let mut size_rows = Vec::new();
    let mut drop = Vec::new();
    for (ri, row) in a.rows.iter_mut().enumerate() {
        let (Some(oi), Some(how)) = (row.observed, row.matched_by) else {
            continue;
        };
        let o = &a.observed[oi];
        if how == MatchedBy::Label {
            // A name is evidence only for an allocation of the tensor's size.
            row.evidence = Some(
                if round_up(o.size, align) == round_up(row.predicted_bytes, align) {
                    Evidence::Label
                } else {
                    Evidence::LabelOtherSize {
                        difference: o.size as i64 - row.predicted_bytes as i64,
                    }
                },
            );
            continue;
        }
        // Only a tensor the model says is allocated in Python can be confirmed or contradicted
        // by Python frames: one allocated in C++ (`flash_api.cpp`) has only its caller's.
        let want = python_site(tensors[row.tensor].source);
        let hit = want.and_then(|w| w.find_in(&o.frames, &o.frame_files));
        match (hit, o.frames.first(), want) {
            (Some(f), _, _) => row.evidence = Some(Evidence::Frame { frame: f.clone() }),
            (None, Some(first), Some(w)) => {
                row.evidence = Some(Evidence::Contradicted {
                    frame: first.clone(),
                    expected: w.to_string(),
                });
                drop.push(ri);
            }
            _ => match &o.op {
                // The shape of an output of another operator says nothing: FlashAttention's
                // `out` has the shape of its input `q`.
                Some(op)
                    if op.is_output_of(&tensors[row.tensor])
                        && op.is_shaped_like(&tensors[row.tensor]) =>
                {
                    row.evidence = Some(Evidence::Shape { op: op.describe() })
                }
                _ => size_rows.push(ri),
            },
        }
    }
    // Pass 2: size and order alone, against the unnamed allocations of the same size: the live
    // ones and, at a failure, the failed request, which is a claimant's allocation as much as
    // a live one is (leaving it out under-counts the look-alikes by one).
    for &ri in &size_rows {
        let size = round_up(a.rows[ri].predicted_bytes, align);
        let alike = a
            .observed
            .iter()
            .enumerate()
            .filter(|(oi, o)| {
                o.name.is_none()
                    && round_up(o.size, align) == size
                    && !a.rows.iter().any(|r| {
                        r.observed == Some(*oi)
                            && r.evidence.as_ref().is_some_and(Evidence::is_backed)
                    })
            })
            .count();
        let claimants = size_rows
            .iter()
            .filter(|&&rj| round_up(a.rows[rj].predicted_bytes, align) == size)
            .count();
        let failed_request = a.rows[ri].observed.is_some_and(|oi| a.observed[oi].failed);
        if alike > claimants && !failed_request {
            a.rows[ri].evidence = Some(Evidence::Ambiguous { candidates: alike });
            drop.push(ri);
        } else {
            a.rows[ri].evidence = Some(Evidence::SizeOnly {
                same_size: alike.max(1),
            });
        }
    }
    for &ri in &drop {
        let row = &mut a.rows[ri];
        let oi = row.observed.take().expect("dropped rows were matched");
        row.matched_by = None;
        row.difference = None;
        row.observed_bytes = 0;
        let o = &a.observed[oi];
        if a.failed_tensor == Some(ri) {
            a.failed_tensor = None;
        }
        if !o.failed {
            a.attributed_bytes -= o.size;
            if o.name.is_some() {
                a.named_only_bytes += o.size;
            } else {
                a.unexplained_bytes += o.size;
            }
        }
        a.unexplained.push(oi);
        match row.evidence {
            Some(Evidence::Ambiguous { .. }) => s.ambiguous += 1,
            _ => s.contradicted += 1,
        }
    }
    a.unexplained.sort_unstable();
    for row in &a.rows {
        let Some(oi) = row.observed else { continue };
        if a.observed[oi].failed {
            continue;
        }
        if row.evidence.as_ref().is_some_and(Evidence::is_backed) {
            s.evidence_bytes += a.observed[oi].size
        } else if matches!(row.evidence, Some(Evidence::LabelOtherSize { .. })) {
            s.named_other_size_bytes += a.observed[oi].size
        } else {
            s.size_only_bytes += a.observed[oi].size
        }
    }
    // Every tensor whose look-alike was allocated by other code is counted and its files named,
    // whether or not the modelled code allocated others: one frame-backed tensor does not make
    // the others' allocations the model's.
    if s.contradicted > 0 {
        let mut files: Vec<&str> = a
            .rows
            .iter()
            .filter_map(|r| match &r.evidence {
                Some(Evidence::Contradicted { frame, .. }) => Some(frame_file(frame)),
                _ => None,
            })
            .collect();
        files.sort_unstable();
        files.dedup();
        let at_site = a
            .rows
            .iter()
            .filter(|r| matches!(r.evidence, Some(Evidence::Frame { .. })))
            .count();
        let whole = if at_site == 0 {
            "the program ran another implementation than the model's variant".to_string()
        } else {
            format!(
                "another implementation allocated them, although {at_site} other tensor(s) were allocated where the model's variant allocates them"
            )
        };
        s.other_implementation = Some(format!(
            "{} tensor(s) of the model have same-size allocations made by other code ({}), not where the model cites: {whole}",
            s.contradicted,
            files.join(", ")
        ));
    }
    a.evidence = s;
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramtrace_models::{DType, Timeline};

    fn obs(size: u64, t: u64, name: Option<&str>) -> Observed {
        Observed {
            size,
            t_ns: t,
            ptr: format!("{t:#x}"),
            api: "cuMemAlloc_v2",
            name: name.map(str::to_string),
            label: None,
            failed: false,
            frames: Vec::new(),
            frame_files: Vec::new(),
            op: None,
        }
    }

    fn model() -> Vec<Tensor> {
        let mut tl = Timeline::new();
        let a = tl.alloc("A (fp32)", &[100, 64], DType::F32, "test");
        let _ai = tl.alloc("Ai", &[100, 64], DType::BF16, "test");
        tl.free(a);
        let _w = tl.alloc("w", &[100, 128], DType::BF16, "test");
        let _u = tl.alloc("u", &[100, 128], DType::BF16, "test");
        tl.finish().unwrap()
    }

    #[test]
    fn order_and_size_then_labels() {
        // At the peak the fp32 A (also 25600 bytes) is gone: the two 25600-byte allocations are
        // w and u, in that order; an annotated allocation matches by name.
        let observed = vec![
            obs(12800, 1, Some("Ai")),
            obs(25600, 2, None),
            obs(25600, 3, None),
            obs(999, 4, None),
            obs(4096, 5, Some("input q")),
        ];
        let a = attribute(&model(), observed, 1, Moment::Peak);
        let by_name: Vec<(&str, Option<usize>, Option<MatchedBy>)> = a
            .rows
            .iter()
            .map(|r| (r.name.as_str(), r.observed, r.matched_by))
            .collect();
        assert_eq!(
            by_name,
            vec![
                ("A (fp32)", None, None),
                ("Ai", Some(0), Some(MatchedBy::Label)),
                ("w", Some(1), Some(MatchedBy::OrderAndSize)),
                ("u", Some(2), Some(MatchedBy::OrderAndSize)),
            ]
        );
        assert_eq!(a.unexplained, vec![3, 4]);
        assert_eq!(a.observed_bytes, 12800 + 25600 * 2 + 999 + 4096);
        assert_eq!(a.attributed_bytes, 12800 + 25600 * 2);
        assert_eq!(a.named_only_bytes, 4096);
        assert_eq!(a.unexplained_bytes, 999);
        // The fp32 A is freed before w and u exist: not live at the model's peak.
        assert!(!a.rows[0].live_at_predicted_peak);
        assert!(a.rows[3].live_at_predicted_peak);
    }

    #[test]
    fn failed_request_is_attributed_to_the_tensor_whose_predecessors_are_live() {
        // Live: Ai and w; the failed 25600-byte request is u (not A, not w: the model holds
        // exactly Ai and w just before u).
        let mut observed = vec![
            obs(12800, 2, None),
            obs(25600, 3, None),
            obs(25600, 4, None),
        ];
        observed[2].failed = true;
        let a = attribute(&model(), observed, 1, Moment::Failure);
        assert_eq!(a.failed_tensor, Some(3));
        assert_eq!(a.rows[1].observed, Some(0));
        assert_eq!(a.rows[2].observed, Some(1));
        assert_eq!(a.rows[0].observed, None);
        assert_eq!(a.observed_bytes, 12800 + 25600);
        assert_eq!(a.attributed_bytes, 12800 + 25600);
    }

    #[test]
    fn alignment_rounds_both_sides() {
        let observed = vec![
            obs(25600, 1, None),
            obs(12800, 2, None),
            obs(25600 - 100, 3, None),
        ];
        let exact = attribute(&model(), observed.clone(), 1, Moment::Window);
        assert_eq!(exact.rows[2].observed, None);
        let a = attribute(&model(), observed, 512, Moment::Window);
        assert_eq!(a.rows[2].observed, Some(2));
        assert_eq!(a.rows[2].difference, Some(-100));
    }

    #[test]
    fn a_named_allocation_is_never_taken_for_another_tensor_of_its_size() {
        // The caller's own g is fp32 [T, H] like fla's g cumsum; only the unnamed one is the
        // kernel's.
        let mut tl = Timeline::new();
        tl.alloc("g (cumsum)", &[100, 4], DType::F32, "test");
        let model = tl.finish().unwrap();
        let observed = vec![obs(1600, 1, Some("input g")), obs(1600, 2, None)];
        let a = attribute(&model, observed, 1, Moment::Window);
        assert_eq!(a.rows[0].observed, Some(1));
        assert_eq!(a.named_only_bytes, 1600);
        assert_eq!(a.unexplained_bytes, 0);
    }

    #[test]
    fn names_normalise() {
        assert!(names_match("g (cumsum)", "g_cumsum"));
        assert!(names_match("o", "prefill/layer.3/gdn/o"));
        assert!(!names_match("v", "v_new"));
    }
}

#[cfg(test)]
mod evidence_tests {
    use super::*;
    use crate::evidence::source_file;
    use vramtrace_models::{DType, GdnShape, gdn_fla_0_6_0};

    fn fla() -> Vec<Tensor> {
        gdn_fla_0_6_0::tensors(&GdnShape::new(&[4128], 48, 128, 128, DType::BF16)).unwrap()
    }

    /// PyTorch's FlashAttention as validated on the H200: 4128 tokens, 24/4 heads, d=256.
    fn torch_fa() -> Vec<Tensor> {
        vramtrace_models::fa_pytorch::tensors(&vramtrace_models::FaShape {
            seqlens_q: vec![4128],
            max_seqlen_k: 262144,
            num_heads: 24,
            num_heads_k: 4,
            head_dim: 256,
            dtype: DType::BF16,
            num_sms: 132,
        })
        .unwrap()
    }

    /// One observation per tensor live at the model's peak, made by `f` from its index and
    /// itself, in the model's order.
    fn at_peak(t: &[Tensor], f: impl Fn(usize, &Tensor) -> Observed) -> Vec<Observed> {
        let peak = vramtrace_models::peak(t);
        t.iter()
            .enumerate()
            .filter(|(i, _)| peak.live.contains(i))
            .map(|(i, x)| f(i, x))
            .collect()
    }

    /// An observation whose Python frames are given as `path/file.py:LINE function`: each is
    /// shown by its file name (`file.py:LINE function`) with its path beside it, as `observe`
    /// makes them.
    fn obs(size: u64, t: u64, frames: &[&str]) -> Observed {
        let (frames, frame_files) = frames
            .iter()
            .map(|f| {
                let path = f.split(':').next().unwrap();
                let base = path.rsplit('/').next().unwrap();
                (format!("{base}{}", &f[path.len()..]), path.to_string())
            })
            .unzip();
        Observed {
            size,
            t_ns: t,
            ptr: format!("{t:#x}"),
            api: "cuMemAlloc_v2",
            name: None,
            label: None,
            failed: false,
            frames,
            frame_files,
            op: None,
        }
    }

    /// `/site/PATH:LINE f`, the frame of an allocation at the line the model cites for `x`.
    fn cited_frame(x: &Tensor) -> String {
        let site = crate::evidence::python_site(x.source).unwrap();
        format!("/site/{site} f")
    }

    #[test]
    fn source_files_are_read_from_the_models_citations() {
        let t = fla();
        let files: Vec<&str> = t.iter().filter_map(|t| source_file(t.source)).collect();
        assert_eq!(
            files.len(),
            t.len(),
            "{:?}",
            t.iter().map(|t| t.source).collect::<Vec<_>>()
        );
        assert!(files.contains(&"chunk_o.py"), "{files:?}");
    }

    #[test]
    fn a_gdn_layer_that_never_called_fla_is_not_matched_among_look_alikes() {
        // The case: 455 unnamed live allocations, among them tensors of every size fla
        // would allocate, made by another GDN implementation (no frames recorded).
        let t = fla();
        let mut o = Vec::new();
        let mut n = 0u64;
        for _ in 0..3 {
            for x in &t {
                n += 1;
                o.push(obs(x.bytes, n, &[]));
            }
        }
        while o.len() < 455 {
            n += 1;
            o.push(obs(1 << 20, n, &[]));
        }
        let a = attribute(&t, o, 1, Moment::Peak);
        for r in &a.rows {
            if !r.live_at_predicted_peak {
                continue;
            }
            assert!(
                r.observed.is_none(),
                "{} must not be reported as matched",
                r.name
            );
            assert!(
                matches!(r.evidence, Some(Evidence::Ambiguous { candidates }) if candidates >= 3),
                "{r:?}"
            );
        }
        assert_eq!(a.attributed_bytes, 0);
        assert_eq!(a.evidence.evidence_bytes, 0);
        assert!(a.evidence.ambiguous > 0);
    }

    #[test]
    fn frames_in_the_modelled_file_back_a_match_and_other_files_contradict_it() {
        let t = fla();
        let o = at_peak(&t, |i, x| {
            let f = if x.name == "o" {
                "/app/other_gdn.py:88 forward".to_string()
            } else {
                cited_frame(x)
            };
            obs(x.bytes, i as u64, &[f.as_str(), "/app/model.py:3 forward"])
        });
        let a = attribute(&t, o, 1, Moment::Peak);
        let row = |n: &str| a.rows.iter().find(|r| r.name == n).unwrap();
        assert!(
            matches!(row("h").evidence, Some(Evidence::Frame { ref frame }) if frame.starts_with("chunk_delta_h.py")),
            "{:?}",
            row("h")
        );
        assert!(row("o").observed.is_none());
        assert!(
            matches!(row("o").evidence, Some(Evidence::Contradicted { ref expected, .. }) if expected == "fla/ops/common/chunk_o.py:565")
        );
        // The other tensors were allocated at fla's lines: fla ran, and o's look-alike, made by
        // other code, is still said (the headline counts it).
        let said = a.evidence.other_implementation.as_deref().unwrap();
        assert!(said.starts_with("1 tensor(s)"), "{said}");
        assert!(said.contains("(other_gdn.py)"), "{said}");
        assert!(
            !said.contains("the program ran another implementation"),
            "{said}"
        );
        assert_eq!(a.evidence.size_only_bytes, 0);
        assert_eq!(a.evidence.evidence_bytes, a.attributed_bytes);
    }

    #[test]
    fn a_gdn_layer_allocating_in_its_own_file_is_another_implementation() {
        // scripts/validate/naive_gdn.py: fla's buffer shapes, allocated by another file.
        let t = fla();
        let o = at_peak(&t, |i, x| {
            obs(
                x.bytes,
                i as u64,
                &[&format!("naive_gdn.py:{} naive_chunk_gdn", 40 + i)],
            )
        });
        let a = attribute(&t, o, 1, Moment::Peak);
        assert_eq!(a.attributed_bytes, 0);
        assert!(a.rows.iter().all(|r| r.observed.is_none()));
        assert!(
            a.evidence
                .other_implementation
                .as_deref()
                .is_some_and(|s| s.contains("naive_gdn.py")),
            "{:?}",
            a.evidence
        );
    }

    #[test]
    fn operator_outputs_are_matched_by_size_and_their_shape_backs_the_match() {
        // `--torch-shapes` describes every operator output. Those descriptions are not names: the
        // tensors are still matched, and an equal shape and dtype is evidence; a different shape
        // of the same size is not, and nothing is contradicted by it.
        use crate::attribution::OpOutput;
        let t = fla();
        let o = at_peak(&t, |i, x| {
            let mut ob = obs(x.bytes, i as u64, &[]);
            let shape: Vec<i64> = if x.name == "o" {
                vec![x.bytes as i64 / 2]
            } else {
                x.shape.iter().map(|&d| d as i64).collect()
            };
            // The operator fla's code calls for it (`k.new_empty` for h: `new_empty`).
            ob.op = Some(OpOutput {
                op: x.op.as_deref().unwrap().trim_start_matches("aten::").into(),
                dtype: x.dtype.to_string(),
                shape,
            });
            ob
        });
        let a = attribute(&t, o, 1, Moment::Peak);
        let row = |n: &str| a.rows.iter().find(|r| r.name == n).unwrap();
        assert!(
            matches!(row("h").evidence, Some(Evidence::Shape { ref op }) if op.starts_with("new_empty [1, 65, 48, 128, 128] bfloat16")),
            "{:?}",
            row("h")
        );
        assert!(row("o").observed.is_some(), "{:?}", row("o"));
        assert!(
            matches!(row("o").evidence, Some(Evidence::SizeOnly { .. })),
            "{:?}",
            row("o")
        );
        assert_eq!(a.named_only_bytes, 0);
        assert_eq!(a.unexplained_bytes, 0);
        assert_eq!(
            a.evidence.size_only_bytes,
            row("o").observed_bytes,
            "only o rests on size alone"
        );
    }

    #[test]
    fn python_frames_neither_confirm_nor_contradict_a_tensor_allocated_in_cpp() {
        // PyTorch's FlashAttention allocates softmax_lse in flash_api.cpp: the Python frame of
        // the allocation is the caller's line, which says nothing against the model.
        let t = torch_fa();
        let o: Vec<Observed> = t
            .iter()
            .enumerate()
            .map(|(i, x)| obs(x.bytes, i as u64, &["model_vs_torch.py:167 call"]))
            .collect();
        let a = attribute(&t, o, 1, Moment::Window);
        for r in &a.rows {
            assert!(r.observed.is_some(), "{r:?}");
            assert!(
                matches!(r.evidence, Some(Evidence::SizeOnly { .. })),
                "{r:?}"
            );
        }
        assert_eq!(a.evidence.contradicted, 0);
    }

    #[test]
    fn same_size_tensors_are_told_apart_by_their_frames_not_their_order() {
        // fla's w, u, v_new and o have one size. Listed in reverse time order, order and size
        // alone would pair each with another's allocation (and the frames would then read as
        // "other code"); the frame pass pairs each with the allocation made in its own file.
        let t = fla();
        let mut o = at_peak(&t, |i, x| obs(x.bytes, 1000 - i as u64, &[&cited_frame(x)]));
        o.sort_by_key(|x| x.t_ns);
        let a = attribute(&t, o, 1, Moment::Peak);
        for r in a.rows.iter().filter(|r| r.live_at_predicted_peak) {
            assert!(r.observed.is_some(), "{r:?}");
            let want = source_file(t[r.tensor].source).unwrap();
            assert!(
                matches!(r.evidence, Some(Evidence::Frame { ref frame }) if frame.starts_with(want)),
                "{r:?}"
            );
            assert_eq!(r.matched_by, Some(MatchedBy::Frame), "{r:?}");
        }
        assert_eq!(a.evidence.contradicted, 0);
        assert_eq!(a.unexplained_bytes, 0);
    }

    #[test]
    fn a_name_backs_a_match_only_when_the_size_fits() {
        // `o` named as the tensor but 4096 bytes larger than the model says: still matched (the
        // row shows the difference), but the name is not evidence for it.
        let t = fla();
        let o = at_peak(&t, |i, x| {
            let mut ob = obs(x.bytes, i as u64, &[]);
            ob.name = Some(x.name.clone());
            if x.name == "o" {
                ob.size += 4096;
            }
            ob
        });
        let a = attribute(&t, o, 1, Moment::Peak);
        let row = |n: &str| a.rows.iter().find(|r| r.name == n).unwrap();
        let ev = row("o").evidence.clone().unwrap();
        assert!(!ev.is_backed(), "{ev:?}");
        assert_eq!(
            ev.describe(),
            "named, but 4096 bytes larger than predicted",
            "{ev:?}"
        );
        assert_eq!(row("o").difference, Some(4096));
        assert_eq!(row("h").evidence, Some(Evidence::Label));
        assert_eq!(
            a.evidence.evidence_bytes,
            a.attributed_bytes - row("o").observed_bytes
        );
    }

    #[test]
    fn a_shape_backs_a_match_only_from_the_operator_the_model_names() {
        // FlashAttention's `out` has the shape and dtype of its input `q`: a copy of `q` (made
        // by `clone`) of out's size is not `out`, whatever its shape. The others are outputs of
        // `aten::_flash_attention_forward`, the operator the model names.
        use crate::attribution::OpOutput;
        let t = torch_fa();
        let o: Vec<Observed> = t
            .iter()
            .enumerate()
            .map(|(i, x)| {
                let mut ob = obs(x.bytes, i as u64, &[]);
                ob.op = Some(OpOutput {
                    op: if x.name == "out" {
                        "clone"
                    } else {
                        "_flash_attention_forward"
                    }
                    .into(),
                    dtype: x.dtype.to_string(),
                    shape: x.shape.iter().map(|&d| d as i64).collect(),
                });
                ob
            })
            .collect();
        let a = attribute(&t, o, 1, Moment::Window);
        let row = |n: &str| a.rows.iter().find(|r| r.name == n).unwrap();
        assert!(
            matches!(row("out").evidence, Some(Evidence::SizeOnly { .. })),
            "{:?}",
            row("out")
        );
        assert!(
            matches!(row("softmax_lse").evidence, Some(Evidence::Shape { ref op }) if op.starts_with("_flash_attention_forward [24, 4128]")),
            "{:?}",
            row("softmax_lse")
        );
        assert_eq!(a.evidence.size_only_bytes, row("out").observed_bytes);
    }

    #[test]
    fn at_a_failure_the_failed_request_is_one_of_the_look_alikes() {
        // Live at the failure: Ai, a 25600-byte allocation and another unnamed one of that size;
        // the failed request is 25600 bytes too. w and u claim that size, and three allocations
        // have it (the request among them): neither is matched on size and order alone.
        let mut tl = vramtrace_models::Timeline::new();
        let a = tl.alloc("A (fp32)", &[100, 64], DType::F32, "test");
        let _ai = tl.alloc("Ai", &[100, 64], DType::BF16, "test");
        tl.free(a);
        let _w = tl.alloc("w", &[100, 128], DType::BF16, "test");
        let _u = tl.alloc("u", &[100, 128], DType::BF16, "test");
        let model = tl.finish().unwrap();
        let mut o = vec![
            obs(12800, 1, &[]),
            obs(25600, 2, &[]),
            obs(25600, 3, &[]),
            obs(25600, 4, &[]),
        ];
        o[3].failed = true;
        let a = attribute(&model, o, 1, Moment::Failure);
        for n in ["w", "u"] {
            let r = a.rows.iter().find(|r| r.name == n).unwrap();
            assert_eq!(
                r.evidence,
                Some(Evidence::Ambiguous { candidates: 3 }),
                "{r:?}"
            );
            assert_eq!(r.observed, None, "{r:?}");
        }
        assert_eq!(a.evidence.ambiguous, 2, "{:?}", a.evidence);
        assert_eq!(a.unexplained_bytes, 2 * 25600);
    }

    #[test]
    fn pytorch_blocks_compare_at_their_512_byte_granule() {
        // PyTorch's FlashAttention: rng_state (16 B) and the philox offset (8 B) are 512-byte
        // blocks of the caching allocator.
        let t = torch_fa();
        let o: Vec<Observed> = t
            .iter()
            .enumerate()
            .map(|(i, x)| Observed {
                api: crate::attribution::PYTORCH_BLOCK_API,
                ..obs(x.bytes.div_ceil(512) * 512, i as u64, &[])
            })
            .collect();
        let a = attribute(&t, o, 1, Moment::Window);
        assert!(a.rows.iter().all(|r| r.observed.is_some()), "{:?}", a.rows);
        assert_eq!(a.unexplained_bytes, 0);
    }
}
