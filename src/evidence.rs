//! What an attribution rests on (issue 11, item 6).
//!
//! A predicted tensor matched to an observed allocation is only as good as the evidence for it:
//! - **label**: the allocation was named (an annotation or a range) as the tensor and has the
//!   tensor's size (after the comparison's rounding); a named allocation of another size stays
//!   matched, says by how much it differs, and is not evidence;
//! - **frame**: one of the allocation's Python frames is at the line the model cites for the
//!   tensor, in the module the model cites ([`PythonSite`]): the frame's file path ends with the
//!   cited module path, compared by whole path components, and its line is the cited line.
//!   fla 0.6.0's `o` is `fla/ops/common/chunk_o.py:565`; vLLM 0.20.1's vendored copy allocates
//!   its `o` at `vllm/model_executor/layers/fla/ops/chunk_o.py:161`. The two have the same file
//!   name, and neither's frames back the other's model. A citation without a line is matched
//!   by its module path alone; a frame recorded without its path (only a file name) backs
//!   nothing;
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
//! - **contradicted**: the model cites a Python line for the tensor, the allocation has Python
//!   frames and none is at that line of that module: the memory was allocated by other code
//!   (another implementation than the model's variant, or another version of its file); the
//!   match is dropped and the frame that allocated it is named, on the tensor's row and in the
//!   headline, which counts every such tensor. A tensor the model says is allocated in C++
//!   (`flash_api.cpp`) carries only its caller's Python frames, which neither confirm nor
//!   contradict it.
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
    /// Not matched: none of the allocation's frames is at the line and module the model cites.
    Contradicted {
        /// The allocation's innermost frame.
        frame: String,
        /// The module path and line the model cites (`fla/ops/common/chunk_o.py:565`).
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
                format!("other code: allocated at {frame}, not at {expected}")
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
    /// A sentence when the frames show that other code allocated the look-alikes of some of
    /// the model's tensors: how many (every contradicted tensor counts, also when the modelled
    /// code allocated others), in which files, and whether any tensor was allocated where the
    /// model cites.
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

/// Where a model says a tensor is allocated in Python: the module path as the citation gives it
/// (`fla/ops/common/chunk_o.py`) and the lines, when it gives them: one (`:565`), several
/// (`:621/622`, either line) or a range (`:1283-1286`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PythonSite<'a> {
    /// The module path, from the package's top directory.
    pub path: &'a str,
    /// The cited lines as written after the colon (`565`, `621/622`, `1283-1286`), if cited;
    /// [`python_site`] accepts only text that [`PythonSite::covers`] reads.
    pub line: Option<&'a str>,
}

/// Whether the line text `lines` (`565`, `621/622`, `1283-1286`, `617/619-620`) names `line`;
/// `None` when the text is not such a list.
fn lines_cover(lines: &str, line: u32) -> Option<bool> {
    let mut any = false;
    for part in lines.split('/') {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?),
            None => {
                let n = part.parse::<u32>().ok()?;
                (n, n)
            }
        };
        if lo > hi {
            return None;
        }
        any |= (lo..=hi).contains(&line);
    }
    Some(any)
}

impl PythonSite<'_> {
    /// Whether `line` is one of the cited lines (any line when none is cited).
    pub fn covers(&self, line: Option<u32>) -> bool {
        match (self.line, line) {
            (None, _) => true,
            (Some(text), Some(l)) => lines_cover(text, l).unwrap_or(false),
            (Some(_), None) => false,
        }
    }

    /// Whether a frame of the Python file `file` (its path as the interpreter recorded it,
    /// `/site/fla/ops/common/chunk_o.py`) at `line` is this site: the path ends with the cited
    /// module path at a component boundary, and the line is a cited one (when lines are cited).
    pub fn is(&self, file: &str, line: Option<u32>) -> bool {
        let in_module = file == self.path
            || file
                .strip_suffix(self.path)
                .is_some_and(|head| head.ends_with('/'));
        in_module && self.covers(line)
    }

    /// Whether one of an allocation's frames is this site: `frames` as `file.py:LINE function`,
    /// `files` the path of each (a frame without its path backs nothing). The first such frame.
    pub fn find_in<'f>(&self, frames: &'f [String], files: &[String]) -> Option<&'f String> {
        frames
            .iter()
            .zip(files)
            .find(|(f, file)| self.is(file, frame_line(f)))
            .map(|(f, _)| f)
    }
}

impl std::fmt::Display for PythonSite<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{l}", self.path),
            None => f.write_str(self.path),
        }
    }
}

/// The Python site a model cites for a tensor (`fla-0.6.0 fla/ops/common/chunk_o.py:565 ...` →
/// `fla/ops/common/chunk_o.py`, line 565); `None` when it cites no Python file: only then can
/// the allocation's Python frames confirm or contradict the model (a tensor allocated in C++
/// has only its caller's frames). A citation of a repository's file in the `src/` layout
/// (`transformers src/transformers/models/qwen3_5/modeling_qwen3_5.py`) names the module
/// `transformers/models/qwen3_5/modeling_qwen3_5.py`: that is the path an installed package
/// has, `src/` is only the repository's folder.
pub fn python_site(source: &str) -> Option<PythonSite<'_>> {
    let word = source.split_whitespace().find(|w| {
        let path = w.split(':').next().unwrap_or(w);
        path.ends_with(".py")
    })?;
    let (path, line) = match word.split_once(':') {
        // Lines the citation cannot be read as are no site at all: a citation that matched any
        // line of the module would back tensors it does not name.
        Some((p, l)) => {
            lines_cover(l, 0)?;
            (p, Some(l))
        }
        None => (word, None),
    };
    let path = path.strip_prefix("src/").unwrap_or(path);
    Some(PythonSite { path, line })
}

/// The line of a Python frame (`chunk_o.py:565 chunk_fwd_o` → 565).
pub fn frame_line(frame: &str) -> Option<u32> {
    frame
        .split_whitespace()
        .next()?
        .rsplit_once(':')?
        .1
        .parse()
        .ok()
}

/// The file of a Python frame (`chunk_o.py:565 chunk_fwd_o` → `chunk_o.py`).
pub fn frame_file(frame: &str) -> &str {
    frame.split(':').next().unwrap_or(frame)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repository_src_folder_is_not_part_of_the_module_path() {
        let hf = python_site(
            "transformers src/transformers/models/qwen3_5/modeling_qwen3_5.py Qwen3_5DecoderLayer.forward",
        )
        .unwrap();
        assert_eq!(
            hf.to_string(),
            "transformers/models/qwen3_5/modeling_qwen3_5.py"
        );
        assert!(hf.is(
            "/opt/torch/.venv/lib/python3.12/site-packages/transformers/models/qwen3_5/modeling_qwen3_5.py",
            Some(912)
        ));
        assert!(!hf.is("/site/other/models/qwen3_5/modeling_qwen3_5.py", Some(912)));
    }

    #[test]
    fn a_site_is_its_module_path_at_a_component_boundary_and_its_line() {
        let fla =
            python_site("fla-0.6.0 fla/ops/common/chunk_o.py:565 torch.empty_like(v)").unwrap();
        assert_eq!(fla.to_string(), "fla/ops/common/chunk_o.py:565");
        assert!(fla.is("/site/fla/ops/common/chunk_o.py", Some(565)));
        assert!(fla.is("fla/ops/common/chunk_o.py", Some(565)));
        assert!(!fla.is("/site/fla/ops/common/chunk_o.py", Some(570)));
        assert!(!fla.is("/site/myfla/ops/common/chunk_o.py", Some(565)));
        assert!(!fla.is(
            "/site/vllm/model_executor/layers/fla/ops/chunk_o.py",
            Some(565)
        ));
        let vllm = python_site(
            "vllm-0.20.1 vllm/model_executor/layers/fla/ops/chunk_o.py:161 torch.empty_like(v)",
        )
        .unwrap();
        assert!(vllm.is(
            "/usr/lib/python3/site-packages/vllm/model_executor/layers/fla/ops/chunk_o.py",
            Some(161)
        ));
        assert!(!vllm.is("/site/fla/ops/common/chunk_o.py", Some(161)));
        // A citation without a line: the module path alone. A C++ citation: no Python site.
        let mlp = python_site(
            "vllm-0.20.1 vllm/model_executor/models/qwen2_moe.py Qwen2MoeMLP.forward: out = x",
        )
        .unwrap();
        assert_eq!(mlp.line, None);
        // Several lines, or a range: each of them, and no other.
        let rep = python_site(
            "transformers 5.17 src/transformers/models/qwen3_5/modeling_qwen3_5.py:621/622 repeat",
        )
        .unwrap();
        let f = "/s/transformers/models/qwen3_5/modeling_qwen3_5.py";
        assert!(rep.is(f, Some(621)) && rep.is(f, Some(622)));
        assert!(!rep.is(f, Some(620)) && !rep.is(f, Some(623)) && !rep.is(f, None));
        assert_eq!(
            rep.to_string(),
            "transformers/models/qwen3_5/modeling_qwen3_5.py:621/622"
        );
        let range = python_site("x masking_utils.py:1283-1286 mask").unwrap();
        assert!(range.is("masking_utils.py", Some(1285)));
        assert!(!range.is("masking_utils.py", Some(1287)));
        // Lines that cannot be read are no site, never the whole module.
        assert_eq!(python_site("x chunk_o.py:56a5 o"), None);
        assert_eq!(python_site("x chunk_o.py:9-3 o"), None);
        assert!(mlp.is("/s/vllm/model_executor/models/qwen2_moe.py", Some(3)));
        assert_eq!(
            python_site("fa-2.8.3 csrc/flash_attn/flash_api.cpp:643 out = torch::empty_like(q)"),
            None
        );
        // A frame recorded without its path backs nothing.
        let frames = vec!["chunk_o.py:565 chunk_fwd_o".to_string()];
        assert_eq!(fla.find_in(&frames, &[]), None);
        assert_eq!(frame_line("chunk_o.py:565 chunk_fwd_o"), Some(565));
    }
}
