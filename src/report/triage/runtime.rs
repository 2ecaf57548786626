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
