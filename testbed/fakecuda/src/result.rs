//! `CUresult` codes, with the names and descriptions `cuGetErrorName` and
//! `cuGetErrorString` report for them.

use std::ffi::CStr;

/// The driver's status code (`CUresult`, a C enum of `unsigned int` width).
pub(crate) type CUresult = u32;

/// Result of a bookkeeping operation: the value, or the code the API returns.
pub(crate) type Res<T> = Result<T, CUresult>;

pub(crate) const CUDA_SUCCESS: CUresult = 0;
pub(crate) const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub(crate) const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub(crate) const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub(crate) const CUDA_ERROR_DEINITIALIZED: CUresult = 4;
pub(crate) const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub(crate) const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub(crate) const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub(crate) const CUDA_ERROR_UNSUPPORTED_LIMIT: CUresult = 215;
pub(crate) const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub(crate) const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub(crate) const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
pub(crate) const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// Code, `cuGetErrorName` text, `cuGetErrorString` text.
const MESSAGES: &[(CUresult, &CStr, &CStr)] = &[
    (CUDA_SUCCESS, c"CUDA_SUCCESS", c"no error"),
    (
        CUDA_ERROR_INVALID_VALUE,
        c"CUDA_ERROR_INVALID_VALUE",
        c"invalid argument",
    ),
    (
        CUDA_ERROR_OUT_OF_MEMORY,
        c"CUDA_ERROR_OUT_OF_MEMORY",
        c"out of memory",
    ),
    (
        CUDA_ERROR_NOT_INITIALIZED,
        c"CUDA_ERROR_NOT_INITIALIZED",
        c"initialization error",
    ),
    (
        CUDA_ERROR_DEINITIALIZED,
        c"CUDA_ERROR_DEINITIALIZED",
        c"driver shutting down",
    ),
    (
        CUDA_ERROR_NO_DEVICE,
        c"CUDA_ERROR_NO_DEVICE",
        c"no CUDA-capable device is detected",
    ),
    (
        CUDA_ERROR_INVALID_DEVICE,
        c"CUDA_ERROR_INVALID_DEVICE",
        c"invalid device ordinal",
    ),
    (
        CUDA_ERROR_INVALID_CONTEXT,
        c"CUDA_ERROR_INVALID_CONTEXT",
        c"invalid device context",
    ),
    (
        CUDA_ERROR_UNSUPPORTED_LIMIT,
        c"CUDA_ERROR_UNSUPPORTED_LIMIT",
        c"limit is not supported on this architecture",
    ),
    (
        CUDA_ERROR_INVALID_HANDLE,
        c"CUDA_ERROR_INVALID_HANDLE",
        c"invalid resource handle",
    ),
    (
        CUDA_ERROR_NOT_FOUND,
        c"CUDA_ERROR_NOT_FOUND",
        c"named symbol not found",
    ),
    (
        CUDA_ERROR_NOT_SUPPORTED,
        c"CUDA_ERROR_NOT_SUPPORTED",
        c"operation not supported",
    ),
    (CUDA_ERROR_UNKNOWN, c"CUDA_ERROR_UNKNOWN", c"unknown error"),
];

/// The enum name of `code` (`CUDA_ERROR_OUT_OF_MEMORY`), if this driver knows it.
pub(crate) fn name(code: CUresult) -> Option<&'static CStr> {
    MESSAGES.iter().find(|m| m.0 == code).map(|m| m.1)
}

/// The human description of `code` (`out of memory`), if this driver knows it.
pub(crate) fn description(code: CUresult) -> Option<&'static CStr> {
    MESSAGES.iter().find(|m| m.0 == code).map(|m| m.2)
}

/// Collapses a bookkeeping result into the code the API returns.
pub(crate) fn code(result: Res<()>) -> CUresult {
    match result {
        Ok(()) => CUDA_SUCCESS,
        Err(code) => code,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_one_name_and_description() {
        for (i, m) in MESSAGES.iter().enumerate() {
            assert!(
                MESSAGES[i + 1..].iter().all(|o| o.0 != m.0),
                "{} twice",
                m.0
            );
        }
        assert_eq!(name(2), Some(c"CUDA_ERROR_OUT_OF_MEMORY"));
        assert_eq!(description(2), Some(c"out of memory"));
        assert_eq!(name(12345), None);
    }
}
