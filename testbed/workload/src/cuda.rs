//! The CUDA driver backend (cudarc, dynamic loading): real kernels, or
//! `--simulate` with the same allocations and no kernels.
//!
//! Allocation is `cuMemAlloc_v2` / `cuMemFree_v2` (cudarc's `malloc_sync` /
//! `free_sync`), never cudarc's stream allocator, which would use
//! `cuMemAllocAsync` on devices with memory pools: the trace must show one
//! synchronous driver allocation per tensor. Copies and memsets are the
//! synchronous `cuMemcpyHtoD_v2` / `cuMemcpyDtoH_v2` / `cuMemsetD8_v2`, the
//! paths the stand-in driver implements. Kernels go to the legacy default
//! stream, so every synchronous call orders after them.

use std::cell::Cell;
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Once};

use cudarc::driver::sys::{CUdevice_attribute, CUresult};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaStream, DriverError, LaunchConfig as CuLaunchConfig,
    PushKernelArg, result,
};

use crate::backend::{AllocError, Arg, Backend, DevicePtr, Kernel, LaunchConfig};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels;

thread_local! {
    static IN_DRIVER_CALL: Cell<bool> = const { Cell::new(false) };
}

/// cudarc resolves each driver entry point on first use and panics when the
/// library lacks it (an old driver, or a stand-in that does not implement it).
/// Run driver calls through here so that becomes an ordinary error, and keep
/// the default panic message off the terminal while we do.
fn guarded<T>(what: &str, f: impl FnOnce() -> std::result::Result<T, DriverError>) -> Result<T> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !IN_DRIVER_CALL.with(|c| c.get()) {
                previous(info);
            }
        }));
    });
    IN_DRIVER_CALL.with(|c| c.set(true));
    let out = catch_unwind(AssertUnwindSafe(f));
    IN_DRIVER_CALL.with(|c| c.set(false));
    match out {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Error::Driver {
            call: what.into(),
            message: driver_message(e),
        }),
        Err(panic) => {
            let detail = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown reason".into());
            Err(Error::Driver {
                call: what.into(),
                message: format!(
                    "the CUDA driver library could not serve this call ({detail}); it is too \
                     old or a stand-in that lacks the entry point"
                ),
            })
        }
    }
}

/// The error's enum name (no driver call: `cuGetErrorString` may be missing).
fn driver_message(e: DriverError) -> String {
    format!("{:?} ({})", e.0, e.0 as i32)
}

/// Whether a driver library can be loaded at all.
pub fn driver_present() -> bool {
    // Safety: only tries to dlopen the candidate names (libcuda.so, libcuda.so.1, ...).
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether the loaded driver is vramtrace's stand-in (testbed/fakecuda), which
/// exports `vramtrace_fake_call_count` beside the driver API.
pub fn is_stand_in() -> bool {
    if !driver_present() {
        return false;
    }
    // Safety: `culib()` is the library cudarc resolves every driver call from
    // (present, checked above); looking a symbol up does not call it.
    unsafe {
        cudarc::driver::sys::culib()
            .get::<*const ()>(b"vramtrace_fake_call_count\0")
            .is_ok()
    }
}

/// A CUDA device reached through the driver API.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    functions: Option<HashMap<Kernel, CudaFunction>>,
    description: String,
}

impl CudaBackend {
    /// Open device `ordinal` for `--simulate`: driver calls only, no NVRTC,
    /// no module, launches are no-ops.
    pub fn simulate(ordinal: usize) -> Result<Self> {
        let (ctx, description) = open(ordinal)?;
        Ok(Self {
            stream: ctx.default_stream(),
            ctx,
            functions: None,
            description: format!("{description}, simulated (no kernels)"),
        })
    }

    /// Open device `ordinal` and compile the kernels for `dtype` with NVRTC
    /// for the device's compute capability.
    pub fn real(ordinal: usize, dtype: DType) -> Result<Self> {
        let (ctx, description) = open(ordinal)?;
        if is_stand_in() {
            // Also: NVRTC 13 probes a loaded libcuda.so.1 for cuGetExportTable,
            // which the stand-in lacks, and crashes if it is asked to compile.
            return Err(Error::StandInDriver);
        }
        if !kernels::nvrtc_present() {
            return Err(Error::NoNvrtc);
        }
        let major = guarded("cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)", || {
            ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        })?;
        let minor = guarded("cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)", || {
            ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        })?;
        let arch = format!("compute_{major}{minor}");
        let ptx = kernels::compile(dtype, Some(&arch))?;
        let module = guarded("cuModuleLoadData", || ctx.load_module(ptx))?;
        let mut functions = HashMap::new();
        for k in Kernel::ALL {
            let f = guarded(&format!("cuModuleGetFunction({})", k.symbol()), || {
                module.load_function(k.symbol())
            })?;
            functions.insert(k, f);
        }
        Ok(Self {
            stream: ctx.default_stream(),
            ctx,
            functions: Some(functions),
            description: format!("{description}, sm_{major}{minor}, kernels for {dtype}"),
        })
    }
}

/// Load the driver, check the device exists, make its primary context current.
fn open(ordinal: usize) -> Result<(Arc<CudaContext>, String)> {
    if !driver_present() {
        return Err(Error::NoDriver);
    }
    guarded("cuInit", result::init)?;
    let count = guarded("cuDeviceGetCount", result::device::get_count)?;
    if count <= ordinal as i32 {
        return Err(Error::NoDevice { count, ordinal });
    }
    let ctx = guarded("creating the CUDA context", || CudaContext::new(ordinal))?;
    let name = guarded("cuDeviceGetName", || ctx.name()).unwrap_or_else(|_| "unnamed".into());
    let total = guarded("cuDeviceTotalMem_v2", || ctx.total_mem()).ok();
    let description = match total {
        Some(t) => format!(
            "device {ordinal}: {name}, {}",
            vramtrace_models::units::ByteUnit::GiB.format(t as f64, 1)
        ),
        None => format!("device {ordinal}: {name}"),
    };
    Ok((ctx, description))
}

impl Backend for CudaBackend {
    fn alloc(&self, bytes: usize) -> std::result::Result<DevicePtr, AllocError> {
        let r = guarded("cuMemAlloc_v2", || {
            self.ctx.bind_to_thread()?;
            // Safety: a plain synchronous allocation in the current context;
            // the memory is uninitialised, which callers treat as torch.empty.
            unsafe { result::malloc_sync(bytes) }
        });
        r.map_err(|e| {
            let message = match &e {
                Error::Driver { message, .. } => message.clone(),
                other => other.to_string(),
            };
            AllocError {
                out_of_memory: message
                    .starts_with(&format!("{:?}", CUresult::CUDA_ERROR_OUT_OF_MEMORY)),
                message,
            }
        })
    }

    fn free(&self, ptr: DevicePtr) -> Result<()> {
        guarded("cuMemFree_v2", || {
            // Safety: `ptr` came from `malloc_sync` in this context and is
            // freed exactly once (DeviceTensor's Drop); the kernels using it
            // were launched on the legacy stream, which cuMemFree waits for.
            unsafe { result::free_sync(ptr) }
        })
    }

    fn memset_zero(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        guarded("cuMemsetD8_v2", || {
            // Safety: `ptr..ptr+bytes` is one live allocation of this context.
            unsafe { result::memset_d8_sync(ptr, 0, bytes) }
        })
    }

    fn upload(&self, ptr: DevicePtr, data: &[u8]) -> Result<()> {
        guarded("cuMemcpyHtoD_v2", || {
            // Safety: the destination is a live allocation of at least
            // `data.len()` bytes; the copy is synchronous.
            unsafe { result::memcpy_htod_sync(ptr, data) }
        })
    }

    fn download(&self, ptr: DevicePtr, out: &mut [u8]) -> Result<()> {
        guarded("cuMemcpyDtoH_v2", || {
            // Safety: the source is a live allocation of at least `out.len()`
            // bytes; the copy is synchronous and orders after the kernels.
            unsafe { result::memcpy_dtoh_sync(out, ptr) }
        })
    }

    fn copy_device(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        guarded("cuMemcpyDtoD_v2", || {
            // Safety: both ranges lie inside live allocations of this context
            // (Session::copy checks them against the tensors' sizes); the copy
            // is synchronous with respect to the host and orders after the
            // kernels on the legacy stream.
            unsafe { result::memcpy_dtod_sync(dst, src, bytes) }
        })
    }

    fn mem_info(&self) -> Option<(usize, usize)> {
        guarded("cuMemGetInfo_v2", || {
            self.ctx.bind_to_thread()?;
            result::mem_get_info()
        })
        .ok()
    }

    fn launch(&self, kernel: Kernel, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
        let Some(functions) = &self.functions else {
            return Ok(()); // --simulate: the allocations are the point.
        };
        let func = &functions[&kernel];
        guarded(&format!("cuLaunchKernel({})", kernel.symbol()), || {
            let mut b = self.stream.launch_builder(func);
            for a in args {
                match a {
                    Arg::Ptr(p) => b.arg(p),
                    Arg::I32(v) => b.arg(v),
                    Arg::I64(v) => b.arg(v),
                    Arg::F32(v) => b.arg(v),
                };
            }
            let cfg = CuLaunchConfig {
                grid_dim: cfg.grid,
                block_dim: cfg.block,
                shared_mem_bytes: 0,
            };
            // Safety: each kernel's argument list is built by the stage that
            // launches it, in the order and with the types of its C signature
            // in kernels.cu; every pointer is a live allocation of that stage.
            unsafe { b.launch(cfg) }.map(|_| ())
        })
    }

    fn synchronize(&self) -> Result<()> {
        if self.functions.is_none() {
            return Ok(()); // Nothing was launched.
        }
        guarded("cuCtxSynchronize", || self.ctx.synchronize())
    }

    fn executes_kernels(&self) -> bool {
        self.functions.is_some()
    }

    fn describe(&self) -> String {
        self.description.clone()
    }
}
