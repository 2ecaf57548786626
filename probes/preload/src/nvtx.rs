//! NVTX v3 injection: with `NVTX_INJECTION64_PATH` naming this library, the NVTX loader
//! compiled into the program (PyTorch, the `nvtx` crate, anything built on NVIDIA's header)
//! `dlopen`s it on the first NVTX call and calls [`InitializeInjectionNvtx2`]. We then fill the
//! slots of the calls that open and close ranges and make marks:
//!
//! | module | slot | call |
//! |---|---|---|
//! | CORE (1) | 1, 2, 3 | `nvtxMarkEx`, `nvtxMarkA`, `nvtxMarkW` |
//! | CORE (1) | 8, 9, 10, 11 | `nvtxRangePushEx`, `nvtxRangePushA`, `nvtxRangePushW`, `nvtxRangePop` |
//! | CORE2 (5) | 1 | `nvtxDomainMarkEx` |
//! | CORE2 (5) | 4, 5 | `nvtxDomainRangePushEx`, `nvtxDomainRangePop` |
//! | CORE2 (5) | 10, 11 | `nvtxDomainRegisterStringA`, `nvtxDomainRegisterStringW` |
//!
//! ASCII messages are taken as they are, wide ones converted to UTF-8. Registered strings (the
//! `nvtx` crate registers every domain message) are copied once at registration, and the handle
//! we return is that copy; a handle we did not hand out reads as `?`, so every push NVTX
//! delivers still has its pop. Domains share the thread's stack. Start/end ranges (not nested) are not used.
//! The ids and layouts come from the NVTX v3 ABI documentation; no NVIDIA header is included.

use core::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::labels::{c_str, mark, range_pop, range_push};

const NVTX_ETID_CALLBACKS: u32 = 1;
const NVTX_CB_MODULE_CORE: c_int = 1;
const NVTX_CB_MODULE_CORE2: c_int = 5;
const NVTX_MESSAGE_TYPE_ASCII: i32 = 1;
const NVTX_MESSAGE_TYPE_UNICODE: i32 = 2;
const NVTX_MESSAGE_TYPE_REGISTERED: i32 = 3;
/// Bytes of a wide message kept after conversion.
const WIDE_MAX: usize = 512;

type FunctionPointer = *const c_void;
type FunctionTable = *mut *mut FunctionPointer;
type GetModuleFunctionTable = unsafe extern "C" fn(
    module: c_int,
    out_table: *mut FunctionTable,
    out_size: *mut c_uint,
) -> c_int;
type GetExportTable = unsafe extern "C" fn(export_table_id: u32) -> *const c_void;

/// `NvtxExportTableCallbacks`.
#[repr(C)]
struct ExportTableCallbacks {
    struct_size: usize,
    get_module_function_table: Option<GetModuleFunctionTable>,
}

/// `nvtxEventAttributes_t` (version 2 and later), the fields up to the message.
#[repr(C)]
struct EventAttributes {
    version: u16,
    size: u16,
    category: u32,
    color_type: i32,
    color: u32,
    payload_type: i32,
    reserved0: i32,
    payload: u64,
    message_type: i32,
    message: *const c_char,
}

/// Converts a NUL-terminated `wchar_t` (UTF-32 on Linux) string into UTF-8 in `buf`.
///
/// # Safety
/// `w` is null or a valid NUL-terminated wide string.
unsafe fn wide(w: *const u32, buf: &mut [u8; WIDE_MAX]) -> &[u8] {
    if w.is_null() {
        return b"?";
    }
    let mut len = 0;
    let mut i = 0;
    loop {
        // Safety: reading up to the terminating NUL of the caller's string.
        let c = unsafe { *w.add(i) };
        if c == 0 {
            break;
        }
        let ch = char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER);
        if len + ch.len_utf8() > WIDE_MAX {
            break;
        }
        len += ch.encode_utf8(&mut buf[len..]).len();
        i += 1;
    }
    &buf[..len]
}

/// Handles of the strings registered through us (each a leaked NUL-terminated copy), so that
/// a registered message is only read when we made it.
const REGISTERED_SLOTS: usize = 1 << 13;
static REGISTERED: [AtomicUsize; REGISTERED_SLOTS] =
    [const { AtomicUsize::new(0) }; REGISTERED_SLOTS];

/// Fibonacci hashing: the top bits of the product index the table.
fn registered_slot(handle: usize) -> usize {
    (handle >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        >> (usize::BITS - REGISTERED_SLOTS.trailing_zeros())
}

fn remember(handle: usize) {
    let mut i = registered_slot(handle);
    for _ in 0..64 {
        if REGISTERED[i]
            .compare_exchange(0, handle, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return;
        }
        i = (i + 1) % REGISTERED_SLOTS;
    }
}

fn is_registered(handle: usize) -> bool {
    let mut i = registered_slot(handle);
    for _ in 0..64 {
        match REGISTERED[i].load(Ordering::Acquire) {
            0 => return false,
            h if h == handle => return true,
            _ => i = (i + 1) % REGISTERED_SLOTS,
        }
    }
    false
}

/// Copies `text` into a leaked NUL-terminated buffer and returns it as the string's handle.
fn register(text: &[u8]) -> *const c_void {
    let mut owned = Vec::with_capacity(text.len() + 1);
    owned.extend(text.iter().copied().filter(|&b| b != 0));
    owned.push(0);
    let p = Box::leak(owned.into_boxed_slice()).as_ptr();
    remember(p as usize);
    p as *const c_void
}

unsafe extern "C" fn domain_register_string_a(
    _domain: *mut c_void,
    s: *const c_char,
) -> *const c_void {
    // Safety: NVTX passes a NUL-terminated string or null.
    let text = unsafe { c_str(s) }.unwrap_or(b"?");
    std::panic::catch_unwind(|| register(text)).unwrap_or(core::ptr::null())
}

unsafe extern "C" fn domain_register_string_w(
    _domain: *mut c_void,
    s: *const u32,
) -> *const c_void {
    let mut buf = [0u8; WIDE_MAX];
    // Safety: NVTX passes a NUL-terminated wide string or null.
    let text = unsafe { wide(s, &mut buf) };
    std::panic::catch_unwind(|| register(text)).unwrap_or(core::ptr::null())
}

/// The message of an attributes struct (`?` for kinds we cannot read).
///
/// # Safety
/// `attr` is null or points at an `nvtxEventAttributes_t` of the size it states.
unsafe fn message(attr: *const EventAttributes, buf: &mut [u8; WIDE_MAX]) -> &[u8] {
    if attr.is_null() {
        return b"?";
    }
    // Safety: the caller's struct; `size` says how much of it exists.
    let a = unsafe { &*attr };
    if (a.size as usize) < core::mem::size_of::<EventAttributes>() {
        return b"?";
    }
    match a.message_type {
        // Safety: an ASCII message is a NUL-terminated string (or null).
        NVTX_MESSAGE_TYPE_ASCII => unsafe { c_str(a.message) }.unwrap_or(b"?"),
        // Safety: a Unicode message is a NUL-terminated wchar_t string (or null).
        NVTX_MESSAGE_TYPE_UNICODE => unsafe { wide(a.message as *const u32, buf) },
        NVTX_MESSAGE_TYPE_REGISTERED if is_registered(a.message as usize) => {
            // Safety: a handle we returned: our leaked NUL-terminated copy.
            unsafe { c_str(a.message) }.unwrap_or(b"?")
        }
        _ => b"?",
    }
}

unsafe extern "C" fn mark_a(text: *const c_char) {
    // Safety: NVTX passes a NUL-terminated string or null.
    mark(unsafe { c_str(text) }.unwrap_or(b"?"));
}

unsafe extern "C" fn mark_w(text: *const u32) {
    let mut buf = [0u8; WIDE_MAX];
    // Safety: NVTX passes a NUL-terminated wide string or null.
    mark(unsafe { wide(text, &mut buf) });
}

unsafe extern "C" fn mark_ex(attr: *const EventAttributes) {
    let mut buf = [0u8; WIDE_MAX];
    // Safety: NVTX passes its attributes struct.
    mark(unsafe { message(attr, &mut buf) });
}

unsafe extern "C" fn range_push_a(text: *const c_char) -> c_int {
    // Safety: NVTX passes a NUL-terminated string or null.
    range_push(unsafe { c_str(text) }.unwrap_or(b"?"))
}

unsafe extern "C" fn range_push_w(text: *const u32) -> c_int {
    let mut buf = [0u8; WIDE_MAX];
    // Safety: NVTX passes a NUL-terminated wide string or null.
    range_push(unsafe { wide(text, &mut buf) })
}

unsafe extern "C" fn range_push_ex(attr: *const EventAttributes) -> c_int {
    let mut buf = [0u8; WIDE_MAX];
    // Safety: NVTX passes its attributes struct.
    range_push(unsafe { message(attr, &mut buf) })
}

extern "C" fn range_pop_core() -> c_int {
    range_pop()
}

unsafe extern "C" fn domain_mark_ex(_domain: *mut c_void, attr: *const EventAttributes) {
    let mut buf = [0u8; WIDE_MAX];
    // Safety: NVTX passes its attributes struct.
    mark(unsafe { message(attr, &mut buf) });
}

unsafe extern "C" fn domain_range_push_ex(
    _domain: *mut c_void,
    attr: *const EventAttributes,
) -> c_int {
    let mut buf = [0u8; WIDE_MAX];
    // Safety: NVTX passes its attributes struct.
    range_push(unsafe { message(attr, &mut buf) })
}

extern "C" fn domain_range_pop(_domain: *mut c_void) -> c_int {
    range_pop()
}

/// Writes `slots` into `module`'s function table. False if NVTX does not offer the module.
///
/// # Safety
/// `get` is NVTX's `GetModuleFunctionTable`.
unsafe fn fill(
    get: GetModuleFunctionTable,
    module: c_int,
    slots: &[(usize, FunctionPointer)],
) -> bool {
    let mut table: FunctionTable = core::ptr::null_mut();
    let mut size: c_uint = 0;
    // Safety: NVTX's function with valid out-pointers.
    if unsafe { get(module, &mut table, &mut size) } == 0 || table.is_null() {
        return false;
    }
    for &(slot, f) in slots {
        if slot >= size as usize {
            continue;
        }
        // Safety: `table` has `size` + 1 entries (slot 0 unused), each null or the address of
        // the variable NVTX calls through for that slot.
        unsafe {
            let cell = *table.add(slot);
            if !cell.is_null() {
                *cell = f;
            }
        }
    }
    true
}

/// NVTX's injection entry point: fills the range and mark slots. Returns 1 on success, 0 when
/// recording is off (NVTX then unloads us and its calls stay no-ops).
///
/// # Safety
/// Called by the NVTX loader with its export-table accessor.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn InitializeInjectionNvtx2(
    get_export_table: Option<GetExportTable>,
) -> c_int {
    let Some(get_export_table) = get_export_table else {
        return 0;
    };
    if !crate::sink::active() {
        return 0;
    }
    std::panic::catch_unwind(|| {
        // Safety: NVTX's accessor; the callbacks table it returns lives as long as NVTX.
        let callbacks =
            unsafe { get_export_table(NVTX_ETID_CALLBACKS) } as *const ExportTableCallbacks;
        if callbacks.is_null() {
            return 0;
        }
        // Safety: NVTX's table; struct_size says which fields exist.
        let cb = unsafe { &*callbacks };
        if cb.struct_size < core::mem::size_of::<ExportTableCallbacks>() {
            return 0;
        }
        let Some(get) = cb.get_module_function_table else {
            return 0;
        };
        let core: [(usize, FunctionPointer); 7] = [
            (1, mark_ex as FunctionPointer),
            (2, mark_a as FunctionPointer),
            (3, mark_w as FunctionPointer),
            (8, range_push_ex as FunctionPointer),
            (9, range_push_a as FunctionPointer),
            (10, range_push_w as FunctionPointer),
            (11, range_pop_core as FunctionPointer),
        ];
        let core2: [(usize, FunctionPointer); 5] = [
            (1, domain_mark_ex as FunctionPointer),
            (4, domain_range_push_ex as FunctionPointer),
            (5, domain_range_pop as FunctionPointer),
            (10, domain_register_string_a as FunctionPointer),
            (11, domain_register_string_w as FunctionPointer),
        ];
        // Safety: `get` is NVTX's GetModuleFunctionTable.
        let ok = unsafe { fill(get, NVTX_CB_MODULE_CORE, &core) };
        // Safety: as above.
        unsafe { fill(get, NVTX_CB_MODULE_CORE2, &core2) };
        c_int::from(ok)
    })
    .unwrap_or(0)
}
