//! The frame walk and string reads over a mock memory laid out as each supported version lays
//! out its structures: no interpreter needed.

use std::cell::RefCell;
use std::collections::BTreeMap;

use super::*;

const CODE_TYPE: u64 = 0x10_0000;
const STR_TYPE: u64 = 0x20_0000;

/// Memory made of separate regions, each at its own address; reads outside them fail.
#[derive(Default)]
struct Mock {
    regions: RefCell<BTreeMap<u64, Vec<u8>>>,
    next: RefCell<u64>,
}

impl Memory for Mock {
    fn read(&self, addr: u64, out: &mut [u8]) -> bool {
        let regions = self.regions.borrow();
        let Some((&base, bytes)) = regions.range(..=addr).next_back() else {
            return false;
        };
        let at = (addr - base) as usize;
        match bytes.get(at..at + out.len()) {
            Some(b) => {
                out.copy_from_slice(b);
                true
            }
            None => false,
        }
    }
}

impl Mock {
    fn alloc(&self, size: usize) -> u64 {
        let mut next = self.next.borrow_mut();
        if *next == 0 {
            *next = 0x100_0000;
        }
        let at = *next;
        *next += (size as u64 + 0xfff) & !0xfff;
        self.regions.borrow_mut().insert(at, vec![0; size]);
        at
    }
    fn put(&self, addr: u64, bytes: &[u8]) {
        let mut regions = self.regions.borrow_mut();
        let (&base, region) = regions.range_mut(..=addr).next_back().unwrap();
        let at = (addr - base) as usize;
        region[at..at + bytes.len()].copy_from_slice(bytes);
    }
    fn put_u64(&self, addr: u64, v: u64) {
        self.put(addr, &v.to_le_bytes());
    }
    fn put_u32(&self, addr: u64, v: u32) {
        self.put(addr, &v.to_le_bytes());
    }

    /// A compact ASCII `str`.
    fn ascii(&self, l: &Layout, text: &str) -> u64 {
        let s = self.alloc(l.ascii_size as usize + text.len() + 1);
        self.put_u64(s + OB_TYPE, STR_TYPE);
        self.put_u64(s + STR_LENGTH, text.len() as u64);
        self.put_u32(s + STR_STATE, (1 << 2) | (1 << 5) | (1 << 6));
        self.put(s + l.ascii_size, text.as_bytes());
        s
    }

    /// A compact non-ASCII `str` of `kind` bytes per character, with or without cached UTF-8.
    fn compact(&self, l: &Layout, text: &str, kind: u32, cached_utf8: bool) -> u64 {
        let chars: Vec<u32> = text.chars().map(|c| c as u32).collect();
        let s = self.alloc(l.compact_size as usize + chars.len() * kind as usize + 4);
        self.put_u64(s + OB_TYPE, STR_TYPE);
        self.put_u64(s + STR_LENGTH, chars.len() as u64);
        self.put_u32(s + STR_STATE, (kind << 2) | (1 << 5));
        for (i, &c) in chars.iter().enumerate() {
            let at = s + l.compact_size + i as u64 * kind as u64;
            self.put(at, &c.to_le_bytes()[..kind as usize]);
        }
        if cached_utf8 {
            let u = self.alloc(text.len() + 1);
            self.put(u, text.as_bytes());
            self.put_u64(s + l.compact_utf8, u);
            self.put_u64(s + l.compact_utf8_length, text.len() as u64);
        }
        s
    }

    /// A code object named `function` in `file`; returns its address.
    fn code(&self, l: &Layout, file: &str, function: &str, first_traceable: u32) -> u64 {
        let c = self.alloc(512);
        self.put_u64(c + OB_TYPE, CODE_TYPE);
        let (f, n) = (self.ascii(l, file), self.ascii(l, function));
        self.put_u64(c + l.code_filename, f);
        self.put_u64(c + l.code_name, n);
        if let Chain::Interpreter {
            code_firsttraceable,
            ..
        } = l.chain
        {
            self.put_u32(c + code_firsttraceable, first_traceable);
        }
        c
    }
}

/// One frame to lay out: its code, the byte offset of its instruction, its owner.
struct Spec {
    code: u64,
    offset: u64,
    owner: u8,
}

/// Lays out `frames` (innermost first) for `l` under a new thread state; returns the state.
fn chain(m: &Mock, l: &Layout, frames: &[Spec]) -> u64 {
    let tstate = m.alloc(256);
    let mut addrs: Vec<u64> = frames.iter().map(|_| m.alloc(128)).collect();
    addrs.push(0);
    match l.chain {
        Chain::FrameObjects {
            tstate_frame,
            f_back,
            f_code,
            f_lasti,
        } => {
            m.put_u64(tstate + tstate_frame, addrs[0]);
            for (i, f) in frames.iter().enumerate() {
                m.put_u64(addrs[i] + f_back, addrs[i + 1]);
                m.put_u64(addrs[i] + f_code, f.code);
                m.put_u32(addrs[i] + f_lasti, (f.offset / 2) as u32);
            }
        }
        Chain::Interpreter {
            tstate_frame,
            cframe_current,
            code,
            previous,
            instr,
            owner,
            code_adaptive,
            ..
        } => {
            match cframe_current {
                Some(off) => {
                    let cframe = m.alloc(64);
                    m.put_u64(tstate + tstate_frame, cframe);
                    m.put_u64(cframe + off, addrs[0]);
                }
                None => m.put_u64(tstate + tstate_frame, addrs[0]),
            }
            for (i, f) in frames.iter().enumerate() {
                m.put_u64(addrs[i] + previous, addrs[i + 1]);
                m.put_u64(addrs[i] + code, f.code);
                m.put_u64(addrs[i] + instr, f.code + code_adaptive + f.offset);
                m.put(addrs[i] + owner, &[f.owner]);
            }
        }
    }
    tstate
}

fn walked(m: &Mock, l: &Layout, tstate: u64) -> Vec<RawFrame> {
    let mut out = Vec::new();
    walk(m, l, CODE_TYPE, tstate, |f| {
        out.push(f);
        true
    });
    out
}

fn name(m: &Mock, l: &Layout, s: u64) -> Option<String> {
    let mut buf = [0u8; MAX_NAME];
    read_str(m, l, STR_TYPE, s, &mut buf).map(|b| String::from_utf8(b.to_vec()).unwrap())
}

#[test]
fn every_supported_version_walks_innermost_first_skipping_shims_and_prologues() {
    for minor in 10..=13 {
        let l = layout(3, minor).unwrap();
        let m = Mock::default();
        let inner = m.code(&l, "fla/ops/common/chunk_o.py", "chunk_fwd_o", 2);
        let middle = m.code(&l, "fla/ops/common/chunk_o.py", "prologue", 4);
        let outer = m.code(&l, "prefill.py", "<module>", 0);
        let cstack = match l.chain {
            Chain::Interpreter { owner_cstack, .. } => owner_cstack,
            Chain::FrameObjects { .. } => None,
        };
        let mut specs = vec![Spec {
            code: inner,
            offset: 40,
            owner: 0,
        }];
        if minor >= 11 {
            // Still before its first traceable instruction (8 bytes): skipped.
            specs.push(Spec {
                code: middle,
                offset: 2,
                owner: 0,
            });
        }
        if let Some(c) = cstack {
            specs.push(Spec {
                code: outer,
                offset: 0,
                owner: c,
            });
        }
        specs.push(Spec {
            code: outer,
            offset: 120,
            owner: 0,
        });
        let tstate = chain(&m, &l, &specs);
        let got = walked(&m, &l, tstate);
        assert_eq!(
            got,
            vec![
                RawFrame {
                    code: inner,
                    offset: 40
                },
                RawFrame {
                    code: outer,
                    offset: 120
                }
            ],
            "3.{minor}"
        );
        let mut buf = [0u8; MAX_NAME];
        let file = m.u64(inner + l.code_filename).unwrap();
        assert_eq!(
            read_str(&m, &l, STR_TYPE, file, &mut buf),
            Some(&b"fla/ops/common/chunk_o.py"[..])
        );
    }
}

#[test]
fn a_generator_frame_is_never_incomplete() {
    let l = layout(3, 12).unwrap();
    let m = Mock::default();
    let g = m.code(&l, "gen.py", "tokens", 10);
    let tstate = chain(
        &m,
        &l,
        &[Spec {
            code: g,
            offset: 0,
            owner: 1,
        }],
    );
    assert_eq!(
        walked(&m, &l, tstate),
        vec![RawFrame { code: g, offset: 0 }]
    );
}

#[test]
fn a_cycle_ends_at_the_cap_and_a_foreign_object_ends_or_is_skipped() {
    for minor in [10, 11, 12, 13] {
        let l = layout(3, minor).unwrap();
        let m = Mock::default();
        let c = m.code(&l, "loop.py", "spin", 0);
        let tstate = chain(
            &m,
            &l,
            &[Spec {
                code: c,
                offset: 4,
                owner: 0,
            }],
        );
        // Point the only frame back at itself.
        let first = match l.chain {
            Chain::FrameObjects { tstate_frame, .. } => m.u64(tstate + tstate_frame).unwrap(),
            Chain::Interpreter {
                tstate_frame,
                cframe_current: Some(off),
                ..
            } => m.u64(m.u64(tstate + tstate_frame).unwrap() + off).unwrap(),
            Chain::Interpreter { tstate_frame, .. } => m.u64(tstate + tstate_frame).unwrap(),
        };
        let back = match l.chain {
            Chain::FrameObjects { f_back, .. } => f_back,
            Chain::Interpreter { previous, .. } => previous,
        };
        m.put_u64(first + back, first);
        assert_eq!(walked(&m, &l, tstate).len(), MAX_WALK, "3.{minor}");

        // A frame whose code is not a code object.
        m.put_u64(c + OB_TYPE, STR_TYPE);
        m.put_u64(first + back, 0);
        assert!(walked(&m, &l, tstate).is_empty(), "3.{minor}");
    }
    // An unreadable thread state or frame: nothing, no fault.
    let l = layout(3, 11).unwrap();
    assert!(walked(&Mock::default(), &l, 0xdead_0000).is_empty());
}

#[test]
fn strings_in_every_compact_form() {
    for minor in [10, 12] {
        let l = layout(3, minor).unwrap();
        let m = Mock::default();
        let s = m.ascii(&l, "chunk_o.py");
        assert_eq!(name(&m, &l, s).as_deref(), Some("chunk_o.py"));
        let s = m.compact(&l, "café.py", 1, false);
        assert_eq!(name(&m, &l, s).as_deref(), Some("café.py"));
        let s = m.compact(&l, "模型.py", 2, false);
        assert_eq!(name(&m, &l, s).as_deref(), Some("模型.py"));
        let s = m.compact(&l, "🔥.py", 4, false);
        assert_eq!(name(&m, &l, s).as_deref(), Some("🔥.py"));
        let s = m.compact(&l, "模型.py", 2, true);
        assert_eq!(name(&m, &l, s).as_deref(), Some("模型.py"));
        // Cut at MAX_NAME bytes, on a character boundary.
        let long = "é".repeat(MAX_NAME);
        let s = m.compact(&l, &long, 1, false);
        assert_eq!(name(&m, &l, s).unwrap().len(), MAX_NAME);
        let s = m.compact(&l, &long, 1, true);
        assert_eq!(name(&m, &l, s).unwrap(), "é".repeat(MAX_NAME / 2));
        let s = m.compact(&l, &"模".repeat(MAX_NAME), 2, false);
        assert_eq!(name(&m, &l, s).unwrap(), "模".repeat(MAX_NAME / 3));
        // Not a str, or null: nothing.
        let c = m.code(&l, "a.py", "f", 0);
        assert_eq!(name(&m, &l, c), None);
        assert_eq!(name(&m, &l, 0), None);
    }
}

#[test]
fn versions_outside_the_tables_are_unsupported_by_name() {
    assert!(layout(3, 9).is_none() && layout(3, 14).is_none() && layout(2, 7).is_none());
    assert_eq!(parse_version(b"3.10.13 (main, May  9 2026)"), Some((3, 10)));
    assert_eq!(parse_version(b"3.13.0rc1"), Some((3, 13)));
    assert_eq!(parse_version(b"garbage"), None);
    let mut out = [0u8; 96];
    let n = unsupported_note(3, 14, &mut out);
    assert_eq!(
        &out[..n],
        b"unsupported Python version 3.14: no Python frames (3.10 to 3.13 are read)"
    );
}
