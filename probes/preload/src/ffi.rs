//! The slice of the CUDA driver ABI the hooks need: handle types, result codes, descriptor
//! layouts and the signatures of the functions we wrap or call. Written from the driver API's
//! documented C declarations; no NVIDIA header is included or copied.

use core::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

/// `CUresult`: 0 is success, anything else an error code.
pub type CuResult = c_int;
/// `CUdeviceptr`: a device address (64-bit on every platform we support).
pub type CuDevicePtr = u64;
/// `CUdevice`: in practice the device ordinal.
pub type CuDevice = c_int;
/// `CUstream`, `CUmemoryPool`, `CUarray`: opaque handles.
pub type CuHandle = *mut c_void;
/// `CUmemGenericAllocationHandle`.
pub type CuMemHandle = c_ulonglong;

/// `CUDA_SUCCESS`.
pub const CUDA_SUCCESS: CuResult = 0;
/// `CUDA_ERROR_NOT_INITIALIZED`: what a plain export answers when no driver can be found at all
/// (the only case in which the preload cannot pass a call through).
pub const CUDA_ERROR_NOT_INITIALIZED: CuResult = 3;

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`: `cuGetProcAddress` returns the `_ptsz` twin.
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// `CU_MEM_LOCATION_TYPE_DEVICE`: `CUmemLocation.id` is a device ordinal.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;

/// `CUmemAllocationProp` up to the fields we read (`type`, `requestedHandleTypes`, `location`).
/// The driver's struct continues after these; we only ever read through a pointer to it.
#[repr(C)]
pub struct CuMemAllocationPropPrefix {
    pub alloc_type: c_int,
    pub requested_handle_types: c_int,
    pub location_type: c_int,
    pub location_id: c_int,
}

/// `CUDA_ARRAY_DESCRIPTOR` (`cuArrayCreate_v2`).
#[repr(C)]
pub struct CuArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: c_int,
    pub num_channels: c_uint,
}

impl CuArrayDescriptor {
    /// Estimated device bytes: width × height × channels × channel bytes (the driver's padding
    /// and tiling are not visible).
    pub fn bytes(&self) -> u64 {
        array_bytes(self.width, self.height, 1, self.num_channels, self.format)
    }
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (`cuArray3DCreate_v2`).
#[repr(C)]
pub struct CuArray3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_int,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

impl CuArray3dDescriptor {
    /// Estimated device bytes, as [`CuArrayDescriptor::bytes`] times depth (or layers).
    pub fn bytes(&self) -> u64 {
        array_bytes(
            self.width,
            self.height,
            self.depth,
            self.num_channels,
            self.format,
        )
    }
}

/// Elements × channels × channel bytes; a zero height or depth counts as 1 (1D and 2D arrays).
fn array_bytes(width: usize, height: usize, depth: usize, channels: c_uint, format: c_int) -> u64 {
    (width as u64)
        .saturating_mul(height.max(1) as u64)
        .saturating_mul(depth.max(1) as u64)
        .saturating_mul(channels as u64)
        .saturating_mul(array_format_bytes(format))
}

/// Bytes of one channel of a `CUarray_format`. Formats outside the classic integer/float set
/// (block-compressed, video, normalised packed) are estimated at 4 bytes a channel: array sizes
/// are an estimate of device bytes anyway (the driver pads and tiles as it likes).
pub fn array_format_bytes(format: c_int) -> u64 {
    match format {
        0x01 | 0x08 => 1,        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        _ => 4,
    }
}

// Signatures of the driver functions we wrap.
pub type FnMemAlloc = unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult;
pub type FnMemAllocPitch =
    unsafe extern "C" fn(*mut CuDevicePtr, *mut usize, usize, usize, c_uint) -> CuResult;
pub type FnMemAllocManaged = unsafe extern "C" fn(*mut CuDevicePtr, usize, c_uint) -> CuResult;
pub type FnMemAllocAsync = unsafe extern "C" fn(*mut CuDevicePtr, usize, CuHandle) -> CuResult;
pub type FnMemAllocFromPoolAsync =
    unsafe extern "C" fn(*mut CuDevicePtr, usize, CuHandle, CuHandle) -> CuResult;
pub type FnMemFree = unsafe extern "C" fn(CuDevicePtr) -> CuResult;
pub type FnMemFreeAsync = unsafe extern "C" fn(CuDevicePtr, CuHandle) -> CuResult;
pub type FnMemCreate = unsafe extern "C" fn(
    *mut CuMemHandle,
    usize,
    *const CuMemAllocationPropPrefix,
    c_ulonglong,
) -> CuResult;
pub type FnMemRelease = unsafe extern "C" fn(CuMemHandle) -> CuResult;
pub type FnMemMap =
    unsafe extern "C" fn(CuDevicePtr, usize, usize, CuMemHandle, c_ulonglong) -> CuResult;
pub type FnMemUnmap = unsafe extern "C" fn(CuDevicePtr, usize) -> CuResult;
pub type FnMemAddressReserve =
    unsafe extern "C" fn(*mut CuDevicePtr, usize, usize, CuDevicePtr, c_ulonglong) -> CuResult;
pub type FnMemAddressFree = unsafe extern "C" fn(CuDevicePtr, usize) -> CuResult;
pub type FnMemAllocHost = unsafe extern "C" fn(*mut *mut c_void, usize) -> CuResult;
pub type FnMemHostAlloc = unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CuResult;
pub type FnMemFreeHost = unsafe extern "C" fn(*mut c_void) -> CuResult;
pub type FnArrayCreate = unsafe extern "C" fn(*mut CuHandle, *const CuArrayDescriptor) -> CuResult;
pub type FnArray3dCreate =
    unsafe extern "C" fn(*mut CuHandle, *const CuArray3dDescriptor) -> CuResult;
pub type FnArrayDestroy = unsafe extern "C" fn(CuHandle) -> CuResult;
pub type FnMemImportFromShareableHandle =
    unsafe extern "C" fn(*mut CuMemHandle, *mut c_void, c_uint) -> CuResult;
pub type FnMemRetainAllocationHandle =
    unsafe extern "C" fn(*mut CuMemHandle, *mut c_void) -> CuResult;
pub type FnGetProcAddress =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CuResult;
pub type FnGetProcAddressV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CuResult;

// Signatures of the driver functions the recorder calls for itself.
pub type FnCtxGetDevice = unsafe extern "C" fn(*mut CuDevice) -> CuResult;
pub type FnMemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> CuResult;
pub type FnDeviceGetName = unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult;
pub type FnDeviceTotalMem = unsafe extern "C" fn(*mut usize, CuDevice) -> CuResult;
pub type FnDriverGetVersion = unsafe extern "C" fn(*mut c_int) -> CuResult;
