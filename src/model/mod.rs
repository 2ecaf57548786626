//! Analytical memory models (placeholder until the models land).
