//! plots
