//! What an attribution rests on (issue 11, item 6).
//!
//! A predicted tensor matched to an observed allocation is only as good as the evidence for it:
//! - **label**: the allocation was named (an annotation or a range) as the tensor;
//! - **frame**: one of the allocation's Python frames is in the file the model cites for the
//!   tensor (`chunk_o.py` for fla's `o`), compared by file name;
//! - **shape**: the allocation holds an operator output (`vramtrace run --torch-shapes`) with the
//!   tensor's exact shape and dtype;
//! - **size and order** alone: nothing but the bytes (and the allocation order) agree. This is
//!   kept as a match only when it is the only reading: no more unnamed live allocations of that
//!   size than model tensors of that size matched by size. Otherwise the match is **ambiguous**
//!   (with the number of look-alike candidates) and is not counted as matched.
//! - **contradicted**: the model cites a Python file for the tensor, the allocation has Python
//!   frames and none is in that file: the memory was allocated by other code (another
//!   implementation than the model's variant); the match is dropped and the frame that
//!   allocated it is named. A tensor the model says is allocated in C++ (`flash_api.cpp`)
//!   carries only its caller's Python frames, which neither confirm nor contradict it.
//!
//! The headline keeps the bytes resting on evidence apart from those resting on size alone.

use serde::Serialize;
use vramtrace_models::Tensor;

use crate::attribution::{Attribution, MatchedBy};

/// What one row's match rests on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Evidence {
    /// Named as the tensor.
    Label,
    /// A Python frame in the modelled file.
    Frame {
        /// The frame (`chunk_o.py:565 chunk_fwd_o`).
        frame: String,
    },
    /// An operator output with the tensor's shape and dtype (`--torch-shapes`).
    Shape {
        /// The output, `empty_like [1, 4128, 48, 128] bfloat16`.
        op: String,
    },
    /// Size (and order) alone, with no other reading: `same_size` unnamed allocations of that
    /// size for as many tensors.
    SizeOnly {
        /// Unnamed live allocations of that size.
        same_size: usize,
    },
    /// Not matched: `candidates` unnamed allocations of that size for fewer tensors.
    Ambiguous {
        /// Look-alike allocations.
        candidates: usize,
    },
    /// Not matched: the allocation's frames are in another file than the model's.
    Contradicted {
        /// The allocation's innermost frame.
        frame: String,
        /// The file the model cites.
        expected: String,
    },
}

impl Evidence {
    /// Whether the match rests on more than size and order: a name, a frame in the modelled
    /// file, or an operator output of the tensor's shape and dtype.
    pub fn is_backed(&self) -> bool {
        matches!(
            self,
            Evidence::Label | Evidence::Frame { .. } | Evidence::Shape { .. }
        )
    }

    /// Short text for tables.
    pub fn describe(&self) -> String {
        match self {
            Evidence::Label => "named".into(),
            Evidence::Frame { frame } => format!("frame {frame}"),
            Evidence::Shape { op } => format!("shape: {op}"),
            Evidence::SizeOnly { same_size } => {
                format!("size/order only ({same_size} alike)")
            }
            Evidence::Ambiguous { candidates } => {
                format!("ambiguous: {candidates} live allocations of this size")
            }
            Evidence::Contradicted { frame, expected } => {
                format!("other code: allocated at {frame}, not in {expected}")
            }
        }
    }
}

/// The evidence behind an attribution's headline.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct EvidenceSummary {
    /// Matched bytes resting on a name, a frame in the modelled file, or an operator output of
    /// the tensor's shape and dtype.
    pub evidence_bytes: u64,
    /// Matched bytes resting on size and order alone.
    pub size_only_bytes: u64,
    /// Tensors left unmatched because several allocations looked alike.
    pub ambiguous: usize,
    /// Tensors left unmatched because the frames show other code.
    pub contradicted: usize,
    /// A sentence when the frames show another implementation than the model's variant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub other_implementation: Option<String>,
}

/// The file name the model cites for a tensor (`fla-0.6.0 fla/ops/common/chunk_o.py:565 ...`
/// → `chunk_o.py`).
pub fn source_file(source: &str) -> Option<&str> {
    source
        .split_whitespace()
        .find(|w| w.contains(".py") || w.contains(".cu") || w.contains(".cpp"))
        .map(|w| w.split(':').next().unwrap_or(w))
        .map(|p| p.rsplit('/').next().unwrap_or(p))
}

/// [`source_file`] when it is a Python file: only then can the allocation's Python frames
/// confirm or contradict the model (a tensor allocated in C++ has only its caller's frames).
pub fn python_source_file(source: &str) -> Option<&str> {
    source_file(source).filter(|f| f.ends_with(".py"))
}

/// The file of a Python frame (`chunk_o.py:565 chunk_fwd_o` → `chunk_o.py`).
pub fn frame_file(frame: &str) -> &str {
    frame.split(':').next().unwrap_or(frame)
}

fn round_up(v: u64, align: u64) -> u64 {
    if align <= 1 {
        v
    } else {
        v.div_ceil(align) * align
    }
}

/// Weighs every match of `a` (made by [`crate::attribution::attribute`]) and drops those that
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
            row.evidence = Some(Evidence::Label);
            continue;
        }
        // Only a tensor the model says is allocated in Python can be confirmed or contradicted
        // by Python frames: one allocated in C++ (`flash_api.cpp`) has only its caller's.
        let want = python_source_file(tensors[row.tensor].source);
        let hit = want.and_then(|w| o.frames.iter().find(|f| frame_file(f) == w));
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
                Some(op) if op.is_shaped_like(&tensors[row.tensor]) => {
                    row.evidence = Some(Evidence::Shape { op: op.describe() })
                }
                _ => size_rows.push(ri),
            },
        }
    }
    // Pass 2: size and order alone, against the unnamed live allocations of the same size.
    for &ri in &size_rows {
        let size = round_up(a.rows[ri].predicted_bytes, align);
        let alike = a
            .observed
            .iter()
            .enumerate()
            .filter(|(oi, o)| {
                !o.failed
                    && o.name.is_none()
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
        } else {
            s.size_only_bytes += a.observed[oi].size
        }
    }
    // Same-size allocations made elsewhere show another implementation only when nothing was
    // allocated where the model says: with one tensor in its modelled file, the modelled code
    // ran and the others were look-alikes of tensors not live then.
    let modelled_code_ran = a
        .rows
        .iter()
        .any(|r| matches!(r.evidence, Some(Evidence::Frame { .. })));
    if s.contradicted > 0 && !modelled_code_ran {
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
        s.other_implementation = Some(format!(
            "{} tensor(s) of the model have same-size allocations made by other code ({}): the program ran another implementation than the model's variant",
            s.contradicted,
            files.join(", ")
        ));
    }
    a.evidence = s;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::{Moment, Observed, attribute};
    use vramtrace_models::{DType, GdnShape, gdn_fla_0_6_0};

    fn fla() -> Vec<Tensor> {
        gdn_fla_0_6_0::tensors(&GdnShape::new(&[4128], 48, 128, 128, DType::BF16)).unwrap()
    }

    fn obs(size: u64, t: u64, frames: &[&str]) -> Observed {
        Observed {
            size,
            t_ns: t,
            ptr: format!("{t:#x}"),
            api: "cuMemAlloc_v2",
            name: None,
            label: None,
            failed: false,
            frames: frames.iter().map(|f| f.to_string()).collect(),
            op: None,
        }
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
        let peak = vramtrace_models::peak(&t);
        let o: Vec<Observed> = t
            .iter()
            .enumerate()
            .filter(|(i, _)| peak.live.contains(i))
            .map(|(i, x)| {
                let f = if x.name == "o" {
                    "other_gdn.py:88 forward".to_string()
                } else {
                    format!("{}:1 f", source_file(x.source).unwrap())
                };
                obs(x.bytes, i as u64, &[f.as_str(), "model.py:3 forward"])
            })
            .collect();
        let a = attribute(&t, o, 1, Moment::Peak);
        let row = |n: &str| a.rows.iter().find(|r| r.name == n).unwrap();
        assert!(
            matches!(row("h").evidence, Some(Evidence::Frame { ref frame }) if frame.starts_with("chunk_delta_h.py")),
            "{:?}",
            row("h")
        );
        assert!(row("o").observed.is_none());
        assert!(
            matches!(row("o").evidence, Some(Evidence::Contradicted { ref expected, .. }) if expected == "chunk_o.py")
        );
        // The other tensors were allocated in fla's files: fla ran, and o's look-alike is not
        // taken for proof of another implementation.
        assert_eq!(a.evidence.other_implementation, None);
        assert_eq!(a.evidence.size_only_bytes, 0);
        assert_eq!(a.evidence.evidence_bytes, a.attributed_bytes);
    }

    #[test]
    fn a_gdn_layer_allocating_in_its_own_file_is_another_implementation() {
        // scripts/validate/naive_gdn.py: fla's buffer shapes, allocated by another file.
        let t = fla();
        let peak = vramtrace_models::peak(&t);
        let o: Vec<Observed> = t
            .iter()
            .enumerate()
            .filter(|(i, _)| peak.live.contains(i))
            .map(|(i, x)| {
                obs(
                    x.bytes,
                    i as u64,
                    &[&format!("naive_gdn.py:{} naive_chunk_gdn", 40 + i)],
                )
            })
            .collect();
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
        let peak = vramtrace_models::peak(&t);
        let o: Vec<Observed> = t
            .iter()
            .enumerate()
            .filter(|(i, _)| peak.live.contains(i))
            .map(|(i, x)| {
                let mut ob = obs(x.bytes, i as u64, &[]);
                let shape: Vec<i64> = if x.name == "o" {
                    vec![x.bytes as i64 / 2]
                } else {
                    x.shape.iter().map(|&d| d as i64).collect()
                };
                ob.op = Some(OpOutput {
                    op: "empty_like".into(),
                    dtype: x.dtype.to_string(),
                    shape,
                });
                ob
            })
            .collect();
        let a = attribute(&t, o, 1, Moment::Peak);
        let row = |n: &str| a.rows.iter().find(|r| r.name == n).unwrap();
        assert!(
            matches!(row("h").evidence, Some(Evidence::Shape { ref op }) if op.starts_with("empty_like [1, 65, 48, 128, 128] bfloat16")),
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
        let t = vramtrace_models::fa_pytorch::tensors(&vramtrace_models::FaShape {
            seqlens_q: vec![4128],
            max_seqlen_k: 262144,
            num_heads: 24,
            num_heads_k: 4,
            head_dim: 256,
            dtype: DType::BF16,
            num_sms: 132,
        })
        .unwrap();
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
        let peak = vramtrace_models::peak(&t);
        let mut o: Vec<Observed> = t
            .iter()
            .enumerate()
            .filter(|(i, _)| peak.live.contains(i))
            .map(|(i, x)| {
                let f = format!("{}:{} f", source_file(x.source).unwrap(), 100 + i);
                obs(x.bytes, 1000 - i as u64, &[f.as_str()])
            })
            .collect();
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
    fn pytorch_blocks_compare_at_their_512_byte_granule() {
        // PyTorch's FlashAttention: rng_state (16 B) and the philox offset (8 B) are 512-byte
        // blocks of the caching allocator.
        let t = vramtrace_models::fa_pytorch::tensors(&vramtrace_models::FaShape {
            seqlens_q: vec![4128],
            max_seqlen_k: 262144,
            num_heads: 24,
            num_heads_k: 4,
            head_dim: 256,
            dtype: DType::BF16,
            num_sms: 132,
        })
        .unwrap();
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
