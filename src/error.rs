//! The library's error type: every fallible function of the library returns [`Error`] or
//! one of the per-area errors it wraps (`ExportError`, `ImportError`, the models' `ModelError`).

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
    /// A trace's stored symbols (`<pid>.symbols.json`) could not be parsed.
    #[error("{0} is not a symbols file vramtrace wrote")]
    BadSymbols(PathBuf, #[source] serde_json::Error),
    /// A trace file with no bytes.
    #[error("the file is empty: its process ended (or was killed) before it wrote the header")]
    EmptyTraceFile,
    /// A total went past what 64 bits hold: the trace's sizes cannot be real.
    #[error("{0}")]
    Overflow(String),
    /// A model could not predict for the configuration or shape asked for.
    #[error(transparent)]
    Model(#[from] vramtrace_models::ModelError),
    /// An export failed (its own error says which part).
    #[error(transparent)]
    Export(Box<ExportError>),
    /// An import failed (its own error says which part).
    #[error(transparent)]
    Import(#[from] crate::import::ImportError),
    /// No model variant could be set beside a moment.
    #[error("no model variant to compare with")]
    NoVariant,
    /// No device allocation of the process and device asked for is in the trace.
    #[error("no device allocation of the chosen process and device is in the trace")]
    NoDeviceAllocation,
    /// The failure asked for is not in the trace.
    #[error(
        "process {pid} has {count} out-of-memory failure(s) on device {device}{}; there is no failure #{index}{}",
        if *.with_tensors { " (PyTorch's allocator's and the driver's together)" } else { "" },
        if *.with_tensors { "" } else { " (calls refused for other reasons, such as CUDA_ERROR_NOT_PERMITTED, are not out-of-memory: `vramtrace summary` lists them)" }
    )]
    NoSuchFailure {
        /// The process.
        pid: u32,
        /// The device.
        device: i32,
        /// The failure asked for, counting from 0.
        index: usize,
        /// How many it has.
        count: usize,
        /// Whether PyTorch's refusals are counted with the driver's.
        with_tensors: bool,
    },
    /// A value given on the command line or in an option is not valid; the message says what to
    /// write instead.
    #[error("{0}")]
    Invalid(String),
    /// A value could not be parsed; the message says which and what to write, the source why.
    #[error("{what}")]
    Unparsable {
        /// What was being parsed, and where.
        what: String,
        /// The parser's own error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// What a trace holds cannot answer the question asked of it (no device allocation, the
    /// resident bytes past the capacity ...); the message says which.
    #[error("{0}")]
    Unanswerable(String),
}

impl From<ExportError> for Error {
    fn from(e: ExportError) -> Error {
        Error::Export(Box::new(e))
    }
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error with its causes, as one line: `what: why: why` (the way the binary prints errors).
pub fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(c) = source {
        s.push_str(": ");
        s.push_str(&c.to_string());
        source = c.source();
    }
    s
}

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The trace could not be read.
    #[error(transparent)]
    Trace(#[from] Error),
    /// Writing the output failed.
    #[error("cannot write {0}")]
    Write(std::path::PathBuf, #[source] std::io::Error),
    /// Writing the output failed (a stream with no path).
    #[error("cannot write the output")]
    Io(#[from] std::io::Error),
    /// The Parquet encoder refused something.
    #[error("cannot encode Parquet")]
    Parquet(#[from] ::parquet::errors::ParquetError),
    /// The pickle encoder refused something.
    #[error("cannot encode the pickle")]
    Pickle(#[from] serde_pickle::Error),
    /// The trace holds nothing this format can show.
    #[error("{0}")]
    Nothing(String),
}
