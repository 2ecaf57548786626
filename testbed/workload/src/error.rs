//! The workload's error type. Every message is a sentence that says what to do.

/// Everything that can stop a workload run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `libcuda.so` could not be loaded.
    #[error(
        "no CUDA driver library (libcuda.so / libcuda.so.1) could be loaded: install the NVIDIA \
         driver, or run with --simulate against the stand-in driver \
         (LD_LIBRARY_PATH=$CARGO_TARGET_DIR/debug, where testbed/fakecuda builds libcuda.so)"
    )]
    NoDriver,
    /// The driver loaded but reports no device (or not the one asked for).
    #[error(
        "the CUDA driver reports {count} device(s), so device {ordinal} does not exist: run on a machine with an NVIDIA GPU, or use --simulate with the stand-in driver"
    )]
    NoDevice {
        /// Devices the driver reported.
        count: i32,
        /// The ordinal that was asked for.
        ordinal: usize,
    },
    /// The driver is vramtrace's stand-in, which allocates but cannot run kernels.
    #[error(
        "the CUDA driver loaded is vramtrace's stand-in (testbed/fakecuda), which records \
         allocations but cannot run kernels: add --simulate to use it, or run on a machine \
         with an NVIDIA GPU"
    )]
    StandInDriver,
    /// `libnvrtc.so` could not be loaded.
    #[error(
        "NVRTC (libnvrtc.so.13) could not be loaded, so the kernels cannot be compiled: \
         install it (CUDA 13 toolkit, or `python3 -m pip install nvidia-cuda-nvrtc==13.0.88` \
         and add site-packages/nvidia/cu13/lib to LD_LIBRARY_PATH), or run with --simulate"
    )]
    NoNvrtc,
    /// NVRTC rejected the kernel source.
    #[error("NVRTC failed to compile the workload kernels ({what}):\n{log}")]
    Compile {
        /// The failing step.
        what: String,
        /// The compiler log.
        log: String,
    },
    /// A driver call failed.
    #[error("{call} failed: {message}")]
    Driver {
        /// The driver entry point or operation.
        call: String,
        /// The driver's error name and description.
        message: String,
    },
    /// A device allocation failed (for example out of memory).
    #[error("{0}")]
    Alloc(Box<AllocFailure>),
    /// The model's config.json cannot be read or sized.
    #[error("{0}")]
    Model(String),
    /// The sizes given on the command line do not describe a valid problem.
    #[error("{0}")]
    InvalidShape(String),
    /// Writing dump files failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The file being written.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// A device allocation that failed: what was asked for, where, and what the
/// session held then.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "allocating {name} ({dtype} {shape:?}, {bytes} bytes) failed: {message}{hint}",
    hint = if *out_of_memory { "; the card does not have room for it (this is the OOM the trace records)" } else { "" }
)]
pub struct AllocFailure {
    /// The tensor's name.
    pub name: String,
    /// Its element type name.
    pub dtype: String,
    /// Its shape.
    pub shape: Vec<i64>,
    /// Bytes requested.
    pub bytes: usize,
    /// The driver's message.
    pub message: String,
    /// Whether the driver said CUDA_ERROR_OUT_OF_MEMORY.
    pub out_of_memory: bool,
    /// The range path open at the request (`prefill/chunk.3/layer.7/gdn/...`),
    /// the label the preload gives the failed request.
    pub stage: String,
    /// Bytes the session held when the request failed.
    pub live_bytes: usize,
    /// Free device memory then (`cuMemGetInfo_v2`), when the device says.
    pub device_free: Option<usize>,
}

impl From<vramtrace_models::ModelError> for Error {
    fn from(e: vramtrace_models::ModelError) -> Self {
        Error::Model(e.to_string())
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
