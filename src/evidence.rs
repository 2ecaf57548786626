//! What an attribution rests on (issue 11, item 6).
//!
//! A predicted tensor matched to an observed allocation is only as good as the evidence for it:
//! - **label**: the allocation was named (an annotation or a range) as the tensor and has the
//!   tensor's size (after the comparison's rounding); a named allocation of another size stays
//!   matched, says by how much it differs, and is not evidence;
//! - **frame**: one of the allocation's Python frames is in the file the model cites for the
//!   tensor (`chunk_o.py` for fla's `o`), compared by file name;
//! - **shape**: the allocation holds an output of the operator the model names for the tensor
//!   (`vramtrace run --torch-shapes`; `aten::empty_like` for fla's `o`,
//!   `aten::_flash_attention_forward` for FlashAttention's `out`), with the tensor's exact shape
//!   and dtype. Another operator's output of that shape is not evidence (FlashAttention's `out`
//!   has the shape of its input `q`), nor is any output for a tensor whose operator the model
//!   does not name;
//! - **size and order** alone: nothing but the bytes (and the allocation order) agree. This is
//!   kept as a match only when it is the only reading: no more unnamed live allocations of that
//!   size than model tensors of that size matched by size. Otherwise the match is **ambiguous**
//!   (with the number of look-alike candidates) and is not counted as matched. At a failure the
//!   failed request is one of the look-alikes (it is an allocation of that size a claimant may
//!   be), although the tensor matched to it is never itself called ambiguous.
//! - **contradicted**: the model cites a Python file for the tensor, the allocation has Python
//!   frames and none is in that file: the memory was allocated by other code (another
//!   implementation than the model's variant); the match is dropped and the frame that
//!   allocated it is named. A tensor the model says is allocated in C++ (`flash_api.cpp`)
//!   carries only its caller's Python frames, which neither confirm nor contradict it.
//!
//! The headline keeps the bytes resting on evidence apart from those resting on size alone.
//! This module is the vocabulary; [`crate::attribution::weigh`] weighs each match with it.

use serde::Serialize;

/// What one row's match rests on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Evidence {
    /// Named as the tensor, and of the tensor's size.
    Label,
    /// Named as the tensor, but of another size: matched (the row shows the difference), not
    /// evidence.
    LabelOtherSize {
        /// Observed minus predicted bytes.
        difference: i64,
    },
    /// A Python frame in the modelled file.
    Frame {
        /// The frame (`chunk_o.py:565 chunk_fwd_o`).
        frame: String,
    },
    /// An output of the operator the model names, with the tensor's shape and dtype
    /// (`--torch-shapes`).
    Shape {
        /// The output, `empty_like [1, 4128, 48, 128] bfloat16`.
        op: String,
    },
    /// Size (and order) alone, with no other reading: `same_size` unnamed allocations of that
    /// size for as many tensors.
    SizeOnly {
        /// Unnamed allocations of that size (live, or the failed request).
        same_size: usize,
    },
    /// Not matched: `candidates` unnamed allocations of that size (live, or the failed
    /// request) for fewer tensors.
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
            Evidence::LabelOtherSize { difference } => format!(
                "named, but {} bytes {} than predicted",
                difference.unsigned_abs(),
                if *difference > 0 { "larger" } else { "smaller" }
            ),
            Evidence::Frame { frame } => format!("frame {frame}"),
            Evidence::Shape { op } => format!("shape: {op}"),
            Evidence::SizeOnly { same_size } => {
                format!("size/order only ({same_size} alike)")
            }
            Evidence::Ambiguous { candidates } => {
                format!("ambiguous: {candidates} unnamed allocations of this size")
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
    /// Matched bytes named as their tensor but of another size than the model's: not evidence.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub named_other_size_bytes: u64,
    /// Tensors left unmatched because several allocations looked alike.
    pub ambiguous: usize,
    /// Tensors left unmatched because the frames show other code.
    pub contradicted: usize,
    /// A sentence when the frames show another implementation than the model's variant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub other_implementation: Option<String>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
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
