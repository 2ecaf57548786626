//! The library's error type.

use std::path::PathBuf;

/// Errors from reading and analysing traces.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A path could not be read.
    #[error("cannot read {0}")]
    Io(PathBuf, #[source] std::io::Error),
    /// A trace file is not valid.
    #[error(transparent)]
    Read(#[from] vramtrace_format::ReadError),
    /// A trace directory holds no trace files.
    #[error(
        "{0} holds no trace files (*.vtr): was the program run under `vramtrace run`, and did it touch CUDA?"
    )]
    EmptyTraceDir(PathBuf),
}
