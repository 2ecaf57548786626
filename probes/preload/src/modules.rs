//! The loaded modules, from `dl_iterate_phdr`: what the unwinder needs (code range, load bias,
//! the in-memory `.eh_frame_hdr` / `.eh_frame`) and what the trace's MODULE records say (path,
//! range, bias, GNU build id).
//!
//! Everything is read from the mapped program headers and segments; no file is opened.

use core::ffi::{CStr, c_int, c_void};
use core::ops::Range;

use vramtrace_format::{Encoder, FRAME_HEADER_LEN, kind};

use crate::sink::File;

/// A slice of the process's own mapped memory (a module segment), handed to the unwinder.
pub(crate) struct Mapped {
    ptr: *const u8,
    len: usize,
}

// Safety: a read-only view of a mapped module segment, valid while the module stays loaded;
// modules that disappear are removed from the unwinder before it runs again.
unsafe impl Send for Mapped {}

impl Default for Mapped {
    fn default() -> Self {
        Mapped {
            ptr: core::ptr::NonNull::<u8>::dangling().as_ptr(),
            len: 0,
        }
    }
}

impl core::ops::Deref for Mapped {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // Safety: `ptr..ptr+len` lies inside a PT_LOAD segment of a loaded module.
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// One loaded module.
pub(crate) struct LoadedModule {
    /// Path as the loader has it (the executable's real path for the main program).
    pub(crate) path: String,
    /// The load bias (`dlpi_addr`): runtime address minus the address in the file.
    pub(crate) bias: u64,
    /// The executable segments' address range (runtime addresses).
    pub(crate) code: Range<u64>,
    /// GNU build id, empty if none.
    pub(crate) build_id: Vec<u8>,
    /// The in-memory `.eh_frame_hdr`, `.eh_frame` (up to its segment's end) and code.
    pub(crate) eh_frame_hdr: Option<Range<u64>>,
    pub(crate) eh_frame: Option<Range<u64>>,
}

impl LoadedModule {
    /// The unwinder's view of it: ELF modules state their addresses relative to 0, so SVMAs
    /// are runtime addresses minus the bias.
    pub(crate) fn unwind_module(&self) -> framehop::Module<Mapped> {
        let svma = |r: &Range<u64>| r.start - self.bias..r.end - self.bias;
        let mapped = |r: &Range<u64>| Mapped {
            ptr: r.start as usize as *const u8,
            len: (r.end - r.start) as usize,
        };
        let info = framehop::ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: Some(svma(&self.code)),
            text: Some(mapped(&self.code)),
            eh_frame_svma: self.eh_frame.as_ref().map(svma),
            eh_frame: self.eh_frame.as_ref().map(mapped),
            eh_frame_hdr_svma: self.eh_frame_hdr.as_ref().map(svma),
            eh_frame_hdr: self.eh_frame_hdr.as_ref().map(mapped),
            ..Default::default()
        };
        framehop::Module::new(self.path.clone(), self.code.clone(), self.bias, info)
    }

    /// Writes this module's MODULE record.
    pub(crate) fn write_record(&self, file: File) {
        let mut buf = [0u8; FRAME_HEADER_LEN + 24 + 2 + 4096 + 2 + 64];
        let mut e = Encoder::new(&mut buf);
        let id = &self.build_id[..self.build_id.len().min(64)];
        e.u64(self.code.start).u64(self.code.end).u64(self.bias);
        // Clamp the path so the build id always fits after it.
        let mut end = self.path.len().min(4096);
        while !self.path.is_char_boundary(end) {
            end -= 1;
        }
        e.str(&self.path[..end]);
        e.u16(id.len() as u16).bytes(id);
        file.write(e.finish(kind::MODULE));
    }
}

/// The loader's counters of objects added and removed so far: when they move, rescan.
pub(crate) fn generation() -> (u64, u64) {
    let mut counts = (0u64, 0u64);
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // Safety: the loader passes a valid info struct and our `counts` pointer.
        unsafe {
            let counts = &mut *(data as *mut (u64, u64));
            *counts = ((*info).dlpi_adds, (*info).dlpi_subs);
        }
        1 // stop after the first object
    }
    // Safety: the callback only reads the info struct it is given.
    unsafe { libc::dl_iterate_phdr(Some(first), &mut counts as *mut _ as *mut c_void) };
    counts
}

/// Every module now loaded.
pub(crate) fn scan() -> Vec<LoadedModule> {
    let mut out: Vec<LoadedModule> = Vec::with_capacity(64);
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // Safety: `data` is our Vec; the loader passes a valid info struct.
        let (out, info) = unsafe { (&mut *(data as *mut Vec<LoadedModule>), &*info) };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // Safety: the info struct's program headers, as the loader gives them.
            if let Some(m) = unsafe { describe(info) } {
                out.push(m);
            }
        }));
        c_int::from(r.is_err())
    }
    // Safety: the callback only reads what it is given and pushes to our Vec.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut out as *mut _ as *mut c_void) };
    out
}

/// Reads one object's program headers.
///
/// # Safety
/// `info` is a `dl_phdr_info` passed by `dl_iterate_phdr`, valid during the callback.
unsafe fn describe(info: &libc::dl_phdr_info) -> Option<LoadedModule> {
    let bias = info.dlpi_addr;
    // Safety: dlpi_phdr points at dlpi_phnum program headers.
    let phdrs = unsafe { core::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let mut code: Option<Range<u64>> = None;
    let mut eh_frame_hdr = None;
    let mut build_id = Vec::new();
    for ph in phdrs {
        let start = bias.wrapping_add(ph.p_vaddr);
        let range = start..start + ph.p_memsz;
        match ph.p_type {
            libc::PT_LOAD if ph.p_flags & libc::PF_X != 0 => {
                code = Some(match code {
                    None => range,
                    Some(c) => c.start.min(range.start)..c.end.max(range.end),
                });
            }
            libc::PT_GNU_EH_FRAME => eh_frame_hdr = Some(range),
            // Safety: a PT_NOTE segment of a loaded module is mapped.
            libc::PT_NOTE if build_id.is_empty() => build_id = unsafe { gnu_build_id(range) },
            _ => {}
        }
    }
    let code = code?;
    // .eh_frame: where .eh_frame_hdr points, up to the end of the PT_LOAD segment holding it.
    let eh_frame = eh_frame_hdr.as_ref().and_then(|hdr| {
        // Safety: the header lies in a mapped segment.
        let start = unsafe { eh_frame_address(hdr.start) }?;
        let end = phdrs
            .iter()
            .filter(|ph| ph.p_type == libc::PT_LOAD)
            .map(|ph| bias.wrapping_add(ph.p_vaddr)..bias.wrapping_add(ph.p_vaddr + ph.p_memsz))
            .find(|seg| seg.contains(&start))?
            .end;
        Some(start..end)
    });
    let path = if info.dlpi_name.is_null() {
        String::new()
    } else {
        // Safety: a NUL-terminated name from the loader.
        unsafe { CStr::from_ptr(info.dlpi_name) }
            .to_string_lossy()
            .into_owned()
    };
    let path = if path.is_empty() {
        std::fs::read_link("/proc/self/exe")
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default()
    } else {
        path
    };
    Some(LoadedModule {
        path,
        bias,
        code,
        build_id,
        eh_frame_hdr,
        eh_frame,
    })
}

/// The address of `.eh_frame`, from the `eh_frame_ptr` field of `.eh_frame_hdr`.
///
/// # Safety
/// `hdr` is the address of a mapped `.eh_frame_hdr`.
unsafe fn eh_frame_address(hdr: u64) -> Option<u64> {
    let p = hdr as usize as *const u8;
    // Safety: the header's first 4 bytes and the encoded pointer after them are mapped.
    unsafe {
        if *p != 1 {
            return None; // unknown version
        }
        let enc = *p.add(1);
        let field = p.add(4);
        let (value, _) = match enc & 0x0f {
            0x03 => ((field as *const u32).read_unaligned() as u64, 4), // udata4
            0x0b => ((field as *const i32).read_unaligned() as i64 as u64, 4), // sdata4
            0x04 | 0x0c => ((field as *const u64).read_unaligned(), 8), // udata8, sdata8
            _ => return None,
        };
        match enc & 0x70 {
            0x00 => Some(value),                              // absptr
            0x10 => Some((field as u64).wrapping_add(value)), // pcrel
            0x30 => Some(hdr.wrapping_add(value)),            // datarel (to the header)
            _ => None,
        }
    }
}

/// The GNU build id in a PT_NOTE segment, if it has one.
///
/// # Safety
/// `notes` is a mapped PT_NOTE segment.
unsafe fn gnu_build_id(notes: Range<u64>) -> Vec<u8> {
    let mut at = notes.start;
    let align4 = |n: u64| (n + 3) & !3;
    while at + 12 <= notes.end {
        let p = at as usize as *const u32;
        // Safety: inside the segment (checked above).
        let (namesz, descsz, kind) = unsafe {
            (
                p.read_unaligned() as u64,
                p.add(1).read_unaligned() as u64,
                p.add(2).read_unaligned(),
            )
        };
        let name_at = at + 12;
        let desc_at = name_at + align4(namesz);
        let next = desc_at + align4(descsz);
        if next > notes.end {
            break;
        }
        // Safety: name and desc lie inside the segment (checked above).
        let name =
            unsafe { core::slice::from_raw_parts(name_at as usize as *const u8, namesz as usize) };
        if kind == 3 && name == b"GNU\0" {
            // Safety: as above.
            return unsafe {
                core::slice::from_raw_parts(desc_at as usize as *const u8, descsz as usize)
            }
            .to_vec();
        }
        at = next;
    }
    Vec::new()
}
