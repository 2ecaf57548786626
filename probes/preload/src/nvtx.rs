//! NVTX v3 injection: with `NVTX_INJECTION64_PATH` naming this library, the NVTX loader
//! compiled into the program (PyTorch, the `nvtx` crate, anything built on NVIDIA's header)
//! `dlopen`s it on the first NVTX call and calls [`InitializeInjectionNvtx2`]. We then fill the
//! slots of the calls that open and close ranges and make marks:
//!
//! | module | slot | call |
//! |---|---|---|
//! | CORE (1) | 1, 2 | `nvtxMarkEx`, `nvtxMarkA` |
//! | CORE (1) | 8, 9, 11 | `nvtxRangePushEx`, `nvtxRangePushA`, `nvtxRangePop` |
//! | CORE2 (5) | 1 | `nvtxDomainMarkEx` |
//! | CORE2 (5) | 4, 5 | `nvtxDomainRangePushEx`, `nvtxDomainRangePop` |
//!
//! Messages are taken when they are ASCII; other message kinds (wide, registered strings) open
//! a range named `?` so that pushes and pops stay balanced. Domains share the thread's stack.
//! The ids and layouts come from the NVTX v3 ABI documentation; no NVIDIA header is included.

use core::ffi::{c_char, c_int, c_uint, c_void};

use crate::labels::{c_str, mark, range_pop, range_push};

const NVTX_ETID_CALLBACKS: u32 = 1;
const NVTX_CB_MODULE_CORE: c_int = 1;
const NVTX_CB_MODULE_CORE2: c_int = 5;
const NVTX_MESSAGE_TYPE_ASCII: i32 = 1;

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

/// The ASCII message of an attributes struct, if it has one.
///
/// # Safety
/// `attr` is null or points at an `nvtxEventAttributes_t` of the size it states.
unsafe fn message<'a>(attr: *const EventAttributes) -> &'a [u8] {
    if attr.is_null() {
        return b"?";
    }
    // Safety: the caller's struct; `size` says how much of it exists.
    let a = unsafe { &*attr };
    if (a.size as usize) < core::mem::size_of::<EventAttributes>()
        || a.message_type != NVTX_MESSAGE_TYPE_ASCII
    {
        return b"?";
    }
    // Safety: an ASCII message is a NUL-terminated string (or null).
    unsafe { c_str(a.message) }.unwrap_or(b"?")
}

unsafe extern "C" fn mark_a(text: *const c_char) {
    // Safety: NVTX passes a NUL-terminated string or null.
    mark(unsafe { c_str(text) }.unwrap_or(b"?"));
}

unsafe extern "C" fn mark_ex(attr: *const EventAttributes) {
    // Safety: NVTX passes its attributes struct.
    mark(unsafe { message(attr) });
}

unsafe extern "C" fn range_push_a(text: *const c_char) -> c_int {
    // Safety: NVTX passes a NUL-terminated string or null.
    range_push(unsafe { c_str(text) }.unwrap_or(b"?"))
}

unsafe extern "C" fn range_push_ex(attr: *const EventAttributes) -> c_int {
    // Safety: NVTX passes its attributes struct.
    range_push(unsafe { message(attr) })
}

extern "C" fn range_pop_core() -> c_int {
    range_pop()
}

unsafe extern "C" fn domain_mark_ex(_domain: *mut c_void, attr: *const EventAttributes) {
    // Safety: NVTX passes its attributes struct.
    mark(unsafe { message(attr) });
}

unsafe extern "C" fn domain_range_push_ex(
    _domain: *mut c_void,
    attr: *const EventAttributes,
) -> c_int {
    // Safety: NVTX passes its attributes struct.
    range_push(unsafe { message(attr) })
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
    if !crate::recorder::active() {
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
        let core: [(usize, FunctionPointer); 5] = [
            (1, mark_ex as FunctionPointer),
            (2, mark_a as FunctionPointer),
            (8, range_push_ex as FunctionPointer),
            (9, range_push_a as FunctionPointer),
            (11, range_pop_core as FunctionPointer),
        ];
        let core2: [(usize, FunctionPointer); 3] = [
            (1, domain_mark_ex as FunctionPointer),
            (4, domain_range_push_ex as FunctionPointer),
            (5, domain_range_pop as FunctionPointer),
        ];
        // Safety: `get` is NVTX's GetModuleFunctionTable.
        let ok = unsafe { fill(get, NVTX_CB_MODULE_CORE, &core) };
        // Safety: as above.
        unsafe { fill(get, NVTX_CB_MODULE_CORE2, &core2) };
        c_int::from(ok)
    })
    .unwrap_or(0)
}
