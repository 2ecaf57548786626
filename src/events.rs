//! `vramtrace events`: every event of a trace as one JSON object per line, in time order, with
//! each release carrying the size (and device) of what it released.

use std::io::{self, Write};

use serde::{Serialize, Serializer};
use vramtrace_format::EventKind;

use crate::replay::{Replayer, Step};
use crate::symbolize::StackSymbolizer;
use crate::trace::{Item, Trace};

/// A pointer, handle or stream: written as a hex string (`"0x7f00"`), formatted only when the
/// line is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hex(pub u64);

impl Serialize for Hex {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("{:#x}", self.0))
    }
}

/// A tensor's name, dtype and shape.
#[derive(Debug, Clone, Serialize)]
pub struct TensorLine<'a> {
    /// Name.
    pub name: &'a str,
    /// Element type, if given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<&'a str>,
    /// Shape, outermost first.
    pub shape: Vec<i64>,
}

/// One line of `vramtrace events` output.
#[derive(Debug, Clone, Serialize)]
pub struct EventLine<'a> {
    /// `CLOCK_MONOTONIC` nanoseconds (comparable across processes of one boot).
    pub t_ns: u64,
    /// Process.
    pub pid: u32,
    /// Thread.
    pub tid: u32,
    /// Device ordinal (-1: host memory or unknown).
    pub device: i32,
    /// `alloc`, `free`, `alloc_failed`, `map`, `unmap`, `free_failed`, `annotate`, and for
    /// PyTorch's caching allocator `tensor_alloc`, `tensor_free`, `tensor_alloc_failed` (mem
    /// `tensor`: a block inside a segment, never added to the driver's bytes).
    pub kind: &'static str,
    /// `device`, `managed`, `host`, `array`, `address`, `mapping`.
    pub mem: &'static str,
    /// The driver function.
    pub api: &'static str,
    /// Pointer or handle, hex.
    pub ptr: Hex,
    /// Bytes: requested for allocations, released for releases (0 if the release matched
    /// nothing recorded).
    pub size: u64,
    /// The driver's result code.
    pub result: i32,
    /// The stream, hex, for stream-ordered calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<Hex>,
    /// Pool, pitch, physical handle or flags, hex, where the call has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aux: Option<Hex>,
    /// Free device memory at a failed allocation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free_bytes: Option<u64>,
    /// Total device memory at a failed allocation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_bytes: Option<u64>,
    /// Label active on the thread (annotation or range stack).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<&'a str>,
    /// The tensor named through the annotation ABI: on `annotate` lines, and on the release of
    /// a named allocation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensor: Option<TensorLine<'a>>,
    /// PyTorch's own numbers at an allocator-raised out-of-memory (`tensor_alloc_failed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torch: Option<crate::torch_replay::TorchOom>,
    /// For a `tensor_alloc`: the bytes the program asked for (`size` is the block).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requested: Option<u64>,
    /// Stack id within the process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack: Option<u32>,
    /// Symbolised native frames, innermost first (with `--stacks`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frames: Option<Vec<crate::symbolize::Frame>>,
    /// For a release: true if no recorded allocation matched it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unmatched: bool,
}

impl EventLine<'_> {
    /// Appends the line as JSON to `out`: the very bytes `serde_json::to_writer` writes for
    /// it (the tests hold the two equal), without serde's per-field calls and integer and
    /// string formatting. `frames` is not written: a line with frames goes through serde_json.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"t_ns\":");
        json::uint(out, self.t_ns);
        out.extend_from_slice(b",\"pid\":");
        json::uint(out, self.pid.into());
        out.extend_from_slice(b",\"tid\":");
        json::uint(out, self.tid.into());
        out.extend_from_slice(b",\"device\":");
        json::int(out, self.device.into());
        out.extend_from_slice(b",\"kind\":");
        json::str(out, self.kind);
        out.extend_from_slice(b",\"mem\":");
        json::str(out, self.mem);
        out.extend_from_slice(b",\"api\":");
        json::str(out, self.api);
        out.extend_from_slice(b",\"ptr\":");
        json::hex(out, self.ptr.0);
        out.extend_from_slice(b",\"size\":");
        json::uint(out, self.size);
        out.extend_from_slice(b",\"result\":");
        json::int(out, self.result.into());
        if let Some(Hex(v)) = self.stream {
            out.extend_from_slice(b",\"stream\":");
            json::hex(out, v);
        }
        if let Some(Hex(v)) = self.aux {
            out.extend_from_slice(b",\"aux\":");
            json::hex(out, v);
        }
        if let Some(v) = self.free_bytes {
            out.extend_from_slice(b",\"free_bytes\":");
            json::uint(out, v);
        }
        if let Some(v) = self.total_bytes {
            out.extend_from_slice(b",\"total_bytes\":");
            json::uint(out, v);
        }
        if let Some(l) = self.label {
            out.extend_from_slice(b",\"label\":");
            json::str(out, l);
        }
        if let Some(t) = &self.tensor {
            out.extend_from_slice(b",\"tensor\":{\"name\":");
            json::str(out, t.name);
            if let Some(d) = t.dtype {
                out.extend_from_slice(b",\"dtype\":");
                json::str(out, d);
            }
            out.extend_from_slice(b",\"shape\":[");
            for (i, d) in t.shape.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                json::int(out, *d);
            }
            out.extend_from_slice(b"]}");
        }
        if let Some(t) = &self.torch {
            for (k, v) in [
                (&b",\"torch\":{\"requested\":"[..], t.requested),
                (b",\"allocated\":", t.allocated),
                (b",\"reserved\":", t.reserved),
                (b",\"limit\":", t.limit),
                (b",\"free\":", t.free),
            ] {
                out.extend_from_slice(k);
                json::uint(out, v);
            }
            out.push(b'}');
        }
        if let Some(r) = self.requested {
            out.extend_from_slice(b",\"requested\":");
            json::uint(out, r);
        }
        if let Some(s) = self.stack {
            out.extend_from_slice(b",\"stack\":");
            json::uint(out, s.into());
        }
        if self.unmatched {
            out.extend_from_slice(b",\"unmatched\":true");
        }
        out.push(b'}');
    }
}

/// JSON pieces written as serde_json writes them.
mod json {
    /// A string, escaped as serde_json escapes it: `"`, `\\` and control characters only.
    pub fn str(out: &mut Vec<u8>, s: &str) {
        if s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
            serde_json::to_writer(&mut *out, s).expect("writing to a Vec cannot fail");
        } else {
            out.push(b'"');
            out.extend_from_slice(s.as_bytes());
            out.push(b'"');
        }
    }

    /// An unsigned integer in decimal.
    pub fn uint(out: &mut Vec<u8>, v: u64) {
        const E16: u64 = 10_000_000_000_000_000;
        if v >= E16 {
            uint(out, v / E16);
            digits(out, v % E16, 16, 10);
        } else {
            digits(out, v, v.checked_ilog10().unwrap_or(0) as usize + 1, 10);
        }
    }

    /// The last `n` (at most 16) digits of `v` in base `radix` (10 or 16), most significant
    /// first. They are gathered in a register and appended as one 16-byte word that is then
    /// cut back: digits stored one by one into memory and copied on at once would stall the
    /// copy on the stores, and a copy of the digits' own length is a call to `memcpy`.
    fn digits(out: &mut Vec<u8>, mut v: u64, n: usize, radix: u64) {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut w = 0u128;
        for _ in 0..n {
            w = (w << 8) | u128::from(DIGITS[(v % radix) as usize]);
            v /= radix;
        }
        let len = out.len();
        out.extend_from_slice(&w.to_le_bytes());
        out.truncate(len + n);
    }

    /// A signed integer in decimal.
    pub fn int(out: &mut Vec<u8>, v: i64) {
        if v < 0 {
            out.push(b'-');
        }
        uint(out, v.unsigned_abs());
    }

    /// A value as a quoted hex string, as `format!("{:#x}")` writes it.
    pub fn hex(out: &mut Vec<u8>, v: u64) {
        out.extend_from_slice(b"\"0x");
        digits(
            out,
            v,
            (v.checked_ilog2().unwrap_or(0) / 4) as usize + 1,
            16,
        );
        out.push(b'"');
    }
}

/// Calls `f` with each line in time order, with the index of its process and the stack id to
/// symbolise (0: none).
pub fn for_each_event<'t>(
    trace: &'t Trace,
    mut f: impl FnMut(usize, &EventLine<'t>, u32) -> io::Result<()>,
) -> io::Result<()> {
    let mut replay = Replayer::new();
    let mut tensors = crate::torch_replay::TensorReplay::new();
    let items = trace.items().map_err(io::Error::other)?;
    for (seq, (pi, item)) in items.enumerate() {
        let p = &trace.processes[pi];
        let e = match item {
            Item::Event(e) => e,
            Item::Annotate(a) => {
                let size = replay.annotate(pi, &a);
                let line = EventLine {
                    t_ns: a.t_ns,
                    pid: p.header.pid,
                    tid: a.tid,
                    device: size.map_or(-1, |s| s.device),
                    kind: "annotate",
                    mem: "device",
                    api: if a.op {
                        "vramtrace_annotate_op"
                    } else {
                        "vramtrace_annotate"
                    },
                    ptr: Hex(a.ptr),
                    size: size.map_or(0, |s| s.size),
                    result: 0,
                    stream: None,
                    aux: None,
                    free_bytes: None,
                    total_bytes: None,
                    label: None,
                    tensor: Some(TensorLine {
                        name: p.string(a.name).unwrap_or("?"),
                        dtype: p.string(a.dtype),
                        shape: a.shape.clone(),
                    }),
                    torch: None,
                    requested: None,
                    stack: None,
                    frames: None,
                    unmatched: size.is_none(),
                };
                f(pi, &line, 0)?;
                continue;
            }
            Item::Tensor(t) => {
                let mut line = tensor_line(p, &t);
                if let crate::torch_replay::TensorStep::Released(freed) = tensors.apply(pi, seq, &t)
                {
                    match freed {
                        Some(a) => {
                            line.size = a.event.size;
                            line.device = a.event.device;
                            line.stack = (a.event.stack != 0).then_some(a.event.stack);
                            line.tensor = tensor_of(p, &a.event);
                        }
                        None => line.unmatched = true,
                    }
                }
                let stack = line.stack.unwrap_or(0);
                f(pi, &line, stack)?;
                continue;
            }
            _ => continue,
        };
        let mut line = EventLine {
            t_ns: e.t_ns,
            pid: p.header.pid,
            tid: e.tid,
            device: e.device,
            kind: e.kind.name(),
            mem: e.mem.name(),
            api: e.api.name(),
            ptr: Hex(e.ptr),
            size: e.size,
            result: e.result,
            stream: (e.stream != 0).then_some(Hex(e.stream)),
            aux: (e.aux != 0).then_some(Hex(e.aux)),
            free_bytes: (e.kind == EventKind::AllocFailed).then_some(e.free_bytes),
            total_bytes: (e.kind == EventKind::AllocFailed).then_some(e.total_bytes),
            label: p.string(e.label),
            tensor: None,
            torch: None,
            requested: None,
            stack: (e.stack != 0).then_some(e.stack),
            frames: None,
            unmatched: false,
        };
        if let Step::Released { freed, .. } = replay.apply(pi, seq, &e) {
            match freed {
                Some(a) => {
                    line.size = a.event.size;
                    line.device = a.event.device;
                    line.mem = a.event.mem.name();
                    line.tensor = a.annotation.as_ref().map(|n| TensorLine {
                        name: p.string(n.name).unwrap_or("?"),
                        dtype: p.string(n.dtype),
                        shape: n.shape.clone(),
                    });
                }
                None => line.unmatched = e.result == 0,
            }
        }
        f(pi, &line, e.stack)?;
    }
    Ok(())
}

/// The line of a tensor record (a free's size and name are filled in from its allocation).
fn tensor_line<'t>(p: &'t crate::Process, t: &vramtrace_format::TensorEvent) -> EventLine<'t> {
    let failed = t.action == vramtrace_format::TensorAction::AllocFailed;
    EventLine {
        t_ns: t.t_ns,
        pid: p.header.pid,
        tid: t.tid,
        device: t.device,
        kind: t.action.name(),
        mem: "tensor",
        api: "pytorch",
        ptr: Hex(t.ptr),
        size: t.size,
        result: 0,
        stream: None,
        aux: (t.segment != 0).then_some(Hex(t.segment)),
        free_bytes: failed.then_some(t.free),
        total_bytes: None,
        label: None,
        tensor: tensor_of(p, t),
        torch: failed.then(|| crate::torch_replay::TorchOom::of(t)),
        requested: (t.action == vramtrace_format::TensorAction::Alloc && t.requested != 0)
            .then_some(t.requested),
        stack: (t.stack != 0).then_some(t.stack),
        frames: None,
        unmatched: false,
    }
}

/// The operator, dtype and shape a tensor record carries, if any.
fn tensor_of<'t>(
    p: &'t crate::Process,
    t: &vramtrace_format::TensorEvent,
) -> Option<TensorLine<'t>> {
    let name = p.string(t.op);
    let dtype = p.string(t.dtype);
    (name.is_some() || dtype.is_some() || !t.shape.is_empty()).then(|| TensorLine {
        name: name.unwrap_or("tensor"),
        dtype,
        shape: t.shape.clone(),
    })
}

/// Writes every event as JSON lines, with symbolised frames if `stacks`. A closed pipe
/// (`| head`) ends the output quietly.
pub fn write_events(trace: &Trace, stacks: bool, out: &mut dyn Write) -> io::Result<()> {
    let mut syms: Vec<StackSymbolizer> = if stacks {
        trace.processes.iter().map(StackSymbolizer::new).collect()
    } else {
        Vec::new()
    };
    // Lines are built in one buffer, written whole once it holds about 64 KiB: serde_json's
    // many small writes through `dyn Write` cost more than the rest of a line, and its field
    // by field formatting more than the replay (`EventLine::write_json` writes the same bytes).
    const FLUSH_AT: usize = 64 << 10;
    let mut buf = Vec::with_capacity(FLUSH_AT + 4096);
    let r = for_each_event(trace, |pi, line, stack| {
        if stacks && stack != 0 {
            let mut l = line.clone();
            l.frames = Some(syms[pi].stack(stack));
            serde_json::to_writer(&mut buf, &l)?;
        } else {
            line.write_json(&mut buf);
        }
        buf.push(b'\n');
        if buf.len() >= FLUSH_AT {
            out.write_all(&buf)?;
            buf.clear();
        }
        Ok(())
    })
    .and_then(|_| out.write_all(&buf));
    match r.and_then(|_| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `EventLine::write_json` writes exactly what serde_json writes for the line.
    #[test]
    fn write_json_is_serde_json() {
        let base = EventLine {
            t_ns: 0,
            pid: 1,
            tid: 2,
            device: -1,
            kind: "alloc",
            mem: "device",
            api: "cuMemAlloc_v2",
            ptr: Hex(0),
            size: 0,
            result: 0,
            stream: None,
            aux: None,
            free_bytes: None,
            total_bytes: None,
            label: None,
            tensor: None,
            torch: None,
            requested: None,
            stack: None,
            frames: None,
            unmatched: false,
        };
        let mut lines = vec![base.clone()];
        lines.push(EventLine {
            t_ns: u64::MAX,
            pid: u32::MAX,
            tid: 4_000_000_000,
            device: i32::MIN,
            ptr: Hex(u64::MAX),
            size: 1 << 40,
            result: -7,
            stream: Some(Hex(0x10)),
            aux: Some(Hex(0xdead_beef)),
            free_bytes: Some(0),
            total_bytes: Some(144 << 30),
            label: Some("prefill/\"layer\" 3\\x\n\t\u{1}\u{7f} é ✓"),
            tensor: Some(TensorLine {
                name: "q\"k",
                dtype: Some("bf16"),
                shape: vec![i64::MIN, -1, 0, 7, i64::MAX],
            }),
            stack: Some(0),
            unmatched: true,
            ..base.clone()
        });
        lines.push(EventLine {
            device: 3,
            result: 2,
            tensor: Some(TensorLine {
                name: "",
                dtype: None,
                shape: vec![],
            }),
            stack: Some(u32::MAX),
            torch: Some(crate::torch_replay::TorchOom {
                requested: 20 << 30,
                allocated: u64::MAX,
                reserved: 0,
                limit: 12 << 30,
                free: 1,
            }),
            requested: Some(u64::MAX),
            ..base.clone()
        });
        // Every width of decimal and hex number, and its edges.
        for k in 0..64 {
            for v in [
                1u64 << k,
                (1u64 << k) - 1,
                10u64.saturating_pow(k / 3).saturating_add(1),
            ] {
                lines.push(EventLine {
                    t_ns: v,
                    device: (v as i32).wrapping_neg(),
                    ptr: Hex(v),
                    size: v.wrapping_mul(9),
                    stream: Some(Hex(v.wrapping_mul(9))),
                    ..base.clone()
                });
            }
        }
        for l in &lines {
            let mut mine = Vec::new();
            l.write_json(&mut mine);
            let theirs = serde_json::to_vec(l).unwrap();
            assert_eq!(
                String::from_utf8(mine).unwrap(),
                String::from_utf8(theirs).unwrap()
            );
        }
    }
}
