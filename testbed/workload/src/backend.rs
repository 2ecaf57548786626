//! What the workload needs from a device: synchronous allocation, copies and
//! kernel launches. The real run, the simulated run and the tests all drive the
//! same allocation code through this trait, so their sequences cannot drift.

use std::cell::RefCell;

use crate::error::Result;

/// A device pointer as the driver returns it (`CUdeviceptr`).
pub type DevicePtr = u64;

/// The kernels in `kernels.cu`, one per fla / FlashAttention stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// `fla/modules/norm/l2norm.py::l2norm_fwd`.
    L2Norm,
    /// `fla/ops/utils/cumsum.py::chunk_local_cumsum_scalar`.
    ChunkLocalCumsum,
    /// `fla/ops/gated_delta_rule/chunk_fwd.py::chunk_gated_delta_rule_fwd_kkt_solve_kernel`.
    KktSolve,
    /// `fla/ops/gated_delta_rule/wy_fast.py::recompute_w_u_fwd`.
    RecomputeWU,
    /// `fla/ops/common/chunk_delta_h.py::chunk_gated_delta_rule_fwd_h`.
    ChunkFwdH,
    /// `fla/ops/common/chunk_o.py::chunk_fwd_o`.
    ChunkFwdO,
    /// FlashAttention-2 `mha_varlen_fwd` (causal or not, GQA).
    FlashAttnVarlenFwd,
}

impl Kernel {
    /// Every kernel, in source order.
    pub const ALL: [Kernel; 7] = [
        Kernel::L2Norm,
        Kernel::ChunkLocalCumsum,
        Kernel::KktSolve,
        Kernel::RecomputeWU,
        Kernel::ChunkFwdH,
        Kernel::ChunkFwdO,
        Kernel::FlashAttnVarlenFwd,
    ];

    /// The `extern "C"` symbol in `kernels.cu`.
    pub fn symbol(self) -> &'static str {
        match self {
            Kernel::L2Norm => "vt_l2norm_fwd",
            Kernel::ChunkLocalCumsum => "vt_chunk_local_cumsum",
            Kernel::KktSolve => "vt_gdn_kkt_solve",
            Kernel::RecomputeWU => "vt_gdn_recompute_w_u",
            Kernel::ChunkFwdH => "vt_gdn_chunk_fwd_h",
            Kernel::ChunkFwdO => "vt_gdn_chunk_fwd_o",
            Kernel::FlashAttnVarlenFwd => "vt_flash_attn_varlen_fwd",
        }
    }
}

/// One kernel argument, passed by value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    /// A device pointer (0 for "absent").
    Ptr(DevicePtr),
    /// A 32-bit integer.
    I32(i32),
    /// A 64-bit integer.
    I64(i64),
    /// A 32-bit float.
    F32(f32),
}

/// Grid, block and dynamic shared memory of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub block: (u32, u32, u32),
}

/// A device the workload can run on.
///
/// All methods take `&self` so that [`crate::tensor::DeviceTensor`] can free
/// itself in `Drop` while other tensors are alive.
pub trait Backend {
    /// Allocate `bytes` with one synchronous driver allocation (`cuMemAlloc_v2`).
    fn alloc(&self, bytes: usize) -> std::result::Result<DevicePtr, AllocError>;
    /// Free a pointer returned by [`Backend::alloc`] (`cuMemFree_v2`).
    fn free(&self, ptr: DevicePtr) -> Result<()>;
    /// Zero `bytes` at `ptr` (what `torch.zeros` / `new_zeros` do).
    fn memset_zero(&self, ptr: DevicePtr, bytes: usize) -> Result<()>;
    /// Copy host bytes to the device.
    fn upload(&self, ptr: DevicePtr, data: &[u8]) -> Result<()>;
    /// Copy device bytes to the host.
    fn download(&self, ptr: DevicePtr, out: &mut [u8]) -> Result<()>;
    /// Copy `bytes` from `src` to `dst` on the device (`cuMemcpyDtoD_v2`).
    ///
    /// The default goes through the host, for backends whose memory is host
    /// memory anyway (the kernel emulator in the tests).
    fn copy_device(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        let mut buf = vec![0u8; bytes];
        self.download(src, &mut buf)?;
        self.upload(dst, &buf)
    }
    /// Free and total device memory (`cuMemGetInfo_v2`), when the device says.
    fn mem_info(&self) -> Option<(usize, usize)> {
        None
    }
    /// Launch a kernel (a no-op where [`Backend::executes_kernels`] is false).
    fn launch(&self, kernel: Kernel, cfg: LaunchConfig, args: &[Arg]) -> Result<()>;
    /// Wait for all launched work.
    fn synchronize(&self) -> Result<()>;
    /// Whether kernels really run (false for `--simulate` and the test recorder):
    /// callers skip generating and uploading input data when they do not.
    fn executes_kernels(&self) -> bool;
    /// A one-line description of the device, for the report.
    fn describe(&self) -> String;
}

/// Why an allocation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocError {
    /// The driver's error name and description.
    pub message: String,
    /// Whether it was `CUDA_ERROR_OUT_OF_MEMORY`.
    pub out_of_memory: bool,
}

/// What a [`RecordingBackend`] saw, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Recorded {
    /// An allocation of this many bytes returned this pointer.
    Alloc {
        /// The pointer handed out.
        ptr: DevicePtr,
        /// Bytes requested.
        bytes: usize,
    },
    /// A pointer was freed.
    Free {
        /// The pointer freed.
        ptr: DevicePtr,
    },
    /// A region was zeroed.
    Memset {
        /// Start of the region.
        ptr: DevicePtr,
        /// Its length.
        bytes: usize,
    },
    /// Device bytes were copied.
    Copy {
        /// Destination.
        dst: DevicePtr,
        /// Source.
        src: DevicePtr,
        /// Length.
        bytes: usize,
    },
    /// A kernel would have been launched.
    Launch {
        /// Which one.
        kernel: Kernel,
        /// With this configuration.
        cfg: LaunchConfig,
        /// And these arguments.
        args: Vec<Arg>,
    },
}

/// A bookkeeping-only device for tests: hands out fake pointers, records every
/// call, runs nothing. It can be given a capacity to fail allocations as an
/// out-of-memory driver would.
#[derive(Debug, Default)]
pub struct RecordingBackend {
    state: RefCell<RecorderState>,
    capacity: Option<usize>,
}

#[derive(Debug, Default)]
struct RecorderState {
    next: DevicePtr,
    live: Vec<(DevicePtr, usize)>,
    log: Vec<Recorded>,
}

impl RecordingBackend {
    /// An unlimited recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// A recorder whose allocations fail once the live bytes would exceed `capacity`.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            capacity: Some(capacity),
            ..Self::default()
        }
    }

    /// Everything recorded so far.
    pub fn log(&self) -> Vec<Recorded> {
        self.state.borrow().log.clone()
    }

    /// Bytes currently allocated.
    pub fn live_bytes(&self) -> usize {
        self.state.borrow().live.iter().map(|&(_, b)| b).sum()
    }
}

impl RecorderState {
    /// Whether `ptr..ptr + bytes` lies inside one live allocation.
    fn inside_live(&self, ptr: DevicePtr, bytes: usize) -> bool {
        self.live
            .iter()
            .any(|&(p, b)| ptr >= p && ptr + bytes as u64 <= p + b as u64)
    }
}

impl Backend for RecordingBackend {
    fn alloc(&self, bytes: usize) -> std::result::Result<DevicePtr, AllocError> {
        let mut s = self.state.borrow_mut();
        let live: usize = s.live.iter().map(|&(_, b)| b).sum();
        if let Some(cap) = self.capacity
            && live + bytes > cap
        {
            return Err(AllocError {
                message: "CUDA_ERROR_OUT_OF_MEMORY (recorder capacity exceeded)".into(),
                out_of_memory: true,
            });
        }
        // 512-byte aligned fake addresses far from zero, like a real heap.
        let ptr = 0x7f00_0000_0000 + s.next;
        s.next += (bytes as u64).div_ceil(512) * 512 + 512;
        s.live.push((ptr, bytes));
        s.log.push(Recorded::Alloc { ptr, bytes });
        Ok(ptr)
    }

    fn free(&self, ptr: DevicePtr) -> Result<()> {
        let mut s = self.state.borrow_mut();
        match s.live.iter().position(|&(p, _)| p == ptr) {
            Some(i) => {
                s.live.swap_remove(i);
                s.log.push(Recorded::Free { ptr });
                Ok(())
            }
            None => Err(crate::error::Error::Driver {
                call: "cuMemFree_v2".into(),
                message: format!("recorder: {ptr:#x} is not a live allocation"),
            }),
        }
    }

    fn memset_zero(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.state
            .borrow_mut()
            .log
            .push(Recorded::Memset { ptr, bytes });
        Ok(())
    }

    fn upload(&self, _ptr: DevicePtr, _data: &[u8]) -> Result<()> {
        Ok(())
    }

    fn download(&self, _ptr: DevicePtr, out: &mut [u8]) -> Result<()> {
        out.fill(0);
        Ok(())
    }

    fn copy_device(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        let mut s = self.state.borrow_mut();
        if !s.inside_live(dst, bytes) || !s.inside_live(src, bytes) {
            return Err(crate::error::Error::Driver {
                call: "cuMemcpyDtoD_v2".into(),
                message: format!(
                    "recorder: {bytes} bytes from {src:#x} to {dst:#x} leave a live allocation"
                ),
            });
        }
        s.log.push(Recorded::Copy { dst, src, bytes });
        Ok(())
    }

    fn mem_info(&self) -> Option<(usize, usize)> {
        let cap = self.capacity?;
        Some((cap.saturating_sub(self.live_bytes()), cap))
    }

    fn launch(&self, kernel: Kernel, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
        self.state.borrow_mut().log.push(Recorded::Launch {
            kernel,
            cfg,
            args: args.to_vec(),
        });
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn executes_kernels(&self) -> bool {
        false
    }

    fn describe(&self) -> String {
        "recording backend (no device)".into()
    }
}
