//! Bytes as a trace file: decoded whole ([`TraceFile::from_bytes`]) and streamed from disk
//! ([`FileReader`] → [`Trace`] → summary and events), as `vramtrace summary` reads one. Any input
//! must give a result or an error: no panic, no hang, no allocation beyond the input's size.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use vramtrace::summary::{SummaryOptions, summarize};
use vramtrace::trace::Trace;
use vramtrace_format::TraceFile;

/// One file per fuzzing process, rewritten for each input.
fn scratch() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("vramtrace-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d.join("1.vtr")
    })
}

fuzz_target!(|data: &[u8]| {
    let _ = TraceFile::from_bytes(Path::new("fuzz.vtr"), data);
    let p = scratch();
    std::fs::write(p, data).unwrap();
    if let Ok(trace) = Trace::open(p) {
        let _ = summarize(&trace, SummaryOptions::default());
        let mut sink = std::io::sink();
        let _ = vramtrace::events::write_events(&trace, false, &mut sink);
    }
});
