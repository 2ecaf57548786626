//! The errors of the analytical models.

use std::path::PathBuf;

/// Why a model configuration or a prediction request was refused.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The config file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The config file is not JSON.
    #[error("{path} is not valid JSON")]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// A field the models need is absent.
    #[error(
        "{path} has no `{field}` (looked in `text_config` and at the top level); the models need it, so use the model's complete config.json"
    )]
    MissingField {
        /// The file.
        path: PathBuf,
        /// The missing field.
        field: &'static str,
    },
    /// A field is present but unusable.
    #[error("`{field}` in {path} is invalid: {reason}")]
    InvalidField {
        /// The file.
        path: PathBuf,
        /// The field (its name, without the `text_config` it may sit in).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Tensor parallelism cannot split a head count evenly.
    #[error(
        "the model has {count} {what}, which tensor parallelism of {tp} cannot split evenly; choose a TP degree that divides {count}"
    )]
    TpNotDivisible {
        /// What is being split (`linear_num_value_heads`).
        what: &'static str,
        /// How many there are.
        count: u64,
        /// The TP degree asked for.
        tp: u64,
    },
    /// The request itself makes no sense (no tokens, unknown variant, ...).
    #[error("{0}")]
    Invalid(String),
}
