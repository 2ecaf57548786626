//! Python frames: for an event made on a CPython thread, the file, function and line of each
//! Python function on that thread's stack, read from the interpreter's own structures without
//! importing anything into the program and without the GIL.
//!
//! # How
//! - **Finding the interpreter, lazily.** On the first event we look, with glibc's `dlsym` on
//!   the symbols already loaded, for `PyGILState_GetThisThreadState`, `PyCode_Addr2Line`,
//!   `Py_IsInitialized`, `PyCode_Type`, `PyUnicode_Type` and the version (`Py_Version` since
//!   3.11, the text of `Py_GetVersion()` before). We never load libpython: a program without
//!   one simply has no Python frames (looked for again, rarely, when the loader's object count
//!   changes, for programs that load an interpreter late).
//! - **The thread's state.** `PyGILState_GetThisThreadState()` is a thread-local lookup that
//!   needs no GIL; it is null on threads the interpreter does not know. PyTorch's bindings
//!   release the GIL before the allocator runs (measured on the H200), so at our hook the thread holds no GIL, but its frame chain is its own: no other thread
//!   pushes or pops this thread's frames, and the frames hold strong references to their code
//!   objects, which hold their (immutable) name strings.
//! - **The walk.** One [`Layout`] per supported minor version, chosen by one `match` that ends
//!   in "unsupported": 3.10 walks `PyFrameObject` (`f_back`, `f_code`, `f_lasti` in code
//!   units); 3.11 and 3.12 walk `_PyInterpreterFrame` from `tstate->cframe->current_frame`;
//!   3.13 from `tstate->current_frame`, with `f_executable`, `instr_ptr`. Frames owned by the C
//!   stack (3.12+ entry shims) and frames not yet past their first traceable instruction are
//!   skipped, as CPython's own traceback code does. Each frame's code object must have
//!   `PyCode_Type` as its type and each name `PyUnicode_Type`, or the walk stops there.
//! - **Lines.** `PyCode_Addr2Line(code, byte offset)`: pure computation over the code object's
//!   line table (no allocation, no GIL state, no Python objects created).
//! - **Caps.** At most [`MAX_PY_FRAMES`] frames kept (innermost first), [`MAX_WALK`] visited,
//!   names cut at [`MAX_NAME`] bytes.
//! - **Cost.** Names are interned once per code object per thread (a small per-thread cache keyed
//!   by the code object and its two name pointers, which also remembers the last instruction
//!   offset and its line); each event pays the walk and a `PyCode_Addr2Line` per frame whose
//!   instruction moved. The test `python_frames::cost_per_event` measures it. Tensor events
//!   (`stacks::capture_python`) first walk without describing ([`capture_raw`]) and look the
//!   raw frames' key up in a per-thread memo of stack ids, so a stack seen before costs the walk
//!   alone.
//!
//! A version outside 3.10–3.13 gets one NOTE ("unsupported Python version 3.X") per process and
//! no frames; recording of driver events goes on. `VRAMTRACE_PYTHON=0` turns the walk off.

use core::cell::UnsafeCell;
use core::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};

use vramtrace_format::{Encoder, FRAME_HEADER_LEN, PyFrame, kind};

use crate::real_dlsym::real_dlsym_quiet;
use crate::sink::{File, mono_ns};

/// Most Python frames kept per event (the innermost ones).
pub(crate) const MAX_PY_FRAMES: usize = 48;
/// Most frames visited per walk, skipped ones included: a cycle or a damaged chain ends here.
pub(crate) const MAX_WALK: usize = 512;
/// Longest file or function name kept, in bytes.
pub(crate) const MAX_NAME: usize = 512;
/// A byte offset into a code object's instructions beyond this is not believed.
const MAX_CODE_BYTES: i64 = 1 << 26;

/// How one CPython minor version chains its frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Chain {
    /// 3.10: `PyThreadState.frame`, then `PyFrameObject` linked by `f_back`.
    FrameObjects {
        tstate_frame: u64,
        f_back: u64,
        f_code: u64,
        /// `int f_lasti`, the index of the last instruction in 2-byte code units.
        f_lasti: u64,
    },
    /// 3.11 to 3.13: `_PyInterpreterFrame` linked by `previous`.
    Interpreter {
        /// `PyThreadState.cframe` (3.11, 3.12) or `.current_frame` (3.13).
        tstate_frame: u64,
        /// `_PyCFrame.current_frame`, when the thread state points at a C frame first.
        cframe_current: Option<u64>,
        /// `f_code` (3.11, 3.12) or `f_executable` (3.13).
        code: u64,
        previous: u64,
        /// `prev_instr` (3.11, 3.12) or `instr_ptr` (3.13): a `_Py_CODEUNIT *`.
        instr: u64,
        /// `char owner`.
        owner: u64,
        /// `FRAME_OWNED_BY_GENERATOR`.
        owner_generator: u8,
        /// `FRAME_OWNED_BY_CSTACK` (3.12+), a shim frame with no Python of its own.
        owner_cstack: Option<u8>,
        /// `PyCodeObject.co_code_adaptive`: the first instruction.
        code_adaptive: u64,
        /// `PyCodeObject._co_firsttraceable` (`int`, in code units).
        code_firsttraceable: u64,
    },
}

/// Where one CPython minor version keeps what the walk reads, in bytes. Measured with
/// `offsetof` over the headers each version installs (`cpython/pystate.h`,
/// `internal/pycore_frame.h`, `cpython/code.h`, `cpython/unicodeobject.h`) for 3.10.13,
/// 3.11.7, 3.12.1 and 3.13.0; these structures do not change within a minor version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// (major, minor).
    pub(crate) version: (u8, u8),
    pub(crate) chain: Chain,
    /// `PyCodeObject.co_filename`.
    pub(crate) code_filename: u64,
    /// `PyCodeObject.co_name`.
    pub(crate) code_name: u64,
    /// `sizeof(PyASCIIObject)`: where a compact ASCII string's characters start.
    pub(crate) ascii_size: u64,
    /// `PyCompactUnicodeObject.utf8_length`.
    pub(crate) compact_utf8_length: u64,
    /// `PyCompactUnicodeObject.utf8`.
    pub(crate) compact_utf8: u64,
    /// `sizeof(PyCompactUnicodeObject)`: where a compact non-ASCII string's characters start.
    pub(crate) compact_size: u64,
}

/// `PyObject.ob_type`, the same in every version.
const OB_TYPE: u64 = 8;
/// `PyASCIIObject.length` (`Py_ssize_t`).
const STR_LENGTH: u64 = 16;
/// `PyASCIIObject.state`: bit field with `kind` in bits 2–4, `compact` bit 5, `ascii` bit 6
/// (3.10 to 3.13).
const STR_STATE: u64 = 32;

/// The layout of CPython `major.minor`, or `None`: that version is not supported.
pub(crate) fn layout(major: u8, minor: u8) -> Option<Layout> {
    let interp = |tstate_frame, cframe_current, code, code_adaptive, code_firsttraceable| {
        let (previous, owner, owner_cstack) = match (major, minor) {
            (3, 11) => (48, 69, None),
            _ => (8, 70, Some(3)),
        };
        Chain::Interpreter {
            tstate_frame,
            cframe_current,
            code,
            previous,
            instr: 56,
            owner,
            owner_generator: 1,
            owner_cstack,
            code_adaptive,
            code_firsttraceable,
        }
    };
    let (chain, code_filename, code_name, small_strings) = match (major, minor) {
        (3, 10) => (
            Chain::FrameObjects {
                tstate_frame: 24,
                f_back: 24,
                f_code: 32,
                f_lasti: 96,
            },
            104,
            112,
            false,
        ),
        (3, 11) => (interp(56, Some(8), 32, 184, 168), 112, 120, false),
        (3, 12) => (interp(56, Some(0), 0, 192, 176), 112, 120, true),
        (3, 13) => (interp(72, None, 0, 200, 184), 112, 120, true),
        _ => return None,
    };
    // 3.12 dropped the `wstr` pointer (and `wstr_length`) from the string headers.
    let (ascii_size, compact_size) = if small_strings { (40, 56) } else { (48, 72) };
    Some(Layout {
        version: (major, minor),
        chain,
        code_filename,
        code_name,
        ascii_size,
        compact_utf8_length: ascii_size,
        compact_utf8: ascii_size + 8,
        compact_size,
    })
}

/// Reads the traced program's memory. In the process itself ([`Local`]) or, in tests, a mock.
pub(crate) trait Memory {
    /// Fills `out` from `addr`; false if the range is not readable.
    fn read(&self, addr: u64, out: &mut [u8]) -> bool;

    fn u64(&self, addr: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b).then(|| u64::from_le_bytes(b))
    }
    fn i64(&self, addr: u64) -> Option<i64> {
        self.u64(addr).map(|v| v as i64)
    }
    fn u32(&self, addr: u64) -> Option<u32> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b).then(|| u32::from_le_bytes(b))
    }
    fn i32(&self, addr: u64) -> Option<i32> {
        self.u32(addr).map(|v| v as i32)
    }
    fn u8(&self, addr: u64) -> Option<u8> {
        let mut b = [0u8; 1];
        self.read(addr, &mut b).then_some(b[0])
    }
}

/// This process's own memory, read directly.
pub(crate) struct Local;

/// The lowest and one past the highest address a user-space object can have on x86-64.
#[cfg(not(target_arch = "aarch64"))]
const USER_SPACE: core::ops::Range<u64> = 0x1000..0x0000_8000_0000_0000;
/// The same on aarch64: 48-bit user addresses (a 52-bit kernel hands out higher ones only to
/// an mmap that asks), so stacks and heaps sit near 0xffff_xxxx_xxxx.
#[cfg(target_arch = "aarch64")]
const USER_SPACE: core::ops::Range<u64> = 0x1000..0x0001_0000_0000_0000;

impl Memory for Local {
    fn read(&self, addr: u64, out: &mut [u8]) -> bool {
        let Some(end) = addr.checked_add(out.len() as u64) else {
            return false;
        };
        if !USER_SPACE.contains(&addr) || end > USER_SPACE.end {
            return false;
        }
        // Safety: the addresses come from the interpreter's own structures for the calling
        // thread, whose frame chain cannot change while the thread is inside our hook: the
        // thread state, its frames (alive until the thread returns into them), their code
        // objects (strong references held by the frames) and the code objects' name strings
        // (strong references, immutable). The layout is the one of the running version, and
        // every object's type is checked before its fields are trusted.
        unsafe {
            core::ptr::copy_nonoverlapping(addr as usize as *const u8, out.as_mut_ptr(), out.len())
        };
        true
    }
}

/// One frame the walk found: the code object and the byte offset of its current instruction
/// (negative or absurd offsets stay as they are; [`line_of`] refuses them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RawFrame {
    pub(crate) code: u64,
    pub(crate) offset: i64,
}

/// The innermost `_PyInterpreterFrame` of `tstate` (3.11 and later): the thread state's own
/// pointer, or, through a C frame first (`cframe_current`), that one's; 0 for none.
fn innermost_frame<M: Memory>(
    mem: &M,
    tstate: u64,
    tstate_frame: u64,
    cframe_current: Option<u64>,
) -> u64 {
    let first = mem.u64(tstate + tstate_frame).unwrap_or(0);
    match cframe_current {
        Some(_) if first == 0 => 0,
        Some(off) => mem.u64(first + off).unwrap_or(0),
        None => first,
    }
}

/// Walks the frames of `tstate`, innermost first, calling `visit` for each Python frame until
/// it returns false, the chain ends, or [`MAX_WALK`] frames were seen. A code object whose type
/// is not `code_type` ends the walk in 3.10 and 3.11 (a damaged chain) and is skipped in 3.12+
/// (shim frames of other executables).
pub(crate) fn walk<M: Memory>(
    mem: &M,
    l: &Layout,
    code_type: u64,
    tstate: u64,
    mut visit: impl FnMut(RawFrame) -> bool,
) {
    let is_code = |code: u64| code != 0 && mem.u64(code + OB_TYPE) == Some(code_type);
    match l.chain {
        Chain::FrameObjects {
            tstate_frame,
            f_back,
            f_code,
            f_lasti,
        } => {
            let mut f = mem.u64(tstate + tstate_frame).unwrap_or(0);
            for _ in 0..MAX_WALK {
                if f == 0 {
                    return;
                }
                let Some(code) = mem.u64(f + f_code).filter(|&c| is_code(c)) else {
                    return;
                };
                let lasti = mem.i32(f + f_lasti).unwrap_or(-1) as i64;
                if !visit(RawFrame {
                    code,
                    offset: lasti * 2,
                }) {
                    return;
                }
                f = mem.u64(f + f_back).unwrap_or(0);
            }
        }
        Chain::Interpreter {
            tstate_frame,
            cframe_current,
            code: code_at,
            previous,
            instr,
            owner,
            owner_generator,
            owner_cstack,
            code_adaptive,
            code_firsttraceable,
        } => {
            let mut f = innermost_frame(mem, tstate, tstate_frame, cframe_current);
            for _ in 0..MAX_WALK {
                if f == 0 {
                    return;
                }
                let next = mem.u64(f + previous).unwrap_or(0);
                let who = mem.u8(f + owner).unwrap_or(u8::MAX);
                if owner_cstack == Some(who) {
                    f = next;
                    continue;
                }
                let code = mem.u64(f + code_at).unwrap_or(0);
                if !is_code(code) {
                    if owner_cstack.is_none() {
                        return;
                    }
                    f = next;
                    continue;
                }
                let at = mem.u64(f + instr).unwrap_or(0);
                let offset = at.wrapping_sub(code + code_adaptive) as i64;
                let first_traceable =
                    mem.i32(code + code_firsttraceable).unwrap_or(0).max(0) as i64 * 2;
                // A frame still in its prologue (`_PyFrame_IsIncomplete`): not a Python line yet.
                let incomplete = who != owner_generator && offset < first_traceable;
                if !incomplete && !visit(RawFrame { code, offset }) {
                    return;
                }
                f = next;
            }
        }
    }
}

/// The text of a `str` object (compact ASCII, or compact with cached UTF-8, or compact
/// Latin-1 / UCS-2 / UCS-4 encoded here), cut to `out`'s length; `None` if it is not a
/// `str` (`str_type`) in a form we read.
pub(crate) fn read_str<'a, M: Memory>(
    mem: &M,
    l: &Layout,
    str_type: u64,
    s: u64,
    out: &'a mut [u8; MAX_NAME],
) -> Option<&'a [u8]> {
    if s == 0 || mem.u64(s + OB_TYPE)? != str_type {
        return None;
    }
    let state = mem.u32(s + STR_STATE)?;
    let (kind, compact, ascii) = ((state >> 2) & 7, state >> 5 & 1, state >> 6 & 1);
    if compact == 0 {
        return None;
    }
    let length = mem.i64(s + STR_LENGTH)?;
    if length < 0 {
        return None;
    }
    if ascii == 1 {
        let n = (length as usize).min(MAX_NAME);
        return mem
            .read(s + l.ascii_size, &mut out[..n])
            .then_some(&out[..n]);
    }
    let utf8 = mem.u64(s + l.compact_utf8)?;
    if utf8 != 0 {
        let n = (mem.i64(s + l.compact_utf8_length)?.max(0) as usize).min(MAX_NAME);
        mem.read(utf8, &mut out[..n]).then_some(())?;
        // A cut may end inside a character: keep the valid prefix.
        let end = core::str::from_utf8(&out[..n]).map_or_else(|e| e.valid_up_to(), |s| s.len());
        return Some(&out[..end]);
    }
    let width = match kind {
        1 | 2 | 4 => kind as u64,
        _ => return None,
    };
    let data = s + l.compact_size;
    let mut n = 0;
    for i in 0..(length as u64).min(MAX_NAME as u64) {
        let c = match width {
            1 => mem.u8(data + i)? as u32,
            2 => {
                let mut b = [0u8; 2];
                mem.read(data + 2 * i, &mut b).then_some(())?;
                u16::from_le_bytes(b) as u32
            }
            _ => mem.u32(data + 4 * i)?,
        };
        let ch = char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER);
        if n + ch.len_utf8() > MAX_NAME {
            break;
        }
        n += ch.encode_utf8(&mut out[n..]).len();
    }
    Some(&out[..n])
}

// ---- the interpreter in this process ------------------------------------------------------

type FnGetTstate = unsafe extern "C" fn() -> *mut c_void;
type FnAddr2Line = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
type FnIsInitialized = unsafe extern "C" fn() -> c_int;
type FnGetVersion = unsafe extern "C" fn() -> *const c_char;

const UNKNOWN: u8 = 0;
const READY: u8 = 1;
const ABSENT: u8 = 2;
const UNSUPPORTED: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
/// The loader's count of objects added when the interpreter was last looked for.
static LOOKED_AT: AtomicU64 = AtomicU64::new(u64::MAX);
static GET_TSTATE: AtomicUsize = AtomicUsize::new(0);
static ADDR2LINE: AtomicUsize = AtomicUsize::new(0);
static IS_INITIALIZED: AtomicUsize = AtomicUsize::new(0);
static CODE_TYPE: AtomicU64 = AtomicU64::new(0);
static STR_TYPE: AtomicU64 = AtomicU64::new(0);
/// (major << 8) | minor of the interpreter found.
static VERSION: AtomicU64 = AtomicU64::new(0);

fn sym(name: &CStr) -> usize {
    real_dlsym_quiet(libc::RTLD_DEFAULT, name.as_ptr()) as usize
}

/// The running interpreter's (major, minor), from `Py_Version` or `Py_GetVersion()`.
fn running_version() -> Option<(u8, u8)> {
    let v = sym(c"Py_Version");
    if v != 0 {
        // Safety: `Py_Version` is a `const unsigned long` holding PY_VERSION_HEX.
        let hex = unsafe { (v as *const u64).read() };
        return Some(((hex >> 24) as u8, (hex >> 16) as u8));
    }
    let f = sym(c"Py_GetVersion");
    if f == 0 {
        return None;
    }
    // Safety: `Py_GetVersion` takes nothing and returns a static NUL-terminated string such as
    // "3.10.13 (main, ...)"; it needs no GIL.
    let text = unsafe { CStr::from_ptr(core::mem::transmute::<usize, FnGetVersion>(f)()) };
    parse_version(text.to_bytes())
}

/// "3.10.13 (main, ...)" → (3, 10).
pub(crate) fn parse_version(text: &[u8]) -> Option<(u8, u8)> {
    let mut parts = text
        .split(|&b| b == b'.' || b == b' ')
        .map(|p| core::str::from_utf8(p).ok()?.parse::<u8>().ok());
    Some((parts.next()??, parts.next()??))
}

/// The interpreter's layout, looking for it when not yet known (and again after the loader
/// added objects, if it was absent). Writes the "unsupported" NOTE once.
fn resolve(file: File) -> Option<Layout> {
    match STATE.load(Ordering::Acquire) {
        READY => {
            let v = VERSION.load(Ordering::Relaxed);
            return layout((v >> 8) as u8, v as u8);
        }
        UNSUPPORTED => return None,
        ABSENT => {
            let adds = crate::modules::generation().0;
            if LOOKED_AT.load(Ordering::Relaxed) == adds {
                return None;
            }
        }
        _ => {}
    }
    LOOKED_AT.store(crate::modules::generation().0, Ordering::Relaxed);
    let (tstate, addr2line, init) = (
        sym(c"PyGILState_GetThisThreadState"),
        sym(c"PyCode_Addr2Line"),
        sym(c"Py_IsInitialized"),
    );
    let (code_type, str_type) = (sym(c"PyCode_Type"), sym(c"PyUnicode_Type"));
    let found = [tstate, addr2line, init, code_type, str_type]
        .iter()
        .all(|&p| p != 0);
    let Some((major, minor)) = running_version().filter(|_| found) else {
        STATE.store(ABSENT, Ordering::Release);
        return None;
    };
    let Some(l) = layout(major, minor) else {
        if STATE.swap(UNSUPPORTED, Ordering::AcqRel) != UNSUPPORTED {
            let mut text = [0u8; 96];
            let n = unsupported_note(major, minor, &mut text);
            note(file, &text[..n]);
        }
        return None;
    };
    GET_TSTATE.store(tstate, Ordering::Relaxed);
    ADDR2LINE.store(addr2line, Ordering::Relaxed);
    IS_INITIALIZED.store(init, Ordering::Relaxed);
    CODE_TYPE.store(code_type as u64, Ordering::Relaxed);
    STR_TYPE.store(str_type as u64, Ordering::Relaxed);
    VERSION.store(((major as u64) << 8) | minor as u64, Ordering::Relaxed);
    STATE.store(READY, Ordering::Release);
    Some(l)
}

/// "unsupported Python version 3.14: no Python frames" into `out`; returns its length.
fn unsupported_note(major: u8, minor: u8, out: &mut [u8; 96]) -> usize {
    let mut n = 0;
    let mut put = |b: &[u8]| {
        out[n..n + b.len()].copy_from_slice(b);
        n += b.len();
    };
    put(b"unsupported Python version ");
    let mut num = [0u8; 3];
    for v in [major, minor] {
        let mut k = 0;
        let mut x = v;
        loop {
            num[2 - k] = b'0' + x % 10;
            k += 1;
            x /= 10;
            if x == 0 {
                break;
            }
        }
        put(&num[3 - k..]);
        if v == major {
            put(b".");
        }
    }
    put(b": no Python frames (3.10 to 3.13 are read)");
    n
}

fn note(file: File, text: &[u8]) {
    let mut buf = [0u8; FRAME_HEADER_LEN + 8 + 128];
    let mut e = Encoder::new(&mut buf);
    e.u64(mono_ns()).bytes(&text[..text.len().min(128)]);
    file.write(e.finish(kind::NOTE));
}

/// The Python frames of one event, innermost first.
pub(crate) struct PyFrames {
    pub(crate) frames: [PyFrame; MAX_PY_FRAMES],
    pub(crate) len: usize,
}

impl PyFrames {
    pub(crate) const fn new() -> PyFrames {
        PyFrames {
            frames: [PyFrame {
                file: 0,
                function: 0,
                line: 0,
            }; MAX_PY_FRAMES],
            len: 0,
        }
    }

    pub(crate) fn as_slice(&self) -> &[PyFrame] {
        &self.frames[..self.len]
    }

    /// Appends a frame; false once full.
    fn push(&mut self, f: PyFrame) -> bool {
        if self.len < MAX_PY_FRAMES {
            self.frames[self.len] = f;
            self.len += 1;
        }
        self.len < MAX_PY_FRAMES
    }
}

/// A code object's interned names, cached per thread.
#[derive(Clone, Copy)]
struct Named {
    code: u64,
    filename: u64,
    name: u64,
    generation: u32,
    file: u32,
    function: u32,
    /// The last byte offset looked up in this code object, and its line (0: none yet).
    offset: i64,
    line: u32,
}

const CACHE: usize = 256;

struct NameCache(UnsafeCell<[Named; CACHE]>);

thread_local! {
    // `const` initialisation and no destructor: no allocation, no TLS destructor.
    static NAMES: NameCache = const {
        NameCache(UnsafeCell::new(
            [Named {
                code: 0,
                filename: 0,
                name: 0,
                generation: 0,
                file: 0,
                function: 0,
                offset: 0,
                line: 0,
            }; CACHE],
        ))
    };
}

/// The interned (file, function) ids and the line of `frame`, from this thread's cache (one
/// entry per code object, remembering its last line) or read, interned and looked up.
fn describe<M: Memory>(
    file: File,
    mem: &M,
    l: &Layout,
    str_type: u64,
    addr2line: FnAddr2Line,
    frame: RawFrame,
) -> Option<PyFrame> {
    let code = frame.code;
    let filename = mem.u64(code + l.code_filename)?;
    let name = mem.u64(code + l.code_name)?;
    let generation = crate::intern::generation();
    let slot = ((code >> 4) ^ (code >> 12)) as usize % CACHE;
    let cached = NAMES
        .try_with(|c| {
            // Safety: this thread's own cache; no reference to it outlives this closure.
            let e = unsafe { &mut (*c.0.get())[slot] };
            if e.code != code
                || e.filename != filename
                || e.name != name
                || e.generation != generation
            {
                return None;
            }
            if e.offset != frame.offset || e.line == 0 {
                e.offset = frame.offset;
                e.line = line_of(addr2line, frame);
            }
            Some(PyFrame {
                file: e.file,
                function: e.function,
                line: e.line,
            })
        })
        .ok()
        .flatten();
    if cached.is_some() {
        return cached;
    }
    let mut buf = [0u8; MAX_NAME];
    let file_id = crate::intern::intern(file, read_str(mem, l, str_type, filename, &mut buf)?);
    let function = crate::intern::intern(file, read_str(mem, l, str_type, name, &mut buf)?);
    let line = line_of(addr2line, frame);
    let _ = NAMES.try_with(|c| {
        // Safety: as above.
        unsafe {
            (*c.0.get())[slot] = Named {
                code,
                filename,
                name,
                generation,
                file: file_id,
                function,
                offset: frame.offset,
                line,
            }
        }
    });
    Some(PyFrame {
        file: file_id,
        function,
        line,
    })
}

/// The line of `frame` from `PyCode_Addr2Line`, 0 when the offset is not believable.
fn line_of(addr2line: FnAddr2Line, frame: RawFrame) -> u32 {
    if !(0..MAX_CODE_BYTES).contains(&frame.offset) {
        return 0;
    }
    // Safety: `PyCode_Addr2Line` of the running interpreter, on a code object the calling
    // thread's frame holds a strong reference to (so it stays alive), with an offset inside its
    // instructions. It only decodes the immutable line table (`co_linetable`; in 3.11 a line
    // array a tracer may have cached): it allocates nothing, creates no Python object and
    // needs no GIL, so it is safe while this thread sits in our hook without the GIL.
    let line = unsafe { addr2line(frame.code as usize as *mut c_void, frame.offset as c_int) };
    line.max(0) as u32
}

/// What describing the calling thread's frames needs: the running interpreter's layout and
/// functions, and the thread's state.
pub(crate) struct Ctx {
    l: Layout,
    code_type: u64,
    str_type: u64,
    addr2line: FnAddr2Line,
    tstate: u64,
}

/// The calling thread's [`Ctx`] (`None` when the process has no supported interpreter, the
/// thread is not a Python thread, or `VRAMTRACE_PYTHON=0`).
fn context(file: File) -> Option<Ctx> {
    if !crate::config::python() {
        return None;
    }
    let l = resolve(file)?;
    let (get_tstate, addr2line, is_init) = (
        GET_TSTATE.load(Ordering::Relaxed),
        ADDR2LINE.load(Ordering::Relaxed),
        IS_INITIALIZED.load(Ordering::Relaxed),
    );
    // Safety: the three were found by these names in the interpreter whose version chose `l`;
    // their signatures are CPython's: `int Py_IsInitialized(void)`,
    // `PyThreadState *PyGILState_GetThisThreadState(void)` and
    // `int PyCode_Addr2Line(PyCodeObject *, int)`.
    let (get_tstate, addr2line, is_init) = unsafe {
        (
            core::mem::transmute::<usize, FnGetTstate>(get_tstate),
            core::mem::transmute::<usize, FnAddr2Line>(addr2line),
            core::mem::transmute::<usize, FnIsInitialized>(is_init),
        )
    };
    // Safety: both read process-wide or thread-local state without the GIL (the runtime's
    // `initialized` flag; the gilstate thread-local key, null after finalisation or on a thread
    // the interpreter never saw).
    let tstate = unsafe {
        if is_init() == 0 {
            return None;
        }
        get_tstate() as usize as u64
    };
    if tstate == 0 {
        return None;
    }
    Some(Ctx {
        l,
        code_type: CODE_TYPE.load(Ordering::Relaxed),
        str_type: STR_TYPE.load(Ordering::Relaxed),
        addr2line,
        tstate,
    })
}

/// Fills `out` with the calling thread's Python frames (nothing when the process has no
/// supported interpreter, the thread is not a Python thread, or `VRAMTRACE_PYTHON=0`).
pub(crate) fn capture(file: File, out: &mut PyFrames) {
    out.len = 0;
    let mut raw = RawStack::new();
    if let Some(c) = capture_raw(file, &mut raw) {
        describe_raw(file, &c, &raw, out);
    }
}

/// The calling thread's Python frames as the walk finds them, not yet described: each frame's
/// code object and instruction offset, innermost first (at most [`MAX_PY_FRAMES`]).
pub(crate) struct RawStack {
    frames: [RawFrame; MAX_PY_FRAMES],
    len: usize,
}

impl RawStack {
    pub(crate) const fn new() -> RawStack {
        RawStack {
            frames: [RawFrame { code: 0, offset: 0 }; MAX_PY_FRAMES],
            len: 0,
        }
    }
}

/// One step of [`quick_key`]'s hash.
fn mix(h: u64, x: u64) -> u64 {
    (h.rotate_left(23) ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Walks the calling thread's frames into `out` without describing them; the [`Ctx`] to
/// describe them with, when there is an interpreter to walk.
pub(crate) fn capture_raw(file: File, out: &mut RawStack) -> Option<Ctx> {
    out.len = 0;
    let c = context(file)?;
    walk(&Local, &c.l, c.code_type, c.tstate, |frame| {
        out.frames[out.len] = frame;
        out.len += 1;
        out.len < MAX_PY_FRAMES
    });
    Some(c)
}

/// Frames [`quick_key`] reads beyond [`MAX_PY_FRAMES`]: [`walk`] skips a frame still in its
/// prologue and a shim frame, so the frames it keeps may reach a little deeper.
const QUICK_SLACK: usize = 8;

/// The frames [`quick_key`] last walked on a thread, for the next walk to prefetch.
struct LastWalk {
    frames: [u64; MAX_PY_FRAMES + QUICK_SLACK],
    len: usize,
}

thread_local! {
    // `const` initialisation and no destructor: usable from any thread at any time.
    static LAST_WALK: UnsafeCell<LastWalk> = const {
        UnsafeCell::new(LastWalk { frames: [0; MAX_PY_FRAMES + QUICK_SLACK], len: 0 })
    };
}

/// Asks for the cache line holding `addr`; never faults, whatever `addr` is.
#[inline(always)]
fn prefetch(addr: u64) {
    #[cfg(target_arch = "x86_64")]
    // Safety: a prefetch is a hint: it reads nothing into the program and never faults.
    unsafe {
        core::arch::x86_64::_mm_prefetch(
            addr as usize as *const i8,
            core::arch::x86_64::_MM_HINT_T0,
        )
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// A key for the calling thread's Python stack, read from its frames alone: each frame's code
/// object pointer and instruction pointer, innermost first, for the first [`MAX_PY_FRAMES`] +
/// [`QUICK_SLACK`] frames; 0 when the thread has none (or `VRAMTRACE_PYTHON=0`). Two calls
/// from the same lines give the same key, so a caller can keep what it made of a stack under
/// it and skip the walk that checks each code object and reads its names: on the H200's
/// decode that walk cost about 1 µs per tensor, most of it loads from some 40 code objects out
/// of the cache (docs/performance.md, "Where the decode cost grows"). The frames are the
/// calling thread's own (alive while it is in our hook) and only their fields are read, in the
/// layout [`resolve`] chose. Of the code objects only the innermost is read (its type, then its
/// file and function name objects, mixed in): a code object that died and was replaced at its
/// address by another has other name objects, so the stack of a line that allocates is never
/// taken for another's. What the key cannot tell apart is a code object further out replaced
/// that way while its callee runs at the same offset as before, under the same callers.
pub(crate) fn quick_key(file: File) -> u64 {
    let Some(c) = context(file) else {
        return 0;
    };
    let mem = Local;
    // Two hashes, one of the code objects and one of the positions: a frame's step of one
    // (a multiply) does not wait for the other's, so the chain of steps that wait on each
    // other is half as long as with both in one (docs/performance.md, "On the H200's serve").
    let (mut h_code, mut h_pos) = (0x243f_6a88_85a3_08d3u64, 0x1319_8a2e_0370_7344u64);
    let mut n = 0usize;
    let mut innermost = 0u64;
    // Where each chain keeps the next frame, the code object and the position in it (3.10's
    // `f_lasti` is an `int`, later versions' instruction pointer a pointer).
    let (mut f, next_at, code_at, (pos_at, pos_bytes)) = match c.l.chain {
        Chain::FrameObjects {
            tstate_frame,
            f_back,
            f_code,
            f_lasti,
        } => (
            mem.u64(c.tstate + tstate_frame).unwrap_or(0),
            f_back,
            f_code,
            (f_lasti, 4),
        ),
        Chain::Interpreter {
            tstate_frame,
            cframe_current,
            code,
            previous,
            instr,
            ..
        } => (
            innermost_frame(&mem, c.tstate, tstate_frame, cframe_current),
            previous,
            code,
            (instr, 8),
        ),
    };
    // One check of a frame's address stands for [`Local`]'s check of each of its reads: the
    // frame starts in user space and the furthest field read ends there too.
    let below = USER_SPACE.end - (next_at.max(code_at).max(pos_at) + 8);
    let _ = LAST_WALK.try_with(|w| {
        // Safety: this thread's own array; nothing else refers to it while this runs.
        let w = unsafe { &mut *w.get() };
        // Following the chain is one cache miss after another (each frame's address is read
        // from the one before). This thread's stack is mostly the one it had at its last
        // report, so its frames' lines are asked for all at once first, from the addresses
        // that walk found: a prefetch never faults, whatever is at a stale address now.
        for &f in &w.frames[..w.len] {
            // What is read of a frame (3.11 and later) lies in its first 64 bytes: the lines of
            // its first and its 64th byte (one line when the frame starts one).
            prefetch(f);
            prefetch(f + 63);
        }
        while n < w.frames.len() && USER_SPACE.start <= f && f <= below {
            // Safety: as in [`Local::read`]: the calling thread's own frames, alive while it
            // is in our hook, read at the running version's offsets, within user space.
            let (code, pos, next) = unsafe {
                let at = |off: u64| (f + off) as usize as *const u8;
                (
                    (at(code_at) as *const u64).read_unaligned(),
                    if pos_bytes == 4 {
                        u64::from((at(pos_at) as *const u32).read_unaligned())
                    } else {
                        (at(pos_at) as *const u64).read_unaligned()
                    },
                    (at(next_at) as *const u64).read_unaligned(),
                )
            };
            h_code = mix(h_code, code);
            h_pos = mix(h_pos, pos);
            if n == 0 {
                innermost = code;
            }
            w.frames[n] = f;
            n += 1;
            f = next;
        }
        w.len = n;
    });
    let mut h = mix(h_code, h_pos);
    if n == 0 {
        return 0;
    }
    if innermost != 0 && mem.u64(innermost + OB_TYPE) == Some(c.code_type) {
        h = mix(h, mem.u64(innermost + c.l.code_filename).unwrap_or(0));
        h = mix(h, mem.u64(innermost + c.l.code_name).unwrap_or(0));
    }
    // Never 0: a caller's table keeps 0 for an empty slot.
    mix(h, n as u64) | 1
}

/// Describes the frames of `raw` into `out`, as [`capture`] would have (the walk ends at the
/// first frame that cannot be described).
pub(crate) fn describe_raw(file: File, c: &Ctx, raw: &RawStack, out: &mut PyFrames) {
    out.len = 0;
    let mem = Local;
    for &frame in &raw.frames[..raw.len] {
        match describe(file, &mem, &c.l, c.str_type, c.addr2line, frame) {
            Some(f) => {
                if !out.push(f) {
                    return;
                }
            }
            None => return,
        }
    }
}

#[cfg(test)]
mod tests;
