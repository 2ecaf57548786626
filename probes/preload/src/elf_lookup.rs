//! A symbol's default definition in one loaded object, read from its dynamic symbol table.
//!
//! Why this exists: the preload exports both `dlsym` and `dlvsym` (`src/dlsym.rs`), so it can
//! call neither to find glibc's. A call from the preload to either binds to its own export (a
//! shared library's references go through the global scope, and a versioned reference such as
//! `dlvsym@GLIBC_2.34` still binds to an earlier unversioned definition), which would loop. So
//! [`crate::real_dlsym`] finds glibc's two functions the way the dynamic linker itself does: it
//! takes the object that defines `dlerror` (glibc's; the preload does not export `dlerror`: on
//! glibc 2.34 and later that is `libc.so.6`, before it `libdl.so.2`, which also holds `dlsym`
//! and `dlvsym`), and looks the names up in that object's `.dynsym` through its GNU hash table
//! (SysV `DT_HASH` if it has none), taking the *default* version (`dlsym@@GLIBC_2.34`, or
//! `@@GLIBC_2.2.5` / `@@GLIBC_2.17` before 2.34), never a hidden compatibility one.
//!
//! ELF64 only (x86-64 and aarch64 are the preload's targets). Nothing here allocates, locks
//! anything but `dl_iterate_phdr`'s own lock, or can panic.

use core::ffi::{CStr, c_int, c_void};

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;

const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;

const STT_FUNC: u8 = 2;
const SHN_UNDEF: u16 = 0;
/// The hidden bit of a `.gnu.version` entry: a non-default (`name@VERSION`) definition.
const VERSYM_HIDDEN: u16 = 0x8000;

/// `Elf64_Dyn`.
#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}

/// `Elf64_Sym`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Sym {
    pub(crate) name: u32,
    pub(crate) info: u8,
    pub(crate) other: u8,
    pub(crate) shndx: u16,
    pub(crate) value: u64,
    pub(crate) size: u64,
}

/// The dynamic symbol table of one loaded object: absolute addresses of its parts.
#[derive(Clone, Copy)]
pub(crate) struct DynSymbols {
    /// The load bias (`dlpi_addr`): a symbol's address is `base + st_value`.
    pub(crate) base: usize,
    pub(crate) strtab: *const u8,
    pub(crate) symtab: *const Sym,
    /// `DT_GNU_HASH`, or null.
    pub(crate) gnu_hash: *const u32,
    /// `DT_HASH`, or null (used only without a GNU hash table).
    pub(crate) sysv_hash: *const u32,
    /// `DT_VERSYM`, or null (then every definition is a default one).
    pub(crate) versym: *const u16,
}

/// The GNU hash of a symbol name (`DT_GNU_HASH`).
pub(crate) fn gnu_hash(name: &[u8]) -> u32 {
    name.iter().fold(5381u32, |h, &c| {
        h.wrapping_mul(33).wrapping_add(u32::from(c))
    })
}

/// The SysV ELF hash of a symbol name (`DT_HASH`).
pub(crate) fn sysv_hash(name: &[u8]) -> u32 {
    let mut h = 0u32;
    for &c in name {
        h = (h << 4).wrapping_add(u32::from(c));
        let g = h & 0xf000_0000;
        if g != 0 {
            h ^= g >> 24;
        }
        h &= !g;
    }
    h
}

impl DynSymbols {
    /// The address of `name`'s default definition as a function in this object, if it has one:
    /// defined (`st_shndx` not `SHN_UNDEF`), `STT_FUNC`, and a version entry that is neither
    /// local (0) nor hidden.
    ///
    /// # Safety
    /// The pointers must describe a well-formed table of a loaded object (or be built by a
    /// test to look like one).
    pub(crate) unsafe fn default_function(&self, name: &CStr) -> Option<usize> {
        let name = name.to_bytes();
        // Safety: the caller's contract.
        unsafe {
            if !self.gnu_hash.is_null() {
                self.find_gnu(name)
            } else if !self.sysv_hash.is_null() {
                self.find_sysv(name)
            } else {
                None
            }
        }
    }

    /// Whether symbol `i` is `name`'s default function definition; its address if so.
    unsafe fn accept(&self, i: u32, name: &[u8]) -> Option<usize> {
        // Safety: `i` came from the object's hash table, so it indexes the symbol table, and
        // st_name indexes the string table (NUL-terminated strings).
        unsafe {
            let sym = *self.symtab.add(i as usize);
            if sym.shndx == SHN_UNDEF || sym.info & 0xf != STT_FUNC {
                return None;
            }
            let s = CStr::from_ptr(self.strtab.add(sym.name as usize).cast());
            if s.to_bytes() != name {
                return None;
            }
            if !self.versym.is_null() {
                let v = *self.versym.add(i as usize);
                if v & VERSYM_HIDDEN != 0 || v == 0 {
                    return None;
                }
            }
            Some(self.base.wrapping_add(sym.value as usize))
        }
    }

    /// Lookup through the GNU hash table: `nbuckets, symoffset, bloom_size, bloom_shift`, then
    /// `bloom_size` 64-bit bloom words (not consulted: they only save time on a miss), the
    /// buckets, and one chain word per symbol from `symoffset` on (the hash with bit 0 marking a
    /// chain's last symbol).
    unsafe fn find_gnu(&self, name: &[u8]) -> Option<usize> {
        let h = gnu_hash(name);
        // Safety: the table's layout as described above, read within its bounds.
        unsafe {
            let t = self.gnu_hash;
            let nbuckets = *t;
            let symoffset = *t.add(1);
            let bloom_size = *t.add(2) as usize;
            if nbuckets == 0 {
                return None;
            }
            let buckets = t.add(4 + 2 * bloom_size);
            let chain = buckets.add(nbuckets as usize);
            let mut i = *buckets.add((h % nbuckets) as usize);
            if i < symoffset {
                return None;
            }
            loop {
                let c = *chain.add((i - symoffset) as usize);
                if (c | 1) == (h | 1)
                    && let Some(p) = self.accept(i, name)
                {
                    return Some(p);
                }
                if c & 1 != 0 {
                    return None;
                }
                i += 1;
            }
        }
    }

    /// Lookup through the SysV hash table: `nbucket, nchain`, the buckets, the chains.
    unsafe fn find_sysv(&self, name: &[u8]) -> Option<usize> {
        let h = sysv_hash(name);
        // Safety: the table's layout as described above; chain entries index the symbol
        // table, whose size is nchain. The step count bounds a damaged (cyclic) chain.
        unsafe {
            let t = self.sysv_hash;
            let nbucket = *t;
            let nchain = *t.add(1);
            if nbucket == 0 {
                return None;
            }
            let chains = t.add(2 + nbucket as usize);
            let mut i = *t.add(2 + (h % nbucket) as usize);
            let mut steps = 0;
            while i != 0 && i < nchain && steps <= nchain {
                if let Some(p) = self.accept(i, name) {
                    return Some(p);
                }
                i = *chains.add(i as usize);
                steps += 1;
            }
            None
        }
    }
}

struct Search {
    addr: usize,
    found: Option<DynSymbols>,
}

/// The dynamic symbol table of the loaded object one of whose `PT_LOAD` segments holds
/// `addr`; `None` if no object does or it has no usable table.
pub(crate) fn object_containing(addr: usize) -> Option<DynSymbols> {
    let mut s = Search { addr, found: None };
    // Safety: the callback only reads what the loader hands it, and `s` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&raw mut s).cast()) };
    s.found
}

unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // Safety: `data` is the `Search` passed by `object_containing`; `info` and its program
    // headers are valid during the callback, and the object's dynamic section is mapped.
    unsafe {
        let s = &mut *data.cast::<Search>();
        let info = &*info;
        let base = info.dlpi_addr as usize;
        let phdrs = core::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum));
        let holds = phdrs.iter().any(|p| {
            let start = base.wrapping_add(p.p_vaddr as usize);
            p.p_type == PT_LOAD && s.addr >= start && s.addr - start < p.p_memsz as usize
        });
        if !holds {
            return 0;
        }
        if let Some(d) = phdrs.iter().find(|p| p.p_type == PT_DYNAMIC) {
            s.found = read_dynamic(base, base.wrapping_add(d.p_vaddr as usize) as *const Dyn);
        }
        1
    }
}

struct Elsewhere<'a> {
    name: &'a CStr,
    except: usize,
    found: Option<usize>,
}

/// The default definition of function `name` in the first loaded object (in the loader's
/// order) that has one, other than the object holding `except` (the caller's own, which
/// exports the same name). Unlike `dlsym(RTLD_NEXT, …)` this also sees objects loaded with
/// `RTLD_LOCAL` (Python extensions and what they pull in).
pub(crate) fn default_function_elsewhere(name: &CStr, except: usize) -> Option<usize> {
    let mut s = Elsewhere {
        name,
        except,
        found: None,
    };
    // Safety: the callback only reads what the loader hands it, and `s` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit_elsewhere), (&raw mut s).cast()) };
    s.found
}

unsafe extern "C" fn visit_elsewhere(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // Safety: `data` is the `Elsewhere` passed by `default_function_elsewhere`; `info` and its
    // program headers are valid during the callback, and the object's dynamic section is
    // mapped.
    unsafe {
        let s = &mut *data.cast::<Elsewhere>();
        let info = &*info;
        let base = info.dlpi_addr as usize;
        let phdrs = core::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum));
        let holds_except = phdrs.iter().any(|p| {
            let start = base.wrapping_add(p.p_vaddr as usize);
            p.p_type == PT_LOAD && s.except >= start && s.except - start < p.p_memsz as usize
        });
        if holds_except {
            return 0;
        }
        let Some(d) = phdrs.iter().find(|p| p.p_type == PT_DYNAMIC) else {
            return 0;
        };
        let Some(t) = read_dynamic(base, base.wrapping_add(d.p_vaddr as usize) as *const Dyn)
        else {
            return 0;
        };
        s.found = t.default_function(s.name);
        i32::from(s.found.is_some())
    }
}

/// Reads the parts of a symbol table from a dynamic section. glibc relocates these `d_ptr`
/// values in place on x86-64 and aarch64 (not on every architecture or loader), so a value
/// below the load base is taken as relative to it.
unsafe fn read_dynamic(base: usize, mut d: *const Dyn) -> Option<DynSymbols> {
    let abs = |v: u64| -> usize {
        let v = v as usize;
        if v < base { base + v } else { v }
    };
    let mut t = DynSymbols {
        base,
        strtab: core::ptr::null(),
        symtab: core::ptr::null(),
        gnu_hash: core::ptr::null(),
        sysv_hash: core::ptr::null(),
        versym: core::ptr::null(),
    };
    // Safety: a dynamic section is an array of entries ending in DT_NULL.
    unsafe {
        while (*d).tag != DT_NULL {
            let v = (*d).val;
            match (*d).tag {
                DT_STRTAB => t.strtab = abs(v) as *const u8,
                DT_SYMTAB => t.symtab = abs(v) as *const Sym,
                DT_GNU_HASH => t.gnu_hash = abs(v) as *const u32,
                DT_HASH => t.sysv_hash = abs(v) as *const u32,
                DT_VERSYM => t.versym = abs(v) as *const u16,
                _ => {}
            }
            d = d.add(1);
        }
    }
    let usable = !t.strtab.is_null()
        && !t.symtab.is_null()
        && (!t.gnu_hash.is_null() || !t.sysv_hash.is_null());
    usable.then_some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_match_the_elf_definitions() {
        assert_eq!(gnu_hash(b""), 5381);
        assert_eq!(gnu_hash(b"printf"), 0x156b_2bb8);
        assert_eq!(gnu_hash(b"dlsym"), 0x0f4d_c4ae);
        assert_eq!(sysv_hash(b""), 0);
        assert_eq!(sysv_hash(b"printf"), 0x0779_05a6);
        assert_eq!(sysv_hash(b"dlsym"), 0x006b_3afd);
    }

    /// A made-up object: symbol 0 is the null symbol; `foo` is defined twice, first as a
    /// hidden version (at 0x100) then as the default (at 0x200); `bar` is a default function
    /// (0x300); `obj` is data; `ext` is undefined; `loc` has version 0 (local).
    struct Fake {
        strtab: Vec<u8>,
        syms: Vec<Sym>,
        versym: Vec<u16>,
        gnu: Vec<u32>,
        sysv: Vec<u32>,
    }

    const BASE: usize = 0x10_0000;

    fn fake() -> Fake {
        // (name, st_info, st_shndx, st_value, versym)
        let mut entries: Vec<(&str, u8, u16, u64, u16)> = vec![
            ("foo", STT_FUNC, 12, 0x100, 2 | VERSYM_HIDDEN),
            ("foo", STT_FUNC, 12, 0x200, 3),
            ("bar", STT_FUNC | 0x10, 12, 0x300, 3),
            ("obj", 1, 20, 0x400, 3),
            ("ext", STT_FUNC, SHN_UNDEF, 0, 2),
            ("loc", STT_FUNC, 12, 0x600, 0),
        ];
        // GNU hashing needs the symbols (from `symoffset` = 1 on) grouped by bucket, as a
        // linker orders them; the sort is stable, so the hidden `foo` stays first.
        let nbuckets = 2u32;
        entries.sort_by_key(|e| gnu_hash(e.0.as_bytes()) % nbuckets);
        entries.insert(0, ("", 0, SHN_UNDEF, 0, 0));

        let mut strtab = vec![0u8];
        let mut syms = Vec::new();
        let mut versym = Vec::new();
        for &(name, info, shndx, value, v) in &entries {
            let off = if name.is_empty() {
                0
            } else {
                strtab.len() as u32
            };
            if !name.is_empty() {
                strtab.extend_from_slice(name.as_bytes());
                strtab.push(0);
            }
            syms.push(Sym {
                name: off,
                info,
                other: 0,
                shndx,
                value,
                size: 8,
            });
            versym.push(v);
        }
        let hashes: Vec<u32> = entries.iter().map(|e| gnu_hash(e.0.as_bytes())).collect();

        let mut buckets = vec![0u32; nbuckets as usize];
        let mut chain = Vec::new();
        for i in 1..entries.len() {
            let b = hashes[i] % nbuckets;
            if buckets[b as usize] == 0 {
                buckets[b as usize] = i as u32;
            }
            let last = hashes.get(i + 1).is_none_or(|h| h % nbuckets != b);
            chain.push((hashes[i] & !1) | u32::from(last));
        }
        // nbuckets, symoffset 1, one bloom word (all ones), bloom shift 6.
        let mut gnu = vec![nbuckets, 1, 1, 6, u32::MAX, u32::MAX];
        gnu.extend(&buckets);
        gnu.extend(&chain);

        // SysV: each bucket's chain runs up from its first symbol (the hidden `foo` is met
        // before the default one here too).
        let nsyms = entries.len() as u32;
        let nbucket = 3u32;
        let mut sb = vec![0u32; nbucket as usize];
        let mut sc = vec![0u32; nsyms as usize];
        for (i, e) in entries.iter().enumerate().skip(1).rev() {
            let b = (sysv_hash(e.0.as_bytes()) % nbucket) as usize;
            sc[i] = sb[b];
            sb[b] = i as u32;
        }
        let mut sysv = vec![nbucket, nsyms];
        sysv.extend(&sb);
        sysv.extend(&sc);
        Fake {
            strtab,
            syms,
            versym,
            gnu,
            sysv,
        }
    }

    fn table(f: &Fake, gnu: bool) -> DynSymbols {
        DynSymbols {
            base: BASE,
            strtab: f.strtab.as_ptr(),
            symtab: f.syms.as_ptr(),
            gnu_hash: if gnu {
                f.gnu.as_ptr()
            } else {
                core::ptr::null()
            },
            sysv_hash: if gnu {
                core::ptr::null()
            } else {
                f.sysv.as_ptr()
            },
            versym: f.versym.as_ptr(),
        }
    }

    #[test]
    fn finds_the_default_function_in_either_hash_table() {
        let f = fake();
        for gnu in [true, false] {
            let t = table(&f, gnu);
            // Safety: `t` points into `f`, a well-formed table.
            let find = |n: &CStr| unsafe { t.default_function(n) };
            assert_eq!(find(c"foo"), Some(BASE + 0x200), "gnu {gnu}");
            assert_eq!(find(c"bar"), Some(BASE + 0x300), "gnu {gnu}");
            for absent in [c"obj", c"ext", c"loc", c"fo", c"nothere", c""] {
                assert_eq!(find(absent), None, "gnu {gnu}: {absent:?}");
            }
        }
    }

    #[test]
    fn without_version_entries_any_definition_is_default() {
        let f = fake();
        let mut t = table(&f, true);
        t.versym = core::ptr::null();
        // Safety: as above.
        let found = unsafe { t.default_function(c"foo") };
        assert!(found == Some(BASE + 0x100) || found == Some(BASE + 0x200));
        // Safety: as above.
        assert_eq!(unsafe { t.default_function(c"loc") }, Some(BASE + 0x600));
    }

    /// The object holding glibc's `dlerror` (this test executable uses the system's glibc):
    /// its default `malloc` and `pthread_cond_wait` are the ones this executable was linked
    /// to (on x86-64 `pthread_cond_wait` also has an older, hidden `GLIBC_2.2.5` version at
    /// another address), and its `dlsym` is glibc's, in the same object.
    #[test]
    fn reads_glibcs_own_table() {
        let anchor = libc::dlerror as *const () as usize;
        let t = object_containing(anchor).expect("the object defining dlerror");
        // Safety: a table read from a loaded object.
        let find = |n: &CStr| unsafe { t.default_function(n) };
        assert_eq!(
            find(c"pthread_cond_wait"),
            Some(libc::pthread_cond_wait as *const () as usize)
        );
        if let Some(m) = find(c"malloc") {
            // Before 2.34 malloc is in libc.so.6, not libdl.so.2.
            assert_eq!(m, libc::malloc as *const () as usize);
        }
        let dlsym = find(c"dlsym").expect("dlsym");
        let dlvsym = find(c"dlvsym").expect("dlvsym");
        assert_eq!(find(c"no_such_symbol_here"), None);
        let object_of = |p: usize| {
            let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
            // Safety: dladdr fills `info` for a mapped address.
            assert_ne!(unsafe { libc::dladdr(p as *const c_void, &mut info) }, 0);
            // Safety: dladdr's strings are NUL-terminated.
            let name = |s: *const core::ffi::c_char| unsafe { CStr::from_ptr(s) }.to_owned();
            (name(info.dli_fname), name(info.dli_sname))
        };
        let (lib, _) = object_of(anchor);
        assert_eq!(object_of(dlsym), (lib.clone(), c"dlsym".to_owned()));
        assert_eq!(object_of(dlvsym), (lib, c"dlvsym".to_owned()));
    }
}
