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
    /// A size does not fit in what the models count: a tensor, a total or a per-model figure
    /// would take more than [`crate::MAX_BYTES`] bytes (no machine holds that), or a count is
    /// past its cap. The message names the tensor or quantity and how large it would be.
    #[error("{0}")]
    TooLarge(String),
    /// The request itself makes no sense (no tokens, unknown variant, ...).
    #[error("{0}")]
    Invalid(String),
}

/// `v` as a byte count, or [`ModelError::TooLarge`] naming `what` when it is past
/// [`crate::MAX_BYTES`]: figures are computed in 128 bits, where inputs capped at
/// [`crate::MAX_COUNT`] cannot overflow, and then must fit.
pub(crate) fn fit_bytes(what: &str, v: u128) -> Result<u64, ModelError> {
    if v <= u128::from(crate::MAX_BYTES) {
        Ok(v as u64)
    } else {
        Err(ModelError::TooLarge(format!(
            "{what} would be {v} bytes, more than the {} bytes (4 EiB) the models count; check the config's sizes",
            crate::MAX_BYTES
        )))
    }
}

/// Like [`fit_bytes`], for a count (parameters, channels).
pub(crate) fn fit_count(what: &str, v: u128) -> Result<u64, ModelError> {
    fit_bytes(what, v).map_err(|_| {
        ModelError::TooLarge(format!(
            "{what} would be {v}, more than the models count; check the config's sizes"
        ))
    })
}
