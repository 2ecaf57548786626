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
    /// A path that is neither a directory nor a regular file (a FIFO, a device, a socket).
    #[error("{0} is not a regular file but {1}; give a trace directory or one trace file (*.vtr)")]
    NotRegular(PathBuf, &'static str),
    /// Every trace file of a directory was unreadable.
    #[error("{0} holds no readable trace file: {1}")]
    NoReadableTrace(PathBuf, String),
    /// A total went past what 64 bits hold: the trace's sizes cannot be real.
    #[error("{0}")]
    Overflow(String),
}
