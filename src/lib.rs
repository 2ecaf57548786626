//! vramtrace
