//! `vramtrace events`: every event of a trace as one JSON object per line, in time order, with
//! each release carrying the size (and device) of what it released.

use std::io::{self, Write};

use serde::Serialize;
use vramtrace_format::EventKind;

use crate::replay::{Replayer, Step};
use crate::symbolize::StackSymbolizer;
use crate::trace::{Item, Trace};

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
    /// `alloc`, `free`, `alloc_failed`, `map`, `unmap`, `free_failed`, `annotate`.
    pub kind: &'static str,
    /// `device`, `managed`, `host`, `array`, `address`, `mapping`.
    pub mem: &'static str,
    /// The driver function.
    pub api: &'static str,
    /// Pointer or handle, hex.
    pub ptr: String,
    /// Bytes: requested for allocations, released for releases (0 if the release matched
    /// nothing recorded).
    pub size: u64,
    /// The driver's result code.
    pub result: i32,
    /// The stream, hex, for stream-ordered calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    /// Pool, pitch, physical handle or flags, hex, where the call has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aux: Option<String>,
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

/// Calls `f` with each line in time order, with the index of its process and the stack id to
/// symbolise (0: none).
pub fn for_each_event<'t>(
    trace: &'t Trace,
    mut f: impl FnMut(usize, &EventLine<'t>, u32) -> io::Result<()>,
) -> io::Result<()> {
    let mut replay = Replayer::new();
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
                    api: "vramtrace_annotate",
                    ptr: format!("{:#x}", a.ptr),
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
                    stack: None,
                    frames: None,
                    unmatched: size.is_none(),
                };
                f(pi, &line, 0)?;
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
            ptr: format!("{:#x}", e.ptr),
            size: e.size,
            result: e.result,
            stream: (e.stream != 0).then(|| format!("{:#x}", e.stream)),
            aux: (e.aux != 0).then(|| format!("{:#x}", e.aux)),
            free_bytes: (e.kind == EventKind::AllocFailed).then_some(e.free_bytes),
            total_bytes: (e.kind == EventKind::AllocFailed).then_some(e.total_bytes),
            label: p.string(e.label),
            tensor: None,
            stack: (e.stack != 0).then_some(e.stack),
            frames: None,
            unmatched: false,
        };
        if let Step::Released { freed } = replay.apply(pi, seq, &e) {
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

/// Writes every event as JSON lines, with symbolised frames if `stacks`. A closed pipe
/// (`| head`) ends the output quietly.
pub fn write_events(trace: &Trace, stacks: bool, out: &mut dyn Write) -> io::Result<()> {
    let mut syms: Vec<StackSymbolizer> = if stacks {
        trace.processes.iter().map(StackSymbolizer::new).collect()
    } else {
        Vec::new()
    };
    // Each line is built in one buffer and written whole: serde_json's many small writes
    // through `dyn Write` cost more than the rest of the line.
    let mut buf = Vec::with_capacity(512);
    let r = for_each_event(trace, |pi, line, stack| {
        buf.clear();
        if stacks && stack != 0 {
            let mut l = line.clone();
            l.frames = Some(syms[pi].stack(stack));
            serde_json::to_writer(&mut buf, &l)?;
        } else {
            serde_json::to_writer(&mut buf, line)?;
        }
        buf.push(b'\n');
        out.write_all(&buf)
    });
    match r.and_then(|_| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}
