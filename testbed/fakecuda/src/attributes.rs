//! `cuDeviceGetAttribute` answers: a Hopper-class (sm_90) data-centre GPU,
//! close enough to an H100/H200 for clients that size launches or pick code
//! paths by attribute.

/// `CU_DEVICE_ATTRIBUTE_MAX` in CUDA 13.0: attributes at or above it are invalid.
pub(crate) const ATTRIBUTE_MAX: u32 = 148;

/// `CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED`: cudarc allocates with
/// `cuMemAllocAsync` when this is non-zero.
pub(crate) const MEMORY_POOLS_SUPPORTED: u32 = 115;

/// Attribute → value. Attributes not listed (texture and surface limits,
/// Windows and graphics interop, ...) read as 0.
const VALUES: &[(u32, i32)] = &[
    (1, 1024),        // MAX_THREADS_PER_BLOCK
    (2, 1024),        // MAX_BLOCK_DIM_X
    (3, 1024),        // MAX_BLOCK_DIM_Y
    (4, 64),          // MAX_BLOCK_DIM_Z
    (5, i32::MAX),    // MAX_GRID_DIM_X
    (6, 65535),       // MAX_GRID_DIM_Y
    (7, 65535),       // MAX_GRID_DIM_Z
    (8, 49152),       // MAX_SHARED_MEMORY_PER_BLOCK
    (9, 65536),       // TOTAL_CONSTANT_MEMORY
    (10, 32),         // WARP_SIZE
    (11, i32::MAX),   // MAX_PITCH
    (12, 65536),      // MAX_REGISTERS_PER_BLOCK
    (13, 1_980_000),  // CLOCK_RATE (kHz)
    (14, 512),        // TEXTURE_ALIGNMENT
    (15, 1),          // GPU_OVERLAP
    (16, 132),        // MULTIPROCESSOR_COUNT
    (19, 1),          // CAN_MAP_HOST_MEMORY
    (30, 512),        // SURFACE_ALIGNMENT
    (31, 1),          // CONCURRENT_KERNELS
    (32, 1),          // ECC_ENABLED
    (36, 2_619_000),  // MEMORY_CLOCK_RATE (kHz)
    (37, 5120),       // GLOBAL_MEMORY_BUS_WIDTH
    (38, 50 << 20),   // L2_CACHE_SIZE
    (39, 2048),       // MAX_THREADS_PER_MULTIPROCESSOR
    (40, 3),          // ASYNC_ENGINE_COUNT
    (41, 1),          // UNIFIED_ADDRESSING
    (51, 32),         // TEXTURE_PITCH_ALIGNMENT
    (75, 9),          // COMPUTE_CAPABILITY_MAJOR
    (76, 0),          // COMPUTE_CAPABILITY_MINOR
    (78, 1),          // STREAM_PRIORITIES_SUPPORTED
    (79, 1),          // GLOBAL_L1_CACHE_SUPPORTED
    (80, 1),          // LOCAL_L1_CACHE_SUPPORTED
    (81, 233_472),    // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
    (82, 65536),      // MAX_REGISTERS_PER_MULTIPROCESSOR
    (83, 1),          // MANAGED_MEMORY
    (87, 2),          // SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO
    (89, 1),          // CONCURRENT_MANAGED_ACCESS
    (90, 1),          // COMPUTE_PREEMPTION_SUPPORTED
    (91, 1),          // CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
    (92, 1),          // CAN_USE_STREAM_MEM_OPS
    (95, 1),          // COOPERATIVE_LAUNCH
    (97, 232_448),    // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    (98, 1),          // CAN_FLUSH_REMOTE_WRITES
    (99, 1),          // HOST_REGISTER_SUPPORTED
    (102, 1),         // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
    (103, 1),         // HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
    (106, 32),        // MAX_BLOCKS_PER_MULTIPROCESSOR
    (107, 1),         // GENERIC_COMPRESSION_SUPPORTED
    (108, 32 << 20),  // MAX_PERSISTING_L2_CACHE_SIZE
    (109, 128 << 20), // MAX_ACCESS_POLICY_WINDOW_SIZE
    (110, 1),         // GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
    (111, 1024),      // RESERVED_SHARED_MEMORY_PER_BLOCK
    (112, 1),         // SPARSE_CUDA_ARRAY_SUPPORTED
    (113, 1),         // READ_ONLY_HOST_REGISTER_SUPPORTED
    (114, 1),         // TIMELINE_SEMAPHORE_INTEROP_SUPPORTED
    (MEMORY_POOLS_SUPPORTED, 1),
    (116, 1),  // GPU_DIRECT_RDMA_SUPPORTED
    (119, 1),  // MEMPOOL_SUPPORTED_HANDLE_TYPES (POSIX file descriptor)
    (120, 1),  // CLUSTER_LAUNCH
    (121, 1),  // DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED
    (122, 1),  // CAN_USE_64_BIT_STREAM_MEM_OPS
    (124, 1),  // DMA_BUF_SUPPORTED
    (125, 1),  // IPC_EVENT_SUPPORTED
    (126, 4),  // MEM_SYNC_DOMAIN_COUNT
    (127, 1),  // TENSOR_MAP_ACCESS_SUPPORTED
    (129, 1),  // UNIFIED_FUNCTION_POINTERS
    (131, -1), // NUMA_ID
    (132, 1),  // MULTICAST_SUPPORTED
    (134, -1), // HOST_NUMA_ID
];

/// The value of `attribute` for device `ordinal`, or `None` when the attribute
/// number is not a CUDA 13.0 attribute.
pub(crate) fn value(attribute: u32, ordinal: usize) -> Option<i32> {
    match attribute {
        0 => None,
        a if a >= ATTRIBUTE_MAX => None,
        33 => Some(0x18 + ordinal as i32), // PCI_BUS_ID: one bus per device
        _ => Some(VALUES.iter().find(|v| v.0 == attribute).map_or(0, |v| v.1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_attributes_clients_ask_for() {
        assert_eq!(value(75, 0), Some(9));
        assert_eq!(value(76, 0), Some(0));
        assert_eq!(value(MEMORY_POOLS_SUPPORTED, 0), Some(1));
        assert_eq!(value(10, 0), Some(32));
        assert_eq!(value(1, 0), Some(1024));
        assert_eq!(value(16, 3), Some(132));
        assert_eq!(value(33, 1), Some(0x19));
        assert_eq!(value(104, 0), Some(0)); // Windows handles: unsupported
        assert_eq!(value(0, 0), None);
        assert_eq!(value(ATTRIBUTE_MAX, 0), None);
    }

    #[test]
    fn no_attribute_listed_twice() {
        for (i, v) in VALUES.iter().enumerate() {
            assert!(
                VALUES[i + 1..].iter().all(|o| o.0 != v.0),
                "attribute {} twice",
                v.0
            );
            assert!(v.0 > 0 && v.0 < ATTRIBUTE_MAX);
        }
    }
}
