//! `vramtrace events`: every event of a trace as one JSON object per line, in time order, with
//! each release carrying the size (and device) of what it released.

use std::io::{self, Write};

use serde::Serialize;
use vramtrace_format::{Event, EventKind};

use crate::replay::{Replayer, Step};
use crate::symbolize::StackSymbolizer;
use crate::trace::Trace;

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
    /// `alloc`, `free`, `alloc_failed`, `map`, `unmap`, `free_failed`.
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

/// Calls `f` with each event line in time order.
pub fn for_each_event<'t>(
    trace: &'t Trace,
    mut f: impl FnMut(usize, &EventLine<'t>, &Event) -> io::Result<()>,
) -> io::Result<()> {
    let mut replay = Replayer::new();
    for (seq, (pi, e)) in trace.events_in_time_order().into_iter().enumerate() {
        let p = &trace.processes[pi];
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
            stack: (e.stack != 0).then_some(e.stack),
            frames: None,
            unmatched: false,
        };
        if let Step::Released { freed } = replay.apply(pi, seq, e) {
            match freed {
                Some(a) => {
                    line.size = a.event.size;
                    line.device = a.event.device;
                    line.mem = a.event.mem.name();
                }
                None => line.unmatched = e.result == 0,
            }
        }
        f(pi, &line, e)?;
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
    let r = for_each_event(trace, |pi, line, e| {
        if stacks && e.stack != 0 {
            let mut l = line.clone();
            l.frames = Some(syms[pi].stack(e.stack));
            serde_json::to_writer(&mut *out, &l)?;
        } else {
            serde_json::to_writer(&mut *out, line)?;
        }
        out.write_all(b"\n")
    });
    match r.and_then(|_| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}
