//! Offline symbolisation of native stacks: addresses recorded in the traced process become
//! function names and, where debug info exists, file:line, using the module map the preload
//! wrote (path, address range, load bias, build id). A stack's Python frames (recorded by the
//! preload on CPython threads) come first, innermost first, shown as `file.py:LINE function`,
//! so the line of the program that asked for the memory leads the native frames under it.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer as Blaze};
use serde::Serialize;
use vramtrace_format::ModuleInfo;

use crate::trace::{Process, StoredFrame, StoredSymbols};

/// One symbolised frame.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Frame {
    /// The return address as recorded, hex.
    pub addr: String,
    /// File name of the module it lies in (`?` if none).
    pub module: String,
    /// Function name, demangled, if the module's symbols know it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// Source file, if debug info has it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Source line, if debug info has it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
}

/// The `module` of a Python frame.
pub const PYTHON_MODULE: &str = "python";

impl Frame {
    /// True for a frame of the Python interpreter's stack (file, function, line), not a native
    /// return address.
    pub fn is_python(&self) -> bool {
        self.module == PYTHON_MODULE && self.addr.is_empty()
    }
}

impl std::fmt::Display for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_python() {
            let file = self.file.as_deref().unwrap_or("?");
            let base = Path::new(file)
                .file_name()
                .map(|s| s.to_string_lossy())
                .unwrap_or_default();
            write!(f, "{base}")?;
            if let Some(l) = self.line {
                write!(f, ":{l}")?;
            }
            return write!(f, " {}", self.function.as_deref().unwrap_or("?"));
        }
        match &self.function {
            Some(func) => write!(f, "{func}")?,
            None => write!(f, "{} {}", self.module, self.addr)?,
        }
        if let Some(file) = &self.file {
            let base = Path::new(file)
                .file_name()
                .map(|s| s.to_string_lossy())
                .unwrap_or_default();
            match self.line {
                Some(l) => write!(f, " ({base}:{l})")?,
                None => write!(f, " ({base})")?,
            }
        } else if self.function.is_some() {
            write!(f, " [{}]", self.module)?;
        }
        Ok(())
    }
}

/// Symbolises the stacks of one process, caching by address.
pub struct StackSymbolizer<'p> {
    process: &'p Process,
    modules: Vec<ModuleInfo>,
    blaze: Blaze,
    cache: HashMap<u64, Frame>,
    stacks: HashMap<u32, Vec<Frame>>,
    /// Per module path: whether the file on disk is the one the process had loaded.
    usable: HashMap<String, bool>,
}

/// Modules whose frames are the recorder itself, dropped from the top of every stack.
const OWN_MODULE: &str = "libvramtrace_preload.so";

impl<'p> StackSymbolizer<'p> {
    /// A symboliser for `process`, using the modules it recorded.
    pub fn new(process: &'p Process) -> Self {
        let mut modules: Vec<ModuleInfo> = process.modules.clone();
        modules.sort_by_key(|m| m.start);
        modules.dedup_by(|a, b| a.start == b.start && a.end == b.end && a.path == b.path);
        StackSymbolizer {
            process,
            modules,
            blaze: Blaze::new(),
            cache: HashMap::new(),
            stacks: HashMap::new(),
            usable: HashMap::new(),
        }
    }

    fn module_of(&self, addr: u64) -> Option<&ModuleInfo> {
        let i = self.modules.partition_point(|m| m.start <= addr);
        // Later records for the same range win; scan back over overlapping candidates.
        self.modules[..i].iter().rev().find(|m| addr < m.end)
    }

    /// Symbolises one address. `is_return_address` moves it back into the call instruction.
    pub fn frame(&mut self, addr: u64, is_return_address: bool) -> Frame {
        let lookup = if is_return_address {
            addr.saturating_sub(1)
        } else {
            addr
        };
        if let Some(f) = self.cache.get(&lookup) {
            let mut f = f.clone();
            f.addr = format!("{addr:#x}");
            return f;
        }
        let mut frame = Frame {
            addr: format!("{addr:#x}"),
            module: "?".into(),
            function: None,
            file: None,
            line: None,
        };
        if let Some(m) = self.module_of(lookup).cloned() {
            frame.module = Path::new(&m.path)
                .file_name()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or(m.path.clone());
            let virt = lookup.wrapping_sub(m.bias);
            if self.file_matches(&m) {
                let src = Source::Elf(Elf::new(&m.path));
                if let Ok(Symbolized::Sym(sym)) =
                    self.blaze.symbolize_single(&src, Input::VirtOffset(virt))
                {
                    // The innermost inlined function is where the call really is.
                    let (name, info) = match sym.inlined.last() {
                        Some(inl) => (
                            inl.name.to_string(),
                            inl.code_info.as_ref().or(sym.code_info.as_deref()),
                        ),
                        None => (sym.name.to_string(), sym.code_info.as_deref()),
                    };
                    frame.function = Some(name);
                    if let Some(ci) = info {
                        let file = match &ci.dir {
                            Some(d) => d.join(&ci.file).to_string_lossy().into_owned(),
                            None => ci.file.to_string_lossy().into_owned(),
                        };
                        frame.file = Some(file);
                        frame.line = ci.line;
                    }
                }
            } else if let Some(f) = self.process.stored_symbols.get(&module_key(&m), virt) {
                frame.function = Some(f.function.clone());
                frame.file = f.file.clone();
                frame.line = f.line;
            } else if !m.path.is_empty() {
                frame.module.push_str(" (not the traced file)");
            }
        }
        self.cache.insert(lookup, frame.clone());
        frame
    }

    /// Whether the module's file is on this machine and is the one the traced process had
    /// loaded (same GNU build id, when one was recorded): symbols from another build would lie.
    fn file_matches(&mut self, m: &ModuleInfo) -> bool {
        if m.path.is_empty() {
            return false;
        }
        if let Some(&ok) = self.usable.get(&m.path) {
            return ok;
        }
        let ok = Path::new(&m.path).is_file()
            && (m.build_id.is_empty()
                || elf_build_id(Path::new(&m.path)).as_deref() == Some(m.build_id.as_slice()));
        self.usable.insert(m.path.clone(), ok);
        ok
    }

    /// The symbolised frames of a stack id: its Python frames (innermost first), then its native
    /// frames (innermost first, without the recorder's own).
    pub fn stack(&mut self, id: u32) -> Vec<Frame> {
        if id == 0 {
            return Vec::new();
        }
        if let Some(s) = self.stacks.get(&id) {
            return s.clone();
        }
        let addrs = self.process.stacks.get(&id).cloned().unwrap_or_default();
        let mut frames: Vec<Frame> = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| self.frame(*a, i > 0))
            .collect();
        // The recorder's own frames, whether or not this machine holds the very file that ran.
        let own = frames
            .iter()
            .take_while(|f| f.module.split(' ').next() == Some(OWN_MODULE))
            .count();
        frames.drain(..own);
        if let Some(py) = self.process.py_stacks.get(&id) {
            let text = |id: u32| self.process.strings.get(&id).cloned();
            // The PyTorch probe's own callbacks are never the allocating line.
            let python: Vec<Frame> = py
                .iter()
                .filter(|f| {
                    let (file, function) = (text(f.file), text(f.function));
                    !crate::torch_replay::is_probe_frame(
                        file.as_deref().unwrap_or(""),
                        function.as_deref().unwrap_or(""),
                    )
                })
                .map(|f| Frame {
                    addr: String::new(),
                    module: PYTHON_MODULE.into(),
                    function: Some(text(f.function).unwrap_or_else(|| "?".into())),
                    file: text(f.file),
                    line: (f.line > 0).then_some(f.line),
                })
                .collect();
            frames.splice(0..0, python);
        }
        self.stacks.insert(id, frames.clone());
        frames
    }
}

/// How stored symbols name a module: its GNU build id in hex, or its path when it has none.
fn module_key(m: &ModuleInfo) -> String {
    if m.build_id.is_empty() {
        m.path.clone()
    } else {
        m.build_id.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// The native frames of every stack of `process` that this machine's files symbolise (the
/// modules the process had loaded, same build), to keep beside its trace
/// ([`crate::trace::StoredSymbols`]): read elsewhere, the trace still names them.
pub fn store_symbols(process: &Process) -> StoredSymbols {
    let mut s = StackSymbolizer::new(process);
    let mut seen: HashSet<(String, u64)> = HashSet::new();
    let mut frames = Vec::new();
    let mut ids: Vec<u32> = process.stacks.keys().copied().collect();
    ids.sort_unstable();
    for id in ids {
        for (i, &addr) in process.stacks[&id].iter().enumerate() {
            let lookup = if i > 0 { addr.saturating_sub(1) } else { addr };
            let Some(m) = s.module_of(lookup).cloned() else {
                continue;
            };
            // The recorder's own frames are dropped from every stack: nothing to keep.
            if m.path.ends_with(OWN_MODULE) {
                continue;
            }
            let key = (module_key(&m), lookup.wrapping_sub(m.bias));
            if seen.contains(&key) || !s.file_matches(&m) {
                continue;
            }
            let f = s.frame(addr, i > 0);
            seen.insert(key.clone());
            if let Some(function) = f.function {
                frames.push(StoredFrame {
                    module: key.0,
                    offset: key.1,
                    function,
                    file: f.file.map(portable_source_path),
                    line: f.line,
                });
            }
        }
    }
    let mut stored = StoredSymbols {
        frames,
        ..StoredSymbols::default()
    };
    stored.index();
    stored
}

/// A source path as it is worth keeping with a trace: a dependency's source in Cargo's cache
/// (`…/registry/src/<index>/<crate>-<version>/src/x.rs`) from its crate on, the rest as
/// symbolised.
fn portable_source_path(path: String) -> String {
    match path.find("/registry/src/") {
        Some(i) => {
            let rest = &path[i + "/registry/src/".len()..];
            rest.split_once('/')
                .map_or(rest, |(_, after)| after)
                .to_string()
        }
        None => path,
    }
}

/// Writes the stored symbols of every process of `trace` beside its file
/// (`<pid>.symbols.json`), returning how many frames were written.
pub fn write_stored_symbols(trace: &crate::trace::Trace) -> crate::Result<usize> {
    let mut n = 0;
    for p in &trace.processes {
        let stored = store_symbols(p);
        if stored.frames.is_empty() {
            continue;
        }
        let path = StoredSymbols::path_for(&p.path);
        let text = serde_json::to_string(&stored)
            .map_err(|e| crate::Error::BadSymbols(path.clone(), e))?;
        std::fs::write(&path, text).map_err(|e| crate::Error::Io(path.clone(), e))?;
        n += stored.frames.len();
    }
    Ok(n)
}

/// The GNU build id of an ELF file, read as the recorder reads it in memory: from the notes of
/// its `PT_NOTE` segments, the note whose owner is `GNU` and whose type is 3. Looking at the
/// type alone is not enough: PyTorch's libraries carry SystemTap notes (`stapsdt`), whose type
/// is 3 too, in a note section ahead of the build id.
pub fn elf_build_id(path: &Path) -> Option<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    let mut eh = [0u8; 64];
    f.read_exact(&mut eh).ok()?;
    // 64-bit little-endian ELF only: what the recorder runs in.
    if &eh[..4] != b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
        return None;
    }
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let (phoff, phentsize, phnum) = (u64_at(&eh, 32), u16_at(&eh, 54) as usize, u16_at(&eh, 56));
    if phentsize < 56 || phnum > 4096 {
        return None;
    }
    let mut phdrs = vec![0u8; phentsize * phnum as usize];
    f.seek(SeekFrom::Start(phoff)).ok()?;
    f.read_exact(&mut phdrs).ok()?;
    for ph in phdrs.chunks_exact(phentsize) {
        const PT_NOTE: u32 = 4;
        let (offset, size, align) = (u64_at(ph, 8), u64_at(ph, 32), u64_at(ph, 48));
        if u32_at(ph, 0) != PT_NOTE || size > 1 << 20 {
            continue;
        }
        let mut notes = vec![0u8; size as usize];
        f.seek(SeekFrom::Start(offset)).ok()?;
        f.read_exact(&mut notes).ok()?;
        let pad = |n: usize| {
            if align == 8 {
                n.next_multiple_of(8)
            } else {
                n.next_multiple_of(4)
            }
        };
        let mut at = 0usize;
        while at + 12 <= notes.len() {
            let (namesz, descsz, kind) = (
                u32_at(&notes, at) as usize,
                u32_at(&notes, at + 4) as usize,
                u32_at(&notes, at + 8),
            );
            let name_at = at + 12;
            let desc_at = name_at + pad(namesz);
            let next = desc_at + pad(descsz);
            if next > notes.len() {
                break;
            }
            if kind == 3 && &notes[name_at..name_at + namesz] == b"GNU\0" {
                return Some(notes[desc_at..desc_at + descsz].to_vec());
            }
            at = next;
        }
    }
    None
}

/// Frames of the allocation machinery a triager does not look for: the driver binding, the
/// caching allocator, PyTorch's C++ dispatch, Rust's runtime (unwinding guards), a backend's
/// allocation wrapper and the reference workload's tensor factory (`Session::empty`, its
/// `torch.empty`).
const MACHINERY: [&str; 16] = [
    "cudarc::",
    "cuMem",
    "libcuda",
    "c10::",
    "at::",
    "libc10",
    "libtorch",
    "Backend",
    "backend::",
    "::alloc",
    "core::",
    "std::",
    "__rust",
    "::guarded",
    "Session::empty",
    "__libc",
];

fn is_user_frame(f: &str) -> bool {
    !f.contains("(not the traced file)")
        && !f.starts_with("0x")
        && !MACHINERY.iter().any(|m| f.contains(m))
}

/// The first user or library frame of a stack: the innermost Python frame
/// (`file.py:LINE function`), else the innermost symbolised frame past the allocation machinery
/// (the driver binding, the caching allocator, dispatch, runtimes); `None` when neither is there.
pub fn first_user_frame(frames: &[String]) -> Option<String> {
    frames
        .iter()
        .find(|f| f.contains(".py:"))
        .or_else(|| frames.iter().find(|f| is_user_frame(f)))
        .cloned()
}

/// A stack (innermost first) from its first user or library frame: the frames of the
/// allocation machinery before it dropped, and how many were. Python frames count as the
/// program's; a stack with no such frame is kept whole.
pub fn user_stack(frames: &[String]) -> (usize, &[String]) {
    match frames
        .iter()
        .position(|f| f.contains(".py:") || is_user_frame(f))
    {
        Some(i) => (i, &frames[i..]),
        None => (0, frames),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(name: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
        let mut n = Vec::new();
        n.extend_from_slice(&(name.len() as u32).to_le_bytes());
        n.extend_from_slice(&(desc.len() as u32).to_le_bytes());
        n.extend_from_slice(&kind.to_le_bytes());
        n.extend_from_slice(name);
        n.resize(n.len().next_multiple_of(4), 0);
        n.extend_from_slice(desc);
        n.resize(n.len().next_multiple_of(4), 0);
        n
    }

    /// PyTorch's libc10_cuda.so on the H200: a SystemTap note (type 3, owner `stapsdt`) ahead
    /// of the GNU build id. Taking the first type-3 note made every frame of it "not the traced
    /// file" on the very machine that recorded it.
    /// A trace read where its program's library is not (another machine, a rebuilt tree) names
    /// its frames from the symbols stored with it, by build id and offset; with none stored it
    /// says the file is not the traced one.
    #[test]
    fn a_dependency_s_source_is_kept_from_its_crate_on() {
        assert_eq!(
            portable_source_path(
                "/h/.cargo/registry/src/some-index-0123/libc-0.2.1/src/unix/mod.rs".into()
            ),
            "libc-0.2.1/src/unix/mod.rs"
        );
        assert_eq!(
            portable_source_path("/tmp/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu".into()),
            "/tmp/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu"
        );
    }

    #[test]
    fn frames_of_a_missing_module_come_from_the_stored_symbols() {
        use vramtrace_format::{Header, Record, TraceFile};
        let module = ModuleInfo {
            start: 0x7000_0000,
            end: 0x7010_0000,
            bias: 0x7000_0000,
            path: "/gone/libggml-cuda.so.0".into(),
            build_id: vec![0xab, 0xcd],
        };
        let file = TraceFile {
            path: "/nowhere/1.vtr".into(),
            header: Header::default(),
            driver_version: None,
            devices: Vec::new(),
            records: vec![
                Record::Module(module),
                Record::Stack {
                    id: 1,
                    frames: vec![0x7000_1000, 0x7000_2005],
                },
            ],
            problems: Vec::new(),
        };
        let mut p = Process::from_file(file);
        let bare = StackSymbolizer::new(&p).stack(1);
        assert_eq!(bare[1].module, "libggml-cuda.so.0 (not the traced file)");
        assert_eq!(bare[1].function, None);
        let mut stored = StoredSymbols {
            frames: vec![StoredFrame {
                module: "abcd".into(),
                // The return address moved into its call, less the load bias.
                offset: 0x2004,
                function: "ggml_cuda_pool_vmm::alloc(unsigned long, unsigned long*)".into(),
                file: Some("ggml-cuda.cu".into()),
                line: Some(583),
            }],
            ..StoredSymbols::default()
        };
        stored.index();
        p.stored_symbols = std::sync::Arc::new(stored);
        let named = StackSymbolizer::new(&p).stack(1);
        assert_eq!(named[1].module, "libggml-cuda.so.0");
        assert_eq!(
            named[1].function.as_deref(),
            Some("ggml_cuda_pool_vmm::alloc(unsigned long, unsigned long*)")
        );
        assert_eq!(named[1].line, Some(583));
        // The innermost frame (not a return address) has no stored name: still marked.
        assert_eq!(named[0].module, "libggml-cuda.so.0 (not the traced file)");
    }

    #[test]
    fn the_build_id_is_the_gnu_note_not_any_note_of_type_3() {
        let id: Vec<u8> = (1..=20).collect();
        let mut notes = note(b"stapsdt\0", 3, b"BADBADBA");
        notes.extend(note(b"GNU\0", 3, &id));
        let mut elf = vec![0u8; 64];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
        elf[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
        elf[56..58].copy_from_slice(&1u16.to_le_bytes()); // e_phnum
        let mut ph = vec![0u8; 56];
        ph[..4].copy_from_slice(&4u32.to_le_bytes()); // PT_NOTE
        ph[8..16].copy_from_slice(&120u64.to_le_bytes()); // p_offset
        ph[32..40].copy_from_slice(&(notes.len() as u64).to_le_bytes()); // p_filesz
        ph[48..56].copy_from_slice(&4u64.to_le_bytes()); // p_align
        elf.extend(ph);
        elf.extend(notes);
        let path = std::env::temp_dir().join(format!("vt-buildid-{}.so", std::process::id()));
        std::fs::write(&path, &elf).unwrap();
        assert_eq!(elf_build_id(&path), Some(id));
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_plain_binary_reads_as_its_linker_wrote_it() {
        let exe = std::env::current_exe().unwrap();
        let ours = elf_build_id(&exe);
        let theirs = blazesym::helper::read_elf_build_id(&exe)
            .unwrap()
            .map(|b| b.to_vec());
        assert_eq!(ours, theirs);
        assert!(ours.is_some_and(|id| id.len() >= 8));
    }
}
