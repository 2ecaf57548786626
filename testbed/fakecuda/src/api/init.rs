//! Initialisation, version, error strings and `cuGetProcAddress`.

use std::ffi::{CStr, c_char, c_int, c_uint};

use super::store;
use crate::driver::DRIVER_VERSION;
use crate::result::{self, *};
use crate::state;

/// `cuInit`: reads the `VRAMTRACE_FAKE_*` configuration on the first call.
/// A bad variable gives `CUDA_ERROR_INVALID_VALUE` (and one line on stderr);
/// zero devices give `CUDA_ERROR_NO_DEVICE`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    state::init(flags)
}

/// `cuDriverGetVersion`: 13000. Works before `cuInit`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    state::count("cuDriverGetVersion");
    // Safety: `version` is null or writable per the API contract.
    code(unsafe { store(version, DRIVER_VERSION) })
}

/// Shared body of `cuGetErrorString` and `cuGetErrorName`.
///
/// # Safety
/// `out` must be null or valid for writes.
unsafe fn error_text(text: Option<&'static CStr>, out: *mut *const c_char) -> CUresult {
    match text {
        // Safety: `out` is null or writable per the API contract.
        Some(text) => code(unsafe { store(out, text.as_ptr()) }),
        None => {
            // Safety: as above; unknown codes yield a null string.
            let _ = unsafe { store(out, std::ptr::null()) };
            CUDA_ERROR_INVALID_VALUE
        }
    }
}

/// `cuGetErrorString`: "out of memory" for 2, and so on. Works before `cuInit`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, text: *mut *const c_char) -> CUresult {
    state::count("cuGetErrorString");
    // Safety: forwarded API contract.
    unsafe { error_text(result::description(error), text) }
}

/// `cuGetErrorName`: "CUDA_ERROR_OUT_OF_MEMORY" for 2, and so on. Works before `cuInit`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, text: *mut *const c_char) -> CUresult {
    state::count("cuGetErrorName");
    // Safety: forwarded API contract.
    unsafe { error_text(result::name(error), text) }
}

/// Not part of CUDA: how often the exported function `name` has been called
/// in this process (0 for unknown names or a null `name`). Lets tests check
/// which entry points a client really used.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramtrace_fake_call_count(name: *const c_char) -> u64 {
    if name.is_null() {
        return 0;
    }
    // Safety: non-null and NUL-terminated per this function's contract.
    match unsafe { CStr::from_ptr(name) }.to_str() {
        Ok(name) => state::calls(name),
        Err(_) => 0,
    }
}
