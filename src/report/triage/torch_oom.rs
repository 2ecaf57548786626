//! PyTorch's out-of-memory message, rebuilt from a trace: its sizes as the message prints them
//! ([`torch_format_size`]), the segment its caching allocator asks for to serve a request
//! ([`torch_segment_size`]), and the message itself ([`pytorch_message`]).

use crate::report::{FailureReport, Report};
use crate::torch_replay::TorchOom;

/// PyTorch's `format_size` (c10/cuda/CUDACachingAllocator.cpp): bytes, KiB, MiB or GiB with two
/// decimals.
pub fn torch_format_size(b: u64) -> String {
    const K: f64 = 1024.0;
    let f = b as f64;
    if b <= 1024 {
        format!("{b} bytes")
    } else if f <= K * K {
        format!("{:.2} KiB", f / K)
    } else if f <= K * K * K {
        format!("{:.2} MiB", f / (K * K))
    } else {
        format!("{:.2} GiB", f / (K * K * K))
    }
}

/// The segment size PyTorch's caching allocator asks for to serve `size` bytes
/// (`get_allocation_size`: 2 MiB for small requests, 20 MiB up to 10 MiB, else rounded to
/// 2 MiB; docs/architecture.md).
pub fn torch_segment_size(size: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    if size <= MIB {
        2 * MIB
    } else if size < 10 * MIB {
        20 * MIB
    } else {
        size.div_ceil(2 * MIB) * 2 * MIB
    }
}

/// PyTorch's message as its allocator wrote it (torch 2.x, `CUDACachingAllocator.cpp`'s
/// `malloc`): "this process has" is NVML's figure for the process, here total − free − the
/// other traced processes (the trace has no NVML reading); private pools are not told apart.
pub fn pytorch_message(device: i32, t: &TorchOom, total: u64, process_in_use: u64) -> String {
    let allowed = if t.limit > 0 {
        format!("{} allowed; ", torch_format_size(t.limit))
    } else {
        String::new()
    };
    format!(
        "CUDA out of memory. Tried to allocate {}. GPU {device} has a total capacity of {} of which {} is free. Including non-PyTorch memory, this process has {} memory in use. {allowed}Of the allocated memory {} is allocated by PyTorch, and {} is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
        torch_format_size(t.requested),
        torch_format_size(total),
        torch_format_size(t.free),
        torch_format_size(process_in_use),
        torch_format_size(t.allocated),
        torch_format_size(t.reserved.saturating_sub(t.allocated)),
    )
}

/// PyTorch's message for the failure `f` when PyTorch refused it, on a device of `total` bytes:
/// "this process has" is what the device held less what was free and the other traced
/// processes' bytes.
pub(super) fn message_at(report: &Report, f: &FailureReport, total: u64) -> Option<String> {
    let tl = f.failure.torch.as_ref()?;
    let others: u64 = f
        .traced_by_process
        .iter()
        .filter(|(pid, _)| *pid != report.summary.processes[f.process].pid)
        .map(|(_, b)| *b)
        .sum();
    let in_use = total.saturating_sub(tl.free).saturating_sub(others);
    Some(pytorch_message(f.device, tl, total, in_use))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pytorch_sizes_as_its_message_prints_them() {
        assert_eq!(torch_format_size(512), "512 bytes");
        assert_eq!(torch_format_size(1_319_108_608), "1.23 GiB");
        assert_eq!(torch_format_size(3_149_126_656), "2.93 GiB");
        assert_eq!(torch_format_size(25_769_803_776), "24.00 GiB");
        assert_eq!(torch_segment_size(1_319_108_608), 1_319_108_608);
        assert_eq!(torch_segment_size(5 << 20), 20 << 20);
        assert_eq!(torch_segment_size(100), 2 << 20);
    }
}
