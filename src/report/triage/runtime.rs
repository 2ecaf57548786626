//! Which program a trace ran ([`detect_runtime`]), and which frames of a stack are the program's
//! own rather than the allocation machinery's ([`user_stack`]; the tipping request's line).

use vramtrace_models::Runtime;

use crate::trace::Trace;

/// The program a trace ran, from the engines' own signatures, counted over every Python frame of
/// every process (so the answer does not depend on which stack is met first): frames under a
/// `vllm/` package are vLLM's, under `transformers/` transformers'; the reference workload by its
/// chunk labels. `None` when none shows, or when vLLM's and transformers' frames both do (vLLM
/// imports transformers' configs): then `--runtime` says. The project's own validation scripts
/// are not recognised by their file names: give `--runtime torch-prefill-script`.
pub fn detect_runtime(trace: &Trace) -> Option<Runtime> {
    let (mut vllm, mut transformers, mut workload) = (0u64, 0u64, false);
    for p in &trace.processes {
        for frames in p.py_stacks.values() {
            for f in frames {
                let file = p.string(f.file).unwrap_or("");
                if file.contains("/vllm/") {
                    vllm += 1;
                } else if file.contains("/transformers/") {
                    transformers += 1;
                }
            }
        }
        workload |= p.strings.values().any(|s| s.starts_with("prefill/chunk."));
    }
    match (vllm > 0, transformers > 0) {
        (true, false) => Some(Runtime::Vllm),
        (false, true) => Some(Runtime::Transformers),
        // vLLM runs transformers' config and tokenizer code too: its frames decide only when
        // the model's forward ran under vLLM's own modules.
        (true, true) => None,
        (false, false) => workload.then_some(Runtime::Workload),
    }
}

/// Frames of the allocation machinery a triager does not look for: the driver binding, the
/// caching allocator, PyTorch's C++ dispatch, Rust's runtime (unwinding guards), a backend's
/// allocation wrapper and the reference workload's tensor factory (`Session::empty`, its
/// `torch.empty`).
const MACHINERY: [&str; 16] = [
    "cudarc::",
    "cuMem",
    "libcuda",
    "c10::",
    "at::",
    "libc10",
    "libtorch",
    "Backend",
    "backend::",
    "::alloc",
    "core::",
    "std::",
    "__rust",
    "::guarded",
    "Session::empty",
    "__libc",
];

fn is_user_frame(f: &str) -> bool {
    !f.contains("(not the traced file)")
        && !f.starts_with("0x")
        && !MACHINERY.iter().any(|m| f.contains(m))
}

/// The first user or library frame of a stack: the innermost Python frame
/// (`file.py:LINE function`), else the innermost symbolised frame past the allocation machinery
/// ([`MACHINERY`]); `None` when neither is there.
pub(crate) fn first_user_frame(frames: &[String]) -> Option<String> {
    frames
        .iter()
        .find(|f| f.contains(".py:"))
        .or_else(|| frames.iter().find(|f| is_user_frame(f)))
        .cloned()
}

/// A stack (innermost first) from its first user or library frame: the frames of the
/// allocation machinery before it dropped, and how many were. Python frames count as the
/// program's; a stack with no such frame is kept whole.
pub fn user_stack(frames: &[String]) -> (usize, &[String]) {
    match frames
        .iter()
        .position(|f| f.contains(".py:") || is_user_frame(f))
    {
        Some(i) => (i, &frames[i..]),
        None => (0, frames),
    }
}
