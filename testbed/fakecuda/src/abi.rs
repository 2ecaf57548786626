//! The C types and constants of the driver API that the stand-in reads or
//! writes, laid out as `cuda.h` lays them out on 64-bit Linux.

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_int, c_uint, c_void};

/// `CUdevice`: a device ordinal.
pub type CUdevice = c_int;
/// `CUdeviceptr`: a device address.
pub type CUdeviceptr = u64;
/// `CUcontext`, `CUstream`, `CUevent`, `CUmemoryPool`, `CUarray`, `CUmodule`, `CUfunction`: opaque handles.
pub type Handle = *mut c_void;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`: a shareable handle that is a file descriptor.
pub const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: u32 = 1;

/// `CUmemGenericAllocationHandle`: a physical allocation made by `cuMemCreate`.
pub type CUmemGenericAllocationHandle = u64;

/// `CUuuid`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUuuid {
    /// The 16 bytes of the UUID.
    pub bytes: [u8; 16],
}

/// `CUDA_ARRAY_DESCRIPTOR` (the `_v2` layout).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY_DESCRIPTOR {
    /// Width in elements.
    pub Width: usize,
    /// Height in elements; 0 for a 1D array.
    pub Height: usize,
    /// `CUarray_format`.
    pub Format: c_uint,
    /// Channels per element: 1, 2 or 4.
    pub NumChannels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (the `_v2` layout).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    /// Width in elements.
    pub Width: usize,
    /// Height in elements; 0 for a 1D array.
    pub Height: usize,
    /// Depth in elements (layers for layered arrays); 0 for 1D and 2D arrays.
    pub Depth: usize,
    /// `CUarray_format`.
    pub Format: c_uint,
    /// Channels per element: 1, 2 or 4.
    pub NumChannels: c_uint,
    /// `CUDA_ARRAY3D_*` flags.
    pub Flags: c_uint,
}

/// `CUctxCreateParams` (CUDA 12.5).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUctxCreateParams {
    /// `CUexecAffinityParam*`; ignored here.
    pub execAffinityParams: *mut c_void,
    /// Number of execution-affinity parameters.
    pub numExecAffinityParams: c_int,
    /// `CUctxCigParam*`: CUDA in graphics, which the stand-in does not support.
    pub cigParams: *mut c_void,
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemLocation {
    /// `CUmemLocationType`.
    pub type_: c_uint,
    /// Device ordinal when the type is `CU_MEM_LOCATION_TYPE_DEVICE`.
    pub id: c_int,
}

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    /// `CUmemAllocationType`.
    pub type_: c_uint,
    /// `CUmemAllocationHandleType` bits.
    pub requestedHandleTypes: c_uint,
    /// Where the memory lives.
    pub location: CUmemLocation,
    /// Windows security attributes; unused here.
    pub win32HandleMetaData: *mut c_void,
    /// compressionType, gpuDirectRDMACapable, usage, reserved.
    pub allocFlags: [u8; 8],
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAccessDesc {
    /// Who gets access.
    pub location: CUmemLocation,
    /// `CUmemAccess_flags`.
    pub flags: c_uint,
}

/// `CUmemPoolProps`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemPoolProps {
    /// `CUmemAllocationType`.
    pub allocType: c_uint,
    /// `CUmemAllocationHandleType` bits.
    pub handleTypes: c_uint,
    /// Where the pool's memory lives.
    pub location: CUmemLocation,
    /// Windows security attributes; unused here.
    pub win32SecurityAttributes: *mut c_void,
    /// Largest size the pool may reach; 0 for no limit.
    pub maxSize: usize,
    /// `CU_MEM_CREATE_USAGE_*` bits.
    pub usage: u16,
    /// Must be zero.
    pub reserved: [u8; 54],
}

/// `CU_MEM_ALLOCATION_TYPE_PINNED`: the only allocation type `cuMemCreate` and pools accept here.
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_uint = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_uint = 1;
/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`.
pub const CU_MEM_ALLOC_GRANULARITY_MINIMUM: c_uint = 0;
/// `CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`.
pub const CU_MEM_ALLOC_GRANULARITY_RECOMMENDED: c_uint = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`, the largest `CUmemAccess_flags` value.
pub const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: c_uint = 3;

/// `CU_MEM_ATTACH_GLOBAL`.
pub const CU_MEM_ATTACH_GLOBAL: c_uint = 1;
/// `CU_MEM_ATTACH_HOST`.
pub const CU_MEM_ATTACH_HOST: c_uint = 2;

/// `CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED`.
pub const CU_MEMHOSTALLOC_ALL: c_uint = 0x1 | 0x2 | 0x4;

/// `CU_STREAM_NON_BLOCKING`, the only `cuStreamCreate` flag.
pub const CU_STREAM_NON_BLOCKING: c_uint = 1;
/// `CU_STREAM_LEGACY`: the legacy default stream, as a handle.
pub const CU_STREAM_LEGACY: u64 = 1;
/// `CU_STREAM_PER_THREAD`: the calling thread's default stream, as a handle.
pub const CU_STREAM_PER_THREAD: u64 = 2;

/// `CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS`.
pub const CU_EVENT_ALL: c_uint = 0x1 | 0x2 | 0x4;
/// `CU_EVENT_DISABLE_TIMING`.
pub const CU_EVENT_DISABLE_TIMING: c_uint = 0x2;
/// `CU_EVENT_INTERPROCESS` (requires `CU_EVENT_DISABLE_TIMING`).
pub const CU_EVENT_INTERPROCESS: c_uint = 0x4;

/// Scheduling bits of `CUctx_flags`.
pub const CU_CTX_SCHED_MASK: c_uint = 0x07;
/// All defined `CUctx_flags` bits (scheduling, map-host, lmem-resize, coredump, sync-memops).
pub const CU_CTX_FLAGS_MASK: c_uint = 0xff;

/// `CUpointer_attribute` values the stand-in answers.
pub mod pointer_attribute {
    /// `CUcontext` of the allocation.
    pub const CONTEXT: u32 = 1;
    /// `CUmemorytype` as `unsigned int`.
    pub const MEMORY_TYPE: u32 = 2;
    /// `CUdeviceptr` for the pointer.
    pub const DEVICE_POINTER: u32 = 3;
    /// `void*` for host-accessible memory.
    pub const HOST_POINTER: u32 = 4;
    /// `unsigned long long` unique per allocation.
    pub const BUFFER_ID: u32 = 7;
    /// `bool`: managed memory.
    pub const IS_MANAGED: u32 = 8;
    /// `int` device ordinal.
    pub const DEVICE_ORDINAL: u32 = 9;
    /// `CUdeviceptr` start of the allocation or reservation.
    pub const RANGE_START_ADDR: u32 = 11;
    /// `size_t` size of the allocation or reservation.
    pub const RANGE_SIZE: u32 = 12;
    /// `bool`: backed by an allocation.
    pub const MAPPED: u32 = 13;
    /// `CUmemoryPool` a stream-ordered allocation came from.
    pub const MEMPOOL_HANDLE: u32 = 17;
}

/// `CUmemorytype` values.
pub mod memory_type {
    /// `CU_MEMORYTYPE_HOST`.
    pub const HOST: u32 = 1;
    /// `CU_MEMORYTYPE_DEVICE`.
    pub const DEVICE: u32 = 2;
}

/// `CUmemPool_attribute` values.
pub mod pool_attribute {
    /// `int`: `CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES`, the first of
    /// three `int` reuse policies (2 is `REUSE_ALLOW_OPPORTUNISTIC`).
    pub const REUSE_FOLLOW_EVENT_DEPENDENCIES: u32 = 1;
    /// `int`: `CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES`.
    pub const REUSE_ALLOW_INTERNAL_DEPENDENCIES: u32 = 3;
    /// `cuuint64_t`: `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`.
    pub const RELEASE_THRESHOLD: u32 = 4;
    /// `cuuint64_t`, read-only: `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`.
    pub const RESERVED_MEM_CURRENT: u32 = 5;
    /// `cuuint64_t`, settable to 0 only: `CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH`.
    pub const RESERVED_MEM_HIGH: u32 = 6;
    /// `cuuint64_t`, read-only: `CU_MEMPOOL_ATTR_USED_MEM_CURRENT`.
    pub const USED_MEM_CURRENT: u32 = 7;
    /// `cuuint64_t`, settable to 0 only: `CU_MEMPOOL_ATTR_USED_MEM_HIGH`.
    pub const USED_MEM_HIGH: u32 = 8;
}

/// Bytes per element of a `CUarray_format` with `channels` channels, or
/// `None` for formats the stand-in does not size (block-compressed and YUV).
/// The `*X1`/`*X2`/`*X4` formats carry their channel count in the format.
pub fn array_element_bytes(format: c_uint, channels: c_uint) -> Option<u64> {
    let channels = u64::from(channels);
    Some(match format {
        0x01 | 0x08 => channels,            // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2 * channels, // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4 * channels, // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        0xc0 | 0xc6 => 1,                   // UNORM_INT8X1, SNORM_INT8X1
        0xc1 | 0xc7 => 2,                   // UNORM_INT8X2, SNORM_INT8X2
        0xc2 | 0xc8 => 4,                   // UNORM_INT8X4, SNORM_INT8X4
        0xc3 | 0xc9 => 2,                   // UNORM_INT16X1, SNORM_INT16X1
        0xc4 | 0xca => 4,                   // UNORM_INT16X2, SNORM_INT16X2
        0xc5 | 0xcb => 8,                   // UNORM_INT16X4, SNORM_INT16X4
        0x50 => 4,                          // UNORM_INT_101010_2
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_cuda_h_on_64_bit_linux() {
        assert_eq!(size_of::<CUDA_ARRAY_DESCRIPTOR>(), 24);
        assert_eq!(offset_of!(CUDA_ARRAY_DESCRIPTOR, Format), 16);
        assert_eq!(size_of::<CUDA_ARRAY3D_DESCRIPTOR>(), 40);
        assert_eq!(offset_of!(CUDA_ARRAY3D_DESCRIPTOR, Flags), 32);
        assert_eq!(size_of::<CUmemAllocationProp>(), 32);
        assert_eq!(offset_of!(CUmemAllocationProp, location), 8);
        assert_eq!(offset_of!(CUmemAllocationProp, allocFlags), 24);
        assert_eq!(size_of::<CUmemAccessDesc>(), 12);
        assert_eq!(size_of::<CUmemPoolProps>(), 88);
        assert_eq!(offset_of!(CUmemPoolProps, maxSize), 24);
        assert_eq!(size_of::<CUuuid>(), 16);
    }

    #[test]
    fn element_sizes() {
        assert_eq!(array_element_bytes(0x20, 4), Some(16)); // float4
        assert_eq!(array_element_bytes(0x10, 1), Some(2)); // half
        assert_eq!(array_element_bytes(0x01, 2), Some(2)); // uchar2
        assert_eq!(array_element_bytes(0xc5, 4), Some(8));
        assert_eq!(array_element_bytes(0x91, 4), None); // BC1
    }
}
