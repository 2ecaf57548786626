//! vramtrace: GPU memory profiler and allocation tracer.

pub mod attribution;
pub mod cli;
pub mod commands;
pub mod error;
pub mod events;
pub mod model;
pub mod preload;
pub mod replay;
pub mod summary;
pub mod trace;
pub mod units;

pub use error::Error;
pub use trace::{Process, Trace};

pub mod symbolize;
#[cfg(test)]
mod tests;
