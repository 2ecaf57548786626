//! The categoriser: every byte of a moment in one category, with the evidence it rests on.
//!
//! Pure: it takes plain facts about one allocation or tensor ([`Facts`]: bytes, Python frames
//! innermost first, native frames, a label, lifetime facts) and answers a [`Verdict`] (a
//! [`Category`] and the [`Evidence`] it rests on); [`categorise_moment`] takes the whole live set
//! at a moment (tensors, the driver's allocations, the device's free and total memory at a
//! failure, NVML when live) and answers rows that sum to the whole. Nothing here reads a trace.
//!
//! # The order of the rules (the first that holds decides)
//! 1. **Enclosing frames**, anywhere in the Python stack: allocations made while Triton
//!    benchmarks an autotuning candidate ([`Category::Autotune`]) or while a serving engine
//!    captures CUDA graphs ([`Category::CudaGraphs`]); what happens inside wins over where.
//! 2. **Site frames**, innermost Python frame first: the loaders and cache constructors of
//!    transformers, vLLM and SGLang, PyTorch's module constructors ([`FRAME_RULES`]).
//! 3. **Native frames**, innermost first: the library that called the driver (NCCL, cuBLAS) or
//!    llama.cpp's functions ([`NATIVE_RULES`]), when no Python site rule held.
//! 4. **A label** (NVTX range or annotation range) or annotated name, by word ([`LABEL_RULES`]);
//!    NCCL's own ranges (`nccl…`) are not read: NCCL leaves them open over the program's own
//!    allocations (seen on the H200 in `samples/h200/nccl-stages`).
//! 5. **Lifetime** ([`Lifetime`]): made before the first step and never freed → weights; its
//!    line keeps tensors of two or more earlier steps → KV cache (it grows); its line keeps the
//!    previous step's tensors, replaced each step → recurrent state; made in the current step →
//!    activations.
//! 6. **Kernels and forwards** ([`ACTIVATION_RULES`]): fla's and FlashAttention's Python entry
//!    points, `torch.nn.functional`, a module's forward (`torch/nn/modules/module.py`
//!    `_call_impl`) → activations.
//! 7. What no rule covers is [`Category::Unnamed`], grouped by its innermost Python line
//!    ([`site_of`]), never by a C++ allocator frame.
//!
//! Bytes no tensor holds are counted by arithmetic, never by rule: the caching allocator's
//! reserve (a segment's bytes minus its live tensors', with its largest free block), the context
//! and loaded modules (total − free − traced at a failure, or NVML's figure for the process minus
//! the traced bytes when live), other processes (other traced processes on the device, NVML's
//! other processes).

use std::fmt;

use serde::Serialize;

mod breakdown;
mod moment;
mod rules;
mod steps;

pub use breakdown::{
    Breakdown, CONFIG_TOLERANCE, DeviceMemory, EvidenceLine, Expectations, LiveAllocation,
    LiveTensor, MomentFacts, NvmlProcess, Placed, Row, SHOWN_EVIDENCE, SegmentReserve,
    categorise_moment, categorise_moment_placing, render,
};
pub use moment::{
    At, MomentKind, StackCategories, breakdown_at, categorise_stack, first_failure, moments, peak,
    py_frames, stack_categories,
};
pub use rules::{ACTIVATION_RULES, FRAME_RULES, FrameRule, LABEL_RULES, NATIVE_RULES, NativeRule};
pub use steps::{Steps, phase_of};

use Category as C;
use rules::Scope;

pub use vramtrace_models::Category;

/// The label of what `vramtrace attach` seeded from the state at the attach (PyTorch's
/// segments, and the operator of its live blocks): made before the attach, by nothing the trace
/// saw (the preload's `BEFORE_ATTACH`).
pub const BEFORE_ATTACH: &str = "before attach";

/// One Python frame: `co_filename`, the function (a qualified name where recorded), the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PyFrame<'a> {
    /// The file, a path.
    pub file: &'a str,
    /// The function.
    pub function: &'a str,
    /// The line (0 unknown).
    pub line: u32,
}

impl std::fmt::Display for PyFrame<'_> {
    /// `file.py:LINE function`, the file without its folders.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{} {}", base(self.file), self.line, self.function)
    }
}

/// One native frame: the module's path or name, and the symbol where one was resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NativeFrame<'a> {
    /// The module (`libnccl.so.2`, a path, or a name with a note after it).
    pub module: &'a str,
    /// The symbol, demangled, if resolved.
    pub symbol: Option<&'a str>,
}

/// What the allocation's lifetime says, computed by [`Steps`] (or given by a caller that knows
/// the program's steps).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Lifetime {
    /// Nothing known.
    #[default]
    Unknown,
    /// Made before the first step (in an earlier phase of the program) and never freed since.
    Persistent,
    /// Made in an earlier phase that freed almost all it made (under a tenth of its allocations
    /// are live): what a warm-up or a one-off computation left behind, not the model's state
    /// (PyTorch's 32 MiB cuBLAS workspace after the warm-up matmul in `samples/h200/torch-oom`).
    Leftover,
    /// Its line keeps tensors made in `steps` (≥ 2) earlier steps: it grows step by step.
    Accumulating {
        /// Earlier steps its line still has tensors of.
        steps: u32,
    },
    /// Its line keeps `per_step` (≥ 2: one per layer) tensors of the previous step and replaces
    /// them each step.
    Carried {
        /// Tensors of the previous step its line keeps.
        per_step: u32,
    },
    /// Made in the previous step, the only one its line keeps: a local variable not yet dropped.
    Lingering,
    /// Made `steps_ago` (≥ 2) steps ago, the only step its line keeps tensors of.
    Kept {
        /// Steps since.
        steps_ago: u32,
    },
    /// Made in the current step.
    WithinStep,
}

/// Plain facts about one allocation or tensor.
#[derive(Debug, Clone, Default)]
pub struct Facts<'a> {
    /// Bytes.
    pub bytes: u64,
    /// Python frames, innermost first (the probe's own included or not: both are skipped).
    pub python: Vec<PyFrame<'a>>,
    /// Native frames, innermost first.
    pub native: Vec<NativeFrame<'a>>,
    /// The NVTX or annotation range it was made in.
    pub label: Option<&'a str>,
    /// Its annotated name (`vramtrace_annotate`), if any.
    pub name: Option<&'a str>,
    /// What its lifetime says.
    pub lifetime: Lifetime,
    /// Made inside a CUDA graph's private pool (known from a capture range).
    pub in_graph_pool: bool,
}

/// What a verdict rests on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Evidence {
    /// A rule over Python frames held at this frame.
    Frame {
        /// The frame's file (base name and the folders the rule names are enough to read it).
        file: String,
        /// Its function.
        function: String,
        /// Its line.
        line: u32,
        /// The upstream code the rule was read from.
        rule: &'static str,
    },
    /// A rule over native frames held at this frame.
    Native {
        /// The module.
        module: String,
        /// The symbol, if resolved.
        #[serde(skip_serializing_if = "Option::is_none")]
        symbol: Option<String>,
        /// The upstream code the rule was read from.
        rule: &'static str,
    },
    /// A word of the label or annotated name.
    Label {
        /// The label or name.
        text: String,
        /// The word found.
        word: &'static str,
    },
    /// The lifetime.
    Lifetime {
        /// What it was.
        lifetime: Lifetime,
    },
    /// Made inside a CUDA graph's private pool.
    GraphPool,
    /// Segment bytes minus the live tensors' bytes in them.
    SegmentArithmetic {
        /// Segments.
        segments: usize,
        /// Their bytes.
        segment_bytes: u64,
        /// Bytes of the live tensors inside them.
        tensor_bytes: u64,
        /// The largest free block of any of them.
        largest_free_block: u64,
    },
    /// Total − free − traced at a failure.
    Untraced {
        /// The device's memory.
        total: u64,
        /// Free, as the driver said.
        free: u64,
        /// Traced bytes on the device (every traced process).
        traced: u64,
    },
    /// NVML's figure for a process (minus what was traced of it).
    Nvml {
        /// The process.
        pid: u32,
        /// NVML's bytes for it.
        used: u64,
        /// Traced bytes of it.
        traced: u64,
    },
    /// Traced by another process.
    OtherTraced {
        /// The process.
        pid: u32,
    },
    /// Allocated before `vramtrace attach` attached (seeded from PyTorch's snapshot, labelled
    /// [`BEFORE_ATTACH`]) and named by no Python object the probe found then.
    BeforeAttach,
    /// No rule: its innermost Python line (or native frame).
    Site {
        /// `file.py:LINE function`, or a native frame.
        site: String,
    },
    /// An otherwise unnamed line whose bytes are what the config gives for the category
    /// (within [`CONFIG_TOLERANCE`]).
    ConfigSize {
        /// The line (`file.py:LINE function`).
        site: String,
        /// What the config gives.
        expected: u64,
        /// Its bytes.
        observed: u64,
    },
    /// The config's figure against the observed bytes (added to a row).
    Config {
        /// What the config gives.
        expected: u64,
        /// What was seen.
        observed: u64,
    },
}

impl fmt::Display for Evidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Evidence::Frame {
                file,
                function,
                line,
                rule,
            } => write!(f, "frame {}:{line} {function} (rule: {rule})", base(file)),
            Evidence::Native {
                module,
                symbol,
                rule,
            } => match symbol {
                Some(s) => write!(f, "native {s} in {} (rule: {rule})", base(module)),
                None => write!(f, "native frame in {} (rule: {rule})", base(module)),
            },
            Evidence::Label { text, word: "" } => write!(
                f,
                "label {text:?} (no word of a category: the program's own tensor)"
            ),
            Evidence::Label { text, word } => write!(f, "label {text:?} ({word:?})"),
            Evidence::Lifetime { lifetime } => match lifetime {
                Lifetime::Unknown => f.write_str("lifetime unknown"),
                Lifetime::Persistent => {
                    f.write_str("lifetime: made before the first step, never freed")
                }
                Lifetime::Leftover => {
                    f.write_str("lifetime: left by an earlier phase that freed almost all it made")
                }
                Lifetime::Accumulating { steps } => write!(
                    f,
                    "lifetime: its line keeps tensors of {steps} earlier steps (grows)"
                ),
                Lifetime::Carried { per_step } => write!(
                    f,
                    "lifetime: its line keeps {per_step} tensors of the previous step, replaced \
                     each step"
                ),
                Lifetime::Lingering => f.write_str(
                    "lifetime: made in the previous step, the only one its line keeps (a \
                     variable not yet dropped)",
                ),
                Lifetime::Kept { steps_ago } => write!(
                    f,
                    "lifetime: made {steps_ago} steps ago, the only one its line keeps"
                ),
                Lifetime::WithinStep => f.write_str("lifetime: made in the current step"),
            },
            Evidence::GraphPool => f.write_str("inside a CUDA graph's pool"),
            Evidence::SegmentArithmetic {
                segments,
                segment_bytes,
                tensor_bytes,
                largest_free_block,
            } => write!(
                f,
                "{segments} segments of {} − {} of live tensors; largest free block {}",
                fmt_bytes(*segment_bytes),
                fmt_bytes(*tensor_bytes),
                fmt_bytes(*largest_free_block)
            ),
            Evidence::Untraced {
                total,
                free,
                traced,
            } => write!(
                f,
                "untraced: total {} − free {} − traced {} (the driver's figures at the failure)",
                fmt_bytes(*total),
                fmt_bytes(*free),
                fmt_bytes(*traced)
            ),
            Evidence::Nvml { pid, used, traced } => write!(
                f,
                "NVML: process {pid} uses {}, {} traced",
                fmt_bytes(*used),
                fmt_bytes(*traced)
            ),
            Evidence::OtherTraced { pid } => write!(f, "traced in process {pid}"),
            Evidence::BeforeAttach => {
                f.write_str("allocated before the attach; no Python object names it")
            }
            Evidence::Site { site } if site == "no frames" => {
                f.write_str("no rule; no frames recorded")
            }
            Evidence::Site { site } => write!(f, "no rule; at {site}"),
            Evidence::ConfigSize {
                site,
                expected,
                observed,
            } => write!(
                f,
                "at {site}: {}, the config gives {} (size against the config)",
                fmt_bytes(*observed),
                fmt_bytes(*expected)
            ),
            Evidence::Config { expected, observed } => write!(
                f,
                "the config gives {}, {} seen",
                fmt_bytes(*expected),
                fmt_bytes(*observed)
            ),
        }
    }
}

use vramtrace_models::units::fmt_bytes;

pub(crate) fn base(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A category and what it rests on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// The category.
    pub category: Category,
    /// What it rests on.
    pub evidence: Evidence,
}

/// True for a Python frame that never says where a program allocated: the probe's own
/// callbacks (`vramtrace_torch.py`) and PyTorch's dispatch of them (`torch/_utils.py`
/// `fire_callbacks`).
pub fn is_probe_frame(file: &str, function: &str) -> bool {
    base(file) == "vramtrace_torch.py"
        || (function == "fire_callbacks" && is_torch_file(file) && base(file) == "_utils.py")
}

/// The part of a path inside its installation: after the last `site-packages/` or
/// `dist-packages/`, else the whole path.
fn package_path(file: &str) -> &str {
    ["site-packages/", "dist-packages/"]
        .iter()
        .filter_map(|m| file.rfind(m).map(|i| &file[i + m.len()..]))
        .min_by_key(|s| s.len())
        .unwrap_or(file)
}

/// True for a file of the `torch` package. Only the path inside the installation counts: a
/// virtual environment at `/opt/torch/.venv` (the H200's) does not make Triton's or fla's files
/// PyTorch's.
pub fn is_torch_file(file: &str) -> bool {
    let p = package_path(file);
    if p.len() != file.len() {
        return p.starts_with("torch/");
    }
    p.starts_with("torch/") || p.contains("/torch/")
}

/// True for PyTorch's machinery (a file of the `torch` package outside `torch/nn`): operator
/// dispatch, `torch/_ops.py`, `torch/autograd/function.py`, `torch/_dynamo`; never the line
/// that allocated.
pub fn is_torch_machinery(file: &str) -> bool {
    is_torch_file(file) && !package_path(file).contains("torch/nn/")
}

/// True when the native stack `stack` of `p` passes through PyTorch's caching allocator
/// (a frame in `libc10_cuda`): the allocation is one of its segments.
pub fn is_segment_stack(p: &crate::trace::Process, stack: u32) -> bool {
    p.stacks.get(&stack).is_some_and(|addrs| {
        addrs.iter().any(|&a| {
            p.modules
                .iter()
                .rev()
                .find(|m| m.start <= a && a < m.end)
                .is_some_and(|m| base(&m.path).starts_with("libc10_cuda"))
        })
    })
}

/// Whether a Python frame is PyTorch's embedding (`torch/nn/functional.py` `embedding`): the
/// tensor it allocates is a forward's input hidden states.
pub fn is_embedding(f: &PyFrame<'_>) -> bool {
    f.function == "embedding" && f.file.ends_with("functional.py")
}

/// True for a native frame of an allocator or runtime (PyTorch's caching allocator and empty
/// tensor factories, PyTorch's libraries where no symbol was resolved, the CUDA runtime and
/// driver, the Python interpreter, the C library): never what an unnamed allocation is grouped by.
pub fn is_allocator_frame(f: &NativeFrame<'_>) -> bool {
    let m = base(f.module);
    let sym = f.symbol.unwrap_or("");
    m.starts_with("libcudart")
        || m.starts_with("libcuda.")
        || m.starts_with("libc10")
        || (m.starts_with("libtorch") && f.symbol.is_none())
        || m.starts_with("libvramtrace")
        || m.starts_with("python")
        || m.starts_with("libpython")
        || m.starts_with("libc.so")
        || m.starts_with("ld-linux")
        || sym.contains("CUDACachingAllocator")
        || sym.contains("at::detail::empty")
        || sym.starts_with("at::empty")
        || sym.starts_with("at::native::empty")
        || sym.starts_with("c10::")
}

/// The line an unnamed allocation is grouped by: its innermost Python frame that is neither the
/// probe's nor PyTorch's machinery (`file.py:LINE function`); with only machinery, the
/// innermost Python frame; with no Python frame, the innermost native frame that is not an
/// allocator's ([`is_allocator_frame`]); with only those, `no Python frame (MODULE)` after the
/// outermost native frame's module; else `"no frames"`.
pub fn site_of(python: &[PyFrame<'_>], native: &[NativeFrame<'_>]) -> String {
    let own: Vec<&PyFrame<'_>> = python
        .iter()
        .filter(|f| !is_probe_frame(f.file, f.function))
        .collect();
    if let Some(f) = own
        .iter()
        .find(|f| !is_torch_machinery(f.file))
        .or(own.first())
    {
        return f.to_string();
    }
    match native.iter().find(|f| !is_allocator_frame(f)) {
        Some(f) => match f.symbol {
            Some(s) => format!("{s} ({})", base(f.module)),
            None => base(f.module).to_string(),
        },
        None if native.is_empty() => "no frames".to_string(),
        None => format!(
            "no Python frame ({})",
            base(native[native.len() - 1].module)
        ),
    }
}

/// Categorises one allocation or tensor by the rules in the module's order.
pub fn categorise(facts: &Facts<'_>) -> Verdict {
    let python: Vec<&PyFrame<'_>> = facts
        .python
        .iter()
        .filter(|f| !is_probe_frame(f.file, f.function))
        .collect();
    // 1. Enclosing frames.
    for f in &python {
        if let Some(r) = FRAME_RULES
            .iter()
            .find(|r| r.scope == Scope::Enclosing && r.holds(f))
        {
            return r.verdict(f);
        }
    }
    if facts.in_graph_pool {
        return Verdict {
            category: C::CudaGraphs,
            evidence: Evidence::GraphPool,
        };
    }
    // 2. Site frames, innermost first.
    for f in &python {
        if let Some(r) = FRAME_RULES
            .iter()
            .find(|r| r.scope == Scope::Site && r.holds(f))
        {
            return r.verdict(f);
        }
    }
    // 3. Native frames, innermost first.
    for f in &facts.native {
        if let Some(r) = NATIVE_RULES.iter().find(|r| r.holds(f)) {
            return Verdict {
                category: r.category,
                evidence: Evidence::Native {
                    module: f.module.to_string(),
                    symbol: f.symbol.map(str::to_string),
                    rule: r.source,
                },
            };
        }
    }
    // 4. Label, then annotated name.
    for text in [facts.label, facts.name].into_iter().flatten() {
        let lower = text.to_ascii_lowercase();
        if lower.is_empty() || lower.starts_with("nccl") {
            continue;
        }
        if let Some((word, c)) = LABEL_RULES.iter().find(|(w, _)| lower.contains(w)) {
            return Verdict {
                category: *c,
                evidence: Evidence::Label {
                    text: text.to_string(),
                    word,
                },
            };
        }
    }
    // 5. Lifetime.
    let by_lifetime = match facts.lifetime {
        Lifetime::Persistent => Some(C::Weights),
        Lifetime::Accumulating { .. } => Some(C::KvCache),
        Lifetime::Carried { .. } => Some(C::State),
        Lifetime::Lingering => Some(C::Activations),
        Lifetime::WithinStep | Lifetime::Kept { .. } | Lifetime::Leftover | Lifetime::Unknown => {
            None
        }
    };
    if let Some(c) = by_lifetime {
        return Verdict {
            category: c,
            evidence: Evidence::Lifetime {
                lifetime: facts.lifetime,
            },
        };
    }
    // 6. A module's forward; made in the current step.
    for f in &python {
        if let Some(r) = ACTIVATION_RULES.iter().find(|r| r.holds(f)) {
            return r.verdict(f);
        }
    }
    if facts.lifetime == Lifetime::WithinStep {
        return Verdict {
            category: C::Activations,
            evidence: Evidence::Lifetime {
                lifetime: Lifetime::WithinStep,
            },
        };
    }
    // Seeded at an attach and named by nothing since: what it is is not known.
    if facts.label == Some(BEFORE_ATTACH) && facts.name.is_none_or(str::is_empty) {
        return Verdict {
            category: C::Unnamed,
            evidence: Evidence::BeforeAttach,
        };
    }
    // A label no word of which is known still says the program named it: an activation, as the
    // live view always said.
    if let Some(text) = [facts.label, facts.name].into_iter().flatten().find(|t| {
        !t.is_empty() && *t != BEFORE_ATTACH && !t.to_ascii_lowercase().starts_with("nccl")
    }) {
        return Verdict {
            category: C::Activations,
            evidence: Evidence::Label {
                text: text.to_string(),
                word: "",
            },
        };
    }
    Verdict {
        category: C::Unnamed,
        evidence: Evidence::Site {
            site: site_of(&facts.python, &facts.native),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const VENV: &str = "/opt/torch/.venv/lib/python3.12/site-packages";

    fn py<'a>(file: &'a str, function: &'a str, line: u32) -> PyFrame<'a> {
        PyFrame {
            file,
            function,
            line,
        }
    }

    fn facts<'a>(bytes: u64, python: Vec<PyFrame<'a>>) -> Facts<'a> {
        Facts {
            bytes,
            python,
            ..Default::default()
        }
    }

    fn frame_evidence(v: &Verdict) -> (String, u32) {
        match &v.evidence {
            Evidence::Frame { file, line, .. } => (base(file).to_string(), *line),
            other => panic!("not a frame: {other:?}"),
        }
    }

    #[test]
    fn the_venv_under_opt_torch_is_not_pytorch() {
        let triton = format!("{VENV}/triton/backends/nvidia/driver.py");
        assert!(!is_torch_file(&triton));
        assert!(is_torch_file(&format!("{VENV}/torch/_ops.py")));
        assert!(is_torch_machinery(&format!("{VENV}/torch/_ops.py")));
        assert!(!is_torch_machinery(&format!(
            "{VENV}/torch/nn/modules/linear.py"
        )));
        assert!(is_torch_machinery("/work/pytorch/torch/_tensor.py"));
        assert!(!is_torch_machinery("/tmp/site/fla/ops/common/chunk_o.py"));
        assert!(is_probe_frame(
            &format!("{VENV}/torch/_utils.py"),
            "fire_callbacks"
        ));
        assert!(is_probe_frame(
            "/x/probes/python/vramtrace_torch.py",
            "on_alloc"
        ));
    }

    #[test]
    fn triton_benchmark_flush_is_autotune_whatever_called_it() {
        // The H200's stack of the 256 MiB flush buffer (samples/h200/torch-oom, stack 26).
        let driver = format!("{VENV}/triton/backends/nvidia/driver.py");
        let testing = format!("{VENV}/triton/testing.py");
        let tuner = format!("{VENV}/triton/runtime/autotuner.py");
        let module = format!("{VENV}/torch/nn/modules/module.py");
        let f = facts(
            256 * MIB,
            vec![
                py(&driver, "get_empty_cache_for_benchmark", 761),
                py(&testing, "do_bench", 152),
                py(&tuner, "_bench", 164),
                py("/tmp/site/fla/ops/utils/cache.py", "run", 378),
                py("/tmp/site/fla/modules/norm/l2norm.py", "l2norm_fwd", 136),
                py(&module, "_call_impl", 1775),
            ],
        );
        let v = categorise(&f);
        assert_eq!(v.category, Category::Autotune);
        assert_eq!(frame_evidence(&v), ("driver.py".to_string(), 761));
    }

    #[test]
    fn transformers_serve_frames() {
        let cb = "/venv/site-packages/transformers/generation/continuous_batching";
        let cache = format!("{cb}/cache.py");
        let io = format!("{cb}/input_outputs.py");
        let mu = "/venv/site-packages/transformers/modeling_utils.py";
        let kv = categorise(&facts(
            564 * MIB,
            vec![
                py(&cache, "__init__", 251),
                py(&format!("{cb}/continuous_api.py"), "_generation_step", 900),
            ],
        ));
        assert_eq!(kv.category, Category::KvCache);
        assert_eq!(frame_evidence(&kv), ("cache.py".to_string(), 251));
        let io_v = categorise(&facts(
            MIB,
            vec![
                py(&io, "_setup_static_tensors", 180),
                py(&io, "__init__", 120),
            ],
        ));
        assert_eq!(io_v.category, Category::EngineBuffers);
        let w = categorise(&facts(
            784 * MIB,
            vec![py(mu, "caching_allocator_warmup", 4800)],
        ));
        assert_eq!(w.category, Category::Weights);
        // The paged cache's update reads keys and values into new tensors: not the cache.
        let read = categorise(&facts(MIB, vec![py(&cache, "update", 400)]));
        assert_eq!(read.category, Category::Unnamed);
    }

    #[test]
    fn module_init_is_weights_and_forward_is_activations_below_caches() {
        let linear = format!("{VENV}/torch/nn/modules/linear.py");
        let module = format!("{VENV}/torch/nn/modules/module.py");
        let model = "/venv/site-packages/transformers/models/qwen3_5/modeling_qwen3_5.py";
        let w = categorise(&facts(
            50 * MIB,
            vec![
                py(&format!("{VENV}/torch/_ops.py"), "__call__", 10),
                py(&linear, "__init__", 106),
                py(model, "__init__", 300),
                py(
                    "/venv/site-packages/transformers/modeling_utils.py",
                    "from_pretrained",
                    4500,
                ),
            ],
        ));
        assert_eq!(w.category, Category::Weights);
        assert_eq!(frame_evidence(&w), ("linear.py".to_string(), 106));
        let cache_utils = "/venv/site-packages/transformers/cache_utils.py";
        let kv = categorise(&facts(
            MIB,
            vec![
                py(cache_utils, "update", 120),
                py(model, "forward", 500),
                py(&module, "_call_impl", 1775),
            ],
        ));
        assert_eq!(kv.category, Category::KvCache);
        let st = categorise(&facts(
            MIB,
            vec![
                py(cache_utils, "update_conv_state", 800),
                py(model, "forward", 600),
                py(&module, "_call_impl", 1775),
            ],
        ));
        assert_eq!(st.category, Category::State);
        let act = categorise(&facts(
            MIB,
            vec![py(model, "forward", 510), py(&module, "_call_impl", 1775)],
        ));
        assert_eq!(act.category, Category::Activations);
        // A recurrent state made by fla inside the forward, carried between steps: lifetime
        // decides before the forward rule.
        let mut carried = facts(
            3 * MIB,
            vec![
                py(
                    "/tmp/site/fla/ops/common/chunk_delta_h.py",
                    "chunk_gated_delta_rule_fwd_h",
                    722,
                ),
                py(model, "forward", 610),
                py(&module, "_call_impl", 1775),
            ],
        );
        carried.lifetime = Lifetime::Carried { per_step: 12 };
        assert_eq!(categorise(&carried).category, Category::State);
    }

    #[test]
    fn native_rules_nccl_cublas_llama_cpp() {
        let c10d = format!("{VENV}/torch/distributed/distributed_c10d.py");
        let nccl = Facts {
            bytes: 2 * MIB,
            python: vec![py(&c10d, "_new_process_group_helper", 2253)],
            native: vec![
                NativeFrame {
                    module: "libnccl.so.2 (not the traced file)",
                    symbol: None,
                },
                NativeFrame {
                    module: "libtorch_cuda.so",
                    symbol: None,
                },
            ],
            label: Some("ncclCommInitRankConfig"),
            ..Default::default()
        };
        let v = categorise(&nccl);
        assert_eq!(v.category, Category::Communication);
        // NCCL's range over the program's own tensor is not read (samples/h200/nccl-stages).
        let user = Facts {
            bytes: 1 << 30,
            python: vec![py("/work/nccl_stages.py", "main", 67)],
            label: Some("ncclCommInitRankConfig"),
            ..Default::default()
        };
        let v = categorise(&user);
        assert_eq!(v.category, Category::Unnamed);
        assert_eq!(
            v.evidence,
            Evidence::Site {
                site: "nccl_stages.py:67 main".to_string()
            }
        );
        let cublas = Facts {
            bytes: 64 * MIB,
            python: vec![py("/work/torch_prefill.py", "prefill", 55)],
            native: vec![
                NativeFrame {
                    module: "libcublas.so.13 (not the traced file)",
                    symbol: None,
                },
                NativeFrame {
                    module: "libtorch_cuda.so (not the traced file)",
                    symbol: None,
                },
            ],
            ..Default::default()
        };
        assert_eq!(categorise(&cublas).category, Category::Context);
        let llama = |sym: &'static str| Facts {
            bytes: MIB,
            native: vec![
                NativeFrame {
                    module: "libcudart.so.12",
                    symbol: Some("cudaMalloc"),
                },
                NativeFrame {
                    module: "libggml-cuda.so",
                    symbol: Some("ggml_backend_cuda_buffer_type_alloc_buffer"),
                },
                NativeFrame {
                    module: "libllama.so",
                    symbol: Some(sym),
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            categorise(&llama("llama_kv_cache::llama_kv_cache(llama_model const&)")).category,
            Category::KvCache
        );
        assert_eq!(
            categorise(&llama("llama_model::load_tensors(llama_model_loader&)")).category,
            Category::Weights
        );
        assert_eq!(
            categorise(&llama("llama_memory_recurrent::llama_memory_recurrent()")).category,
            Category::State
        );
        // A multimodal projector's weights, under mtmd's own loader (no GPU run has shown one).
        let mmproj = categorise(&llama("clip_model_loader::load_tensors(clip_ctx&)"));
        assert_eq!(mmproj.category, Category::Weights);
        assert!(
            matches!(&mmproj.evidence, Evidence::Native { rule, .. } if rule.contains("mmproj")),
            "{:?}",
            mmproj.evidence
        );
        // ggml's own cuBLAS workspace, as the H200 symbolised it (samples/h200/llama-bench).
        let workspace = Facts {
            bytes: 32 * MIB,
            native: vec![
                NativeFrame {
                    module: "libcudart.so.13",
                    symbol: Some("cudaMalloc"),
                },
                NativeFrame {
                    module: "libggml-cuda.so.0",
                    symbol: Some("ggml_backend_cuda_context::cublas_handle()"),
                },
            ],
            ..Default::default()
        };
        assert_eq!(categorise(&workspace).category, Category::Context);
        // ggml's VMM pool: its scratch is a pool's, apart from the compute buffer.
        let pool = Facts {
            bytes: 8 * MIB,
            native: vec![
                NativeFrame {
                    module: "libggml-cuda.so.0",
                    symbol: Some("ggml_cuda_pool_vmm::alloc(unsigned long, unsigned long*)"),
                },
                NativeFrame {
                    module: "libggml-cuda.so.0",
                    symbol: Some("ggml_cuda_pool_alloc<__half>::alloc(unsigned long)"),
                },
            ],
            ..Default::default()
        };
        assert_eq!(categorise(&pool).category, Category::AllocatorReserve);
        let unknown = categorise(&llama("my_own_function()"));
        assert_eq!(unknown.category, Category::Unnamed);
        // Grouped by the first frame that is not an allocator's.
        assert_eq!(
            unknown.evidence,
            Evidence::Site {
                site: "ggml_backend_cuda_buffer_type_alloc_buffer (libggml-cuda.so)".to_string()
            }
        );
    }

    #[test]
    fn labels_and_their_order() {
        let l = |label: &'static str| Facts {
            bytes: 1,
            label: Some(label),
            ..Default::default()
        };
        assert_eq!(
            categorise(&l("prefill/weights")).category,
            Category::Weights
        );
        assert_eq!(
            categorise(&l("prefill/kv_cache")).category,
            Category::KvCache
        );
        assert_eq!(
            categorise(&l("gdn/recurrent_state")).category,
            Category::State
        );
        assert_eq!(
            categorise(&l("prefill/capacity")).category,
            Category::OtherProcess
        );
        let other = categorise(&l("prefill/gdn"));
        assert_eq!(other.category, Category::Activations);
        assert_eq!(categorise(&Facts::default()).category, Category::Unnamed);
        // A site rule beats a label.
        let mut f = l("prefill/weights");
        f.python = vec![py(
            "/v/site-packages/transformers/cache_utils.py",
            "update",
            1,
        )];
        assert_eq!(categorise(&f).category, Category::KvCache);
    }

    #[test]
    fn what_an_attach_seeded_is_named_by_the_objects_holding_it_or_said_unnamed() {
        // A block seeded at an attach: its label says so, the probe's walk may name it.
        let seeded = |name: Option<&'static str>| Facts {
            bytes: 1,
            label: Some(BEFORE_ATTACH),
            name,
            ..Default::default()
        };
        let bare = categorise(&seeded(None));
        assert_eq!(bare.category, Category::Unnamed);
        assert_eq!(bare.evidence, Evidence::BeforeAttach);
        assert_eq!(
            bare.evidence.to_string(),
            "allocated before the attach; no Python object names it"
        );
        for (name, c) in [
            (
                "weights: model.layers.3.mlp.up_proj.weight bfloat16[9728, 2560]",
                Category::Weights,
            ),
            (
                "weights: model.rotary_emb.inv_freq (buffer) float32[64]",
                Category::Weights,
            ),
            (
                "PagedAttentionCache.key_cache[3] bfloat16[40960, 8, 128]",
                Category::KvCache,
            ),
            ("PagedAttentionCache.value_cache[0]", Category::KvCache),
            // The engine's static tensors, whatever words their attributes hold.
            (
                "ContinuousBatchingIOs._bulk_input_tensor int32[9, 288]",
                Category::EngineBuffers,
            ),
            ("ContinuousBatchingIOs.block_table", Category::EngineBuffers),
            (
                "ContinuousBatchingIOs.read_index_storage",
                Category::EngineBuffers,
            ),
            (
                "ContinuousBatchingIOs.attention_mask['full_attention']",
                Category::EngineBuffers,
            ),
            // Another object's tensor with no word of a category: the program's own.
            ("Sampler.scratch", Category::Activations),
        ] {
            assert_eq!(categorise(&seeded(Some(name))).category, c, "{name}");
        }
    }

    #[test]
    fn qualified_functions_tell_sglang_pools_apart() {
        let pool = "/v/site-packages/sglang/srt/mem_cache/memory_pool.py";
        assert_eq!(
            categorise(&facts(1, vec![py(pool, "MambaPool.__init__", 10)])).category,
            Category::State
        );
        assert_eq!(
            categorise(&facts(1, vec![py(pool, "ReqToTokenPool.__init__", 10)])).category,
            Category::EngineBuffers
        );
        assert_eq!(
            categorise(&facts(1, vec![py(pool, "_create_buffers", 10)])).category,
            Category::KvCache
        );
        // A plain `__init__` cannot say which pool: the KV pools, the file's main business.
        assert_eq!(
            categorise(&facts(1, vec![py(pool, "__init__", 10)])).category,
            Category::KvCache
        );
    }

    #[test]
    fn unnamed_groups_by_the_python_line_not_the_allocator() {
        let utils = format!("{VENV}/torch/_utils.py");
        let ops = format!("{VENV}/torch/_ops.py");
        let f = Facts {
            bytes: 1,
            python: vec![
                py("/x/vramtrace_torch.py", "on_alloc", 40),
                py(&utils, "fire_callbacks", 900),
                py(&ops, "__call__", 10),
                py("/work/app.py", "step", 12),
            ],
            native: vec![NativeFrame {
                module: "libc10_cuda.so",
                symbol: Some("c10::cuda::CUDACachingAllocator::Native::malloc"),
            }],
            ..Default::default()
        };
        assert_eq!(
            categorise(&f).evidence,
            Evidence::Site {
                site: "app.py:12 step".to_string()
            }
        );
        let native_only = Facts {
            bytes: 1,
            native: vec![
                NativeFrame {
                    module: "libtorch_cuda.so",
                    symbol: Some("at::detail::empty_generic(...)"),
                },
                NativeFrame {
                    module: "libc10_cuda.so",
                    symbol: None,
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            categorise(&native_only).evidence,
            Evidence::Site {
                site: "no Python frame (libc10_cuda.so)".to_string()
            }
        );
    }

    #[test]
    fn category_names_are_the_reports() {
        let keys: Vec<&str> = Category::ALL.iter().map(|c| c.key()).collect();
        assert_eq!(
            keys,
            [
                "weights",
                "kv_cache",
                "state",
                "activations",
                "engine_buffers",
                "cuda_graphs",
                "communication",
                "autotune",
                "allocator_reserve",
                "context",
                "other_process",
                "unnamed"
            ]
        );
        assert_eq!(Category::parse("KV cache"), Some(Category::KvCache));
        assert_eq!(Category::parse("kv_cache"), Some(Category::KvCache));
        assert_eq!(
            serde_json::to_string(&Category::AllocatorReserve).unwrap(),
            "\"allocator_reserve\""
        );
    }
}
