//! Library tests on synthetic traces (no GPU, no files).

use vramtrace_format::{
    Annotation, Api, DeviceInfo, Event, EventKind, Header, MemKind, Record, TraceFile,
};

use crate::replay::Pool;
use crate::summary::{SummaryOptions, summarize};
use crate::trace::Trace;

pub(crate) fn ev(t: u64, kind: EventKind, mem: MemKind, api: &str, ptr: u64, size: u64) -> Event {
    Event {
        t_ns: t,
        tid: 1,
        device: if mem == MemKind::Host { -1 } else { 0 },
        kind,
        mem,
        api: Api::from_name(api).unwrap(),
        result: if kind == EventKind::AllocFailed { 2 } else { 0 },
        ptr,
        size,
        ..Event::default()
    }
}

/// A tensor allocation of `size` bytes (asked for and handed out) on device 0 at `t`.
pub(crate) fn tensor_alloc(t: u64, ptr: u64, size: u64) -> vramtrace_format::TensorEvent {
    vramtrace_format::TensorEvent {
        t_ns: t,
        tid: 1,
        device: 0,
        action: vramtrace_format::TensorAction::Alloc,
        ptr,
        size,
        requested: size,
        ..Default::default()
    }
}

pub(crate) fn trace_of(pid: u32, records: Vec<Record>) -> Trace {
    let f = TraceFile {
        path: format!("{pid}.vtr").into(),
        header: Header {
            pid,
            ppid: 1,
            cmdline: vec!["test".into()],
            ..Header::default()
        },
        driver_version: Some(13000),
        devices: vec![DeviceInfo {
            ordinal: 0,
            total_bytes: 24 << 30,
            name: "stand-in".into(),
        }],
        records,
        problems: vec![],
    };
    Trace::from_files(vec![f])
}

pub(crate) const MIB: u64 = 1 << 20;

/// A known sequence: 10 MiB, 20 MiB, free 10, 30 MiB (peak 50 MiB), then a failed 50 MiB
/// request while 20+30 are live, then frees.
pub(crate) fn known_sequence() -> Vec<Record> {
    use EventKind::*;
    use MemKind::*;
    let mut failed = ev(50, AllocFailed, Device, "cuMemAlloc_v2", 0, 50 * MIB);
    failed.free_bytes = 30 * MIB + MIB / 2;
    failed.total_bytes = 24 << 30;
    failed.label = 7;
    vec![
        Record::String {
            id: 7,
            text: "prefill/gdn".into(),
        },
        Record::Event(ev(10, Alloc, Device, "cuMemAlloc_v2", 0x1000, 10 * MIB)),
        Record::Event(ev(20, Alloc, Device, "cuMemAlloc_v2", 0x2000, 20 * MIB)),
        Record::Event(ev(25, Alloc, Host, "cuMemHostAlloc", 0x9000, 64 * MIB)),
        Record::Event(ev(
            26,
            Alloc,
            Address,
            "cuMemAddressReserve",
            0x1_0000_0000,
            1 << 30,
        )),
        Record::Event(ev(30, Free, Device, "cuMemFree_v2", 0x1000, 0)),
        Record::Event(ev(40, Alloc, Device, "cuMemAllocAsync", 0x3000, 30 * MIB)),
        Record::String {
            id: 8,
            text: "o".into(),
        },
        Record::String {
            id: 9,
            text: "bf16".into(),
        },
        Record::Annotate(Annotation {
            t_ns: 41,
            tid: 1,
            ptr: 0x3000,
            name: 8,
            dtype: 9,
            shape: vec![4128, 48, 128],
            op: false,
        }),
        Record::Event(failed),
        Record::Event(ev(60, Free, Device, "cuMemFreeAsync", 0x3000, 0)),
        Record::Event(ev(70, Free, Device, "cuMemFree_v2", 0xdead, 0)),
        Record::Event(ev(80, Free, Host, "cuMemFreeHost", 0x9000, 0)),
    ]
}

#[test]
fn summary_reports_exact_peak_and_live_set_at_failure() {
    let t = trace_of(100, known_sequence());
    let s = summarize(&t, SummaryOptions::default()).unwrap();
    assert_eq!(s.processes.len(), 1);
    let d = s.processes[0]
        .devices
        .iter()
        .find(|d| d.device == 0)
        .unwrap();
    assert_eq!(d.allocations, 3);
    assert_eq!(
        d.frees, 2,
        "the free of an unknown pointer pairs with nothing"
    );
    assert_eq!(d.peak_bytes, 50 * MIB);
    assert_eq!(
        d.peak_live.iter().map(|a| a.size).collect::<Vec<_>>(),
        vec![30 * MIB, 20 * MIB]
    );
    assert_eq!(
        d.peak_live[0].tensor.as_deref(),
        Some("o bf16[4128, 48, 128]")
    );
    assert_eq!(d.peak_live[1].tensor, None);
    assert_eq!(d.live_at_end, 20 * MIB);
    assert_eq!(d.failed_allocations, 1);
    let f = &d.failures[0];
    assert_eq!(f.size, 50 * MIB);
    assert_eq!(f.free_bytes, 30 * MIB + MIB / 2);
    assert_eq!(f.live_bytes, 50 * MIB);
    assert_eq!(f.live_count, 2);
    assert_eq!(f.label.as_deref(), Some("prefill/gdn"));
    assert_eq!(
        f.live.iter().map(|a| a.ptr.as_str()).collect::<Vec<_>>(),
        vec!["0x3000", "0x2000"]
    );
    // Host memory and address space are kept apart from device memory.
    let host = s.processes[0]
        .devices
        .iter()
        .find(|d| d.device == -1)
        .unwrap();
    assert_eq!(host.peak_bytes, 0);
    assert_eq!(host.other_pools[0].pool, Pool::Host);
    assert_eq!(host.other_pools[0].peak_bytes, 64 * MIB);
    assert!(
        d.other_pools
            .iter()
            .any(|p| p.pool == Pool::Address && p.peak_bytes == 1 << 30)
    );
}

#[test]
fn events_carry_freed_sizes_in_time_order() {
    let mut recs = known_sequence();
    recs.reverse(); // file order must not matter: events are sorted by time
    let t = trace_of(100, recs);
    let mut out = Vec::new();
    crate::events::write_events(&t, false, &mut out).unwrap();
    let lines: Vec<serde_json::Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ts: Vec<u64> = lines.iter().map(|l| l["t_ns"].as_u64().unwrap()).collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]));
    let free = lines.iter().find(|l| l["api"] == "cuMemFreeAsync").unwrap();
    assert_eq!(free["kind"], "free");
    assert_eq!(free["size"], 30 * MIB);
    let failed = lines.iter().find(|l| l["kind"] == "alloc_failed").unwrap();
    assert_eq!(failed["free_bytes"], 30 * MIB + MIB / 2);
    assert_eq!(failed["total_bytes"], 24u64 << 30);
    assert_eq!(failed["label"], "prefill/gdn");
    let ann = lines.iter().find(|l| l["kind"] == "annotate").unwrap();
    assert_eq!(ann["size"], 30 * MIB);
    assert_eq!(ann["tensor"]["name"], "o");
    assert_eq!(ann["tensor"]["shape"], serde_json::json!([4128, 48, 128]));
    assert_eq!(free["tensor"]["dtype"], "bf16");
    let unknown = lines.iter().find(|l| l["ptr"] == "0xdead").unwrap();
    assert_eq!(unknown["unmatched"], true);
    assert_eq!(unknown["size"], 0);
}

#[test]
fn freeing_a_null_pointer_releases_nothing_and_is_not_unmatched() {
    // cuMemFree(0) succeeds and does nothing; NCCL under torchrun makes one per rank.
    let mut recs = known_sequence();
    recs.push(Record::Event(ev(
        55,
        EventKind::Free,
        MemKind::Device,
        "cuMemFree_v2",
        0,
        0,
    )));
    let t = trace_of(101, recs);
    let mut out = Vec::new();
    crate::events::write_events(&t, false, &mut out).unwrap();
    let null = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["ptr"] == "0x0" && l["kind"] == "free")
        .unwrap();
    assert_eq!(null.get("unmatched"), None, "{null}");
    let s = summarize(&t, SummaryOptions { top: 3, frames: 0 }).unwrap();
    let plain = summarize(
        &trace_of(101, known_sequence()),
        SummaryOptions { top: 3, frames: 0 },
    )
    .unwrap();
    assert_eq!(
        serde_json::to_value(&s.processes[0].devices).unwrap(),
        serde_json::to_value(&plain.processes[0].devices).unwrap()
    );
}

#[test]
fn vmm_handles_and_mappings_pair_separately_from_pointers() {
    use EventKind::*;
    use MemKind::*;
    // cuMemCreate handle 0x1000 and a cuMemAlloc pointer 0x1000 must not pair with each other.
    let recs = vec![
        Record::Event(ev(
            1,
            Alloc,
            Address,
            "cuMemAddressReserve",
            0x1000,
            1 << 30,
        )),
        Record::Event(ev(2, Alloc, Device, "cuMemCreate", 0x1000, 20 * MIB)),
        Record::Event(ev(3, Map, Mapping, "cuMemMap", 0x1000, 20 * MIB)),
        Record::Event(ev(4, Alloc, Device, "cuMemAlloc_v2", 0x1000, 2 * MIB)),
        Record::Event(ev(5, Free, Device, "cuMemFree_v2", 0x1000, 0)),
        Record::Event(ev(6, Unmap, Mapping, "cuMemUnmap", 0x1000, 20 * MIB)),
        Record::Event(ev(7, Free, Device, "cuMemRelease", 0x1000, 0)),
    ];
    let t = trace_of(5, recs);
    let s = summarize(&t, SummaryOptions::default()).unwrap();
    let d = &s.processes[0].devices[0];
    assert_eq!(d.peak_bytes, 22 * MIB);
    assert_eq!(d.allocations, 2);
    assert_eq!(d.frees, 2);
    assert_eq!(d.live_at_end, 0);
    let mapped = d
        .other_pools
        .iter()
        .find(|p| p.pool == Pool::Mapped)
        .unwrap();
    assert_eq!((mapped.peak_bytes, mapped.live_at_end), (20 * MIB, 0));
}

/// ggml's CUDA pool (llama.cpp) maps its range in pieces, 8 + 8 + 24 MiB, each `cuMemCreate` +
/// `cuMemMap` + `cuMemRelease`, and at teardown unmaps the whole 40 MiB with one `cuMemUnmap`:
/// every mapping inside the range ends there, none is left live. The unmap is written as the
/// recorder writes it (`probes/preload/src/hooks.rs` `cuMemUnmap`): size 0, like every release,
/// and the range's length in `aux`.
#[test]
fn one_unmap_of_a_range_ends_every_mapping_inside_it() {
    use EventKind::*;
    use MemKind::*;
    let base = 0x7000_0000u64;
    let mut recs = vec![Record::Event(ev(
        1,
        Alloc,
        Address,
        "cuMemAddressReserve",
        base,
        1 << 30,
    ))];
    let mut t = 2;
    let mut at = base;
    for (i, size) in [8 * MIB, 8 * MIB, 24 * MIB].into_iter().enumerate() {
        let h = 0x100 + i as u64;
        recs.push(Record::Event(ev(t, Alloc, Device, "cuMemCreate", h, size)));
        recs.push(Record::Event(ev(t + 1, Map, Mapping, "cuMemMap", at, size)));
        recs.push(Record::Event(ev(t + 2, Free, Device, "cuMemRelease", h, 0)));
        t += 3;
        at += size;
    }
    recs.push(Record::Event(Event {
        aux: 40 * MIB,
        ..ev(t, Unmap, Mapping, "cuMemUnmap", base, 0)
    }));
    recs.push(Record::Event(ev(
        t + 1,
        Free,
        Address,
        "cuMemAddressFree",
        base,
        0,
    )));
    let s = summarize(&trace_of(5, recs), SummaryOptions::default()).unwrap();
    let d = &s.processes[0].devices[0];
    let mapped = d
        .other_pools
        .iter()
        .find(|p| p.pool == Pool::Mapped)
        .unwrap();
    assert_eq!(mapped.peak_bytes, 40 * MIB);
    assert_eq!(mapped.live_at_end, 0, "{mapped:?}");
    assert_eq!((mapped.allocations, mapped.frees), (3, 3));
}

#[test]
fn items_merge_processes_in_time_order_ties_to_the_earlier_process() {
    use EventKind::*;
    use MemKind::*;
    let a = |t: u64, ptr: u64| Record::Event(ev(t, Alloc, Device, "cuMemAlloc_v2", ptr, MIB));
    let mut first = trace_of(1, vec![a(10, 0x10), a(30, 0x30), a(50, 0x50)]).processes;
    let mut second = trace_of(2, vec![a(5, 0x5), a(30, 0x31), a(40, 0x40)]).processes;
    second[0].header.start_mono_ns = 1;
    first.append(&mut second);
    let t = Trace::from_processes(first);
    let got: Vec<(u32, u64)> = t
        .items()
        .unwrap()
        .map(|(pi, it)| (t.processes[pi].pid(), it.t_ns()))
        .collect();
    assert_eq!(
        got,
        vec![(2, 5), (1, 10), (1, 30), (2, 30), (2, 40), (1, 50)]
    );
}

/// A trace whose every allocation is a new peak with a release after each: copying the live set
/// at each peak would cost the live set per event, so the summary leaves it to a second pass.
#[test]
fn a_peak_set_too_costly_to_copy_in_the_pass_is_taken_by_a_second_one() {
    use EventKind::*;
    use MemKind::*;
    let n = 200u64;
    let mut recs = vec![
        Record::String {
            id: 1,
            text: "w".into(),
        },
        Record::String {
            id: 2,
            text: "f32".into(),
        },
    ];
    let mut t = 0;
    for i in 0..n {
        t += 1;
        recs.push(Record::Event(ev(
            t,
            Alloc,
            Device,
            "cuMemAlloc_v2",
            0x10_0000 + i,
            10 * MIB,
        )));
        t += 1;
        recs.push(Record::Event(ev(
            t,
            Alloc,
            Device,
            "cuMemAlloc_v2",
            0x20_0000 + i,
            MIB,
        )));
        if i + 1 < n {
            t += 1;
            recs.push(Record::Event(ev(
                t,
                Free,
                Device,
                "cuMemFree_v2",
                0x20_0000 + i,
                0,
            )));
        }
    }
    // The oldest allocation is named after the peak, then everything is freed.
    recs.push(Record::Annotate(Annotation {
        t_ns: t + 1,
        tid: 1,
        ptr: 0x10_0000,
        name: 1,
        dtype: 2,
        shape: vec![2, 3],
        op: false,
    }));
    for i in 0..n {
        recs.push(Record::Event(ev(
            t + 2 + i,
            Free,
            Device,
            "cuMemFree_v2",
            0x10_0000 + i,
            0,
        )));
    }
    let s = summarize(&trace_of(9, recs), SummaryOptions { top: 3, frames: 0 }).unwrap();
    let d = &s.processes[0].devices[0];
    assert_eq!(d.peak_bytes, n * 10 * MIB + MIB);
    assert_eq!(d.peak_live_count, n as usize + 1);
    assert_eq!(
        d.peak_live
            .iter()
            .map(|a| a.ptr.as_str())
            .collect::<Vec<_>>(),
        vec!["0x100000", "0x100001", "0x100002"]
    );
    assert_eq!(d.peak_live[0].tensor.as_deref(), Some("w f32[2, 3]"));
    assert_eq!(d.peak_live[1].tensor, None);
    // The last small allocation is never freed.
    assert_eq!(d.live_at_end, MIB);
    assert_eq!((d.allocations, d.frees), (2 * n, 2 * n - 1));
}

#[test]
fn operator_outputs_described_by_torch_shapes_do_not_block_matching() {
    // What `vramtrace run --torch-shapes` records with caching off: every driver allocation of
    // fla's GDN forward described by the operator that produced it (OP_OUTPUT records).
    use crate::attribution::{Moment, attribute};
    use crate::evidence::Evidence;
    use crate::observe::{At, observe};
    use vramtrace_models::{DType, GdnShape, gdn_fla_0_6_0};
    let tensors =
        gdn_fla_0_6_0::tensors(&GdnShape::new(&[4128], 48, 128, 128, DType::BF16)).unwrap();
    let mut recs = vec![
        Record::String {
            id: 2,
            text: "bfloat16".into(),
        },
        Record::String {
            id: 3,
            text: "float32".into(),
        },
    ];
    let mut t = 0;
    for (i, x) in tensors.iter().enumerate() {
        let ptr = 0x1000_0000 * (i as u64 + 1);
        // The operator fla's code calls for it, as the H200 run recorded (`zeros` for A,
        // `new_empty` for w and h, `new_zeros` for final_state).
        let op = 10 + i as u32;
        recs.push(Record::String {
            id: op,
            text: x.op.as_deref().unwrap().trim_start_matches("aten::").into(),
        });
        t += 10;
        recs.push(Record::Event(ev(
            t,
            EventKind::Alloc,
            MemKind::Device,
            "cuMemAlloc_v2",
            ptr,
            x.bytes,
        )));
        recs.push(Record::Annotate(Annotation {
            t_ns: t + 1,
            tid: 1,
            ptr,
            name: op,
            dtype: if x.dtype == DType::F32 { 3 } else { 2 },
            shape: x.shape.iter().map(|&d| d as i64).collect(),
            op: true,
        }));
    }
    let trace = trace_of(11, recs);
    let moment = observe(&trace, None, None, At::Peak).unwrap();
    assert!(
        moment
            .observed
            .iter()
            .all(|o| o.name.is_none() && o.op.is_some())
    );
    let a = attribute(&tensors, moment.observed, 1, Moment::Peak);
    let peak = vramtrace_models::peak(&tensors);
    for r in a.rows.iter().filter(|r| peak.live.contains(&r.tensor)) {
        assert!(r.observed.is_some(), "{} not matched: {r:?}", r.name);
        assert!(
            matches!(r.evidence, Some(Evidence::Shape { .. })),
            "{}: {:?}",
            r.name,
            r.evidence
        );
    }
    assert_eq!(a.named_only_bytes, 0);
    assert_eq!(a.evidence.size_only_bytes, 0);
    assert_eq!(a.evidence.evidence_bytes, a.attributed_bytes);
}

#[test]
fn operator_outputs_described_after_the_peak_still_describe_its_tensors() {
    // `--torch-shapes` describes an operator's outputs once it returns: after the allocation
    // that made the tensor peak (PyTorch's FlashAttention on the H200).
    use crate::observe::{At, observe};
    use vramtrace_format::{TensorAction, TensorEvent};
    let alloc = |t: u64, ptr: u64, size: u64| Record::Tensor(tensor_alloc(t, ptr, size));
    let free = |t: u64, ptr: u64| {
        Record::Tensor(TensorEvent {
            t_ns: t,
            tid: 1,
            device: 0,
            action: TensorAction::Free,
            ptr,
            ..TensorEvent::default()
        })
    };
    let op = |t: u64, ptr: u64, dtype: u32, shape: Vec<i64>| {
        Record::Annotate(Annotation {
            t_ns: t,
            tid: 1,
            ptr,
            name: 1,
            dtype,
            shape,
            op: true,
        })
    };
    let recs = vec![
        Record::String {
            id: 1,
            text: "_flash_attention_forward".into(),
        },
        Record::String {
            id: 2,
            text: "bfloat16".into(),
        },
        Record::String {
            id: 3,
            text: "float32".into(),
        },
        alloc(10, 0x1000, 50724864),
        alloc(11, 0x9000, 396288),
        op(12, 0x1000, 2, vec![4128, 24, 256]),
        op(13, 0x9000, 3, vec![24, 4128]),
        free(20, 0x9000),
        free(21, 0x1000),
    ];
    let m = observe(&trace_of(12, recs), None, None, At::Peak).unwrap();
    let ops: Vec<String> = m
        .observed
        .iter()
        .map(|o| o.op.as_ref().map(|x| x.describe()).unwrap_or_default())
        .collect();
    assert_eq!(
        ops,
        vec![
            "_flash_attention_forward [4128, 24, 256] bfloat16",
            "_flash_attention_forward [24, 4128] float32"
        ]
    );
}
