//! vramtrace: GPU memory profiler and allocation tracer.

pub mod cli;
pub mod commands;
pub mod model;
