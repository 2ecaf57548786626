//! Bookkeeping tests: exact sizes, capacity, error codes, lifetimes.

use super::*;
use crate::abi::pointer_attribute as attr;
use crate::config::DeviceConfig;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn driver(capacities: &[u64]) -> Driver {
    Driver::new(&Config {
        devices: capacities
            .iter()
            .map(|&capacity| DeviceConfig {
                name: "test GPU".into(),
                capacity,
            })
            .collect(),
    })
}

/// A driver with one device of `capacity` and a thread stack holding its primary context.
fn with_context(capacity: u64) -> (Driver, ContextStack) {
    let mut d = driver(&[capacity]);
    let mut stack = Vec::new();
    let primary = d.primary_retain(0).unwrap();
    d.set_current(&mut stack, primary).unwrap();
    (d, stack)
}

fn prop(device: i32) -> CUmemAllocationProp {
    CUmemAllocationProp {
        type_: abi::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: 0,
        location: CUmemLocation {
            type_: abi::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: [0; 8],
    }
}

#[test]
fn allocations_charge_exactly_what_was_asked() {
    let (mut d, stack) = with_context(GIB);
    let a = d.mem_alloc(&stack, 1000).unwrap();
    let b = d.mem_alloc(&stack, 3 * MIB + 7).unwrap();
    assert_eq!(d.mem_get_info(&stack), Ok((GIB - 1000 - 3 * MIB - 7, GIB)));
    assert_eq!(d.allocation(a).unwrap().size, 1000);
    assert_eq!(d.allocation(b).unwrap().kind, AllocationKind::Linear);
    d.mem_free(a).unwrap();
    assert_eq!(d.mem_get_info(&stack), Ok((GIB - 3 * MIB - 7, GIB)));
    d.mem_free(b).unwrap();
    assert_eq!(d.mem_get_info(&stack), Ok((GIB, GIB)));
}

#[test]
fn out_of_memory_exactly_at_capacity_and_nothing_changes() {
    let (mut d, stack) = with_context(GIB);
    let half = d.mem_alloc(&stack, GIB / 2).unwrap();
    assert_eq!(
        d.mem_alloc(&stack, GIB / 2 + 1),
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    );
    assert_eq!(d.mem_get_info(&stack), Ok((GIB / 2, GIB)));
    let rest = d.mem_alloc(&stack, GIB / 2).unwrap();
    assert_eq!(d.mem_get_info(&stack), Ok((0, GIB)));
    assert_eq!(d.mem_alloc(&stack, 1), Err(CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(
        d.mem_alloc_async(&stack, 1, 0),
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    );
    assert_eq!(
        d.mem_create(GRANULARITY, &prop(0), 0),
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    );
    d.mem_free(half).unwrap();
    d.mem_free(rest).unwrap();
    assert_eq!(d.used(0), 0);
}

#[test]
fn addresses_are_aligned_distinct_and_in_the_device_range() {
    let (mut d, stack) = with_context(GIB);
    let mut live = Vec::new();
    for size in [1, 511, 512, 513, 4096, 12345] {
        live.push(d.mem_alloc(&stack, size).unwrap());
    }
    // Churn: freed addresses may come back, live ones never.
    for round in 0..1000u64 {
        let p = d.mem_alloc(&stack, 1 + round * 7).unwrap();
        assert!(!live.contains(&p));
        d.mem_free(p).unwrap();
    }
    for (i, &p) in live.iter().enumerate() {
        assert_eq!(p % 512, 0);
        assert!((0x1000_0000_0000..0x1800_0000_0000).contains(&p), "{p:#x}");
        assert!(live[i + 1..].iter().all(|&q| q != p));
    }
}

#[test]
fn bad_frees_are_invalid_values() {
    let (mut d, stack) = with_context(GIB);
    let p = d.mem_alloc(&stack, 4096).unwrap();
    assert_eq!(d.mem_free(p + 512), Err(CUDA_ERROR_INVALID_VALUE));
    assert_eq!(d.mem_free(0xdead_0000), Err(CUDA_ERROR_INVALID_VALUE));
    assert_eq!(d.mem_free(p), Ok(()));
    assert_eq!(d.mem_free(p), Err(CUDA_ERROR_INVALID_VALUE));
    assert_eq!(d.mem_free_async(p, 0), Err(CUDA_ERROR_INVALID_VALUE));
    assert_eq!(d.mem_free(0), Ok(()));
    assert_eq!(d.mem_alloc(&stack, 0), Err(CUDA_ERROR_INVALID_VALUE));
    // The stream-ordered allocator hands out address 0 for zero bytes.
    assert_eq!(d.mem_alloc_async(&stack, 0, 0), Ok(0));
    assert_eq!(d.mem_free_async(0, 0), Ok(()));
    assert_eq!(
        d.mem_alloc_async(&stack, 0, 0xbad0),
        Err(CUDA_ERROR_INVALID_HANDLE)
    );
}

#[test]
fn memory_calls_need_a_current_context() {
    let mut d = driver(&[GIB]);
    let mut stack = Vec::new();
    assert_eq!(d.mem_alloc(&stack, 1), Err(CUDA_ERROR_INVALID_CONTEXT));
    assert_eq!(d.mem_get_info(&stack), Err(CUDA_ERROR_INVALID_CONTEXT));
    assert_eq!(d.stream_create(&stack, 0), Err(CUDA_ERROR_INVALID_CONTEXT));
    // Retained then fully released: current on the stack, but no longer valid.
    let primary = d.primary_retain(0).unwrap();
    d.set_current(&mut stack, primary).unwrap();
    d.primary_release(0).unwrap();
    assert_eq!(d.mem_alloc(&stack, 1), Err(CUDA_ERROR_INVALID_CONTEXT));
    assert_eq!(d.primary_release(0), Err(CUDA_ERROR_INVALID_CONTEXT));
}

#[test]
fn pitch_rows_round_up_to_512_bytes() {
    let (mut d, stack) = with_context(GIB);
    let (p, pitch) = d.mem_alloc_pitch(&stack, 1000, 10, 4).unwrap();
    assert_eq!(pitch, 1024);
    assert_eq!(d.allocation(p).unwrap().size, 10240);
    assert_eq!(d.used(0), 10240);
    let (_, pitch) = d.mem_alloc_pitch(&stack, 1024, 1, 16).unwrap();
    assert_eq!(pitch, 1024);
    assert_eq!(
        d.mem_alloc_pitch(&stack, 1000, 10, 3),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
    assert_eq!(
        d.mem_alloc_pitch(&stack, 0, 10, 4),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
}

#[test]
fn managed_memory_counts_against_the_current_device() {
    let (mut d, stack) = with_context(GIB);
    let p = d
        .mem_alloc_managed(&stack, 5 * MIB, abi::CU_MEM_ATTACH_GLOBAL)
        .unwrap();
    assert_eq!(d.used(0), 5 * MIB);
    assert_eq!(
        d.pointer_attribute(p, attr::IS_MANAGED),
        Ok(PointerValue::Bool(true))
    );
    assert_eq!(
        d.mem_alloc_managed(&stack, 1, 4),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
    d.mem_free(p).unwrap();
    assert_eq!(d.used(0), 0);
}

#[test]
fn stream_ordered_allocations_use_the_pool() {
    let (mut d, stack) = with_context(GIB);
    let stream = d
        .stream_create(&stack, abi::CU_STREAM_NON_BLOCKING)
        .unwrap();
    let pool = d.current_pool(0).unwrap();
    assert_eq!(pool, d.default_pool(0).unwrap());
    let a = d.mem_alloc_async(&stack, 100 * MIB, stream).unwrap();
    let b = d
        .mem_alloc_async(&stack, 50 * MIB, abi::CU_STREAM_PER_THREAD)
        .unwrap();
    assert_eq!(d.used(0), 150 * MIB);
    assert_eq!(
        d.pointer_attribute(a, attr::MEMPOOL_HANDLE),
        Ok(PointerValue::Address(pool))
    );
    d.mem_free_async(a, stream).unwrap();
    // A stream-ordered allocation may also be freed synchronously.
    d.mem_free(b).unwrap();
    assert_eq!(d.used(0), 0);
    use abi::pool_attribute as pa;
    assert_eq!(
        d.pool_attribute(pool, pa::USED_MEM_HIGH),
        Ok(PoolValue::U64(150 * MIB))
    );
    assert_eq!(
        d.pool_attribute(pool, pa::USED_MEM_CURRENT),
        Ok(PoolValue::U64(0))
    );
    d.set_pool_attribute(pool, pa::USED_MEM_HIGH, PoolValue::U64(0))
        .unwrap();
    assert_eq!(
        d.pool_attribute(pool, pa::USED_MEM_HIGH),
        Ok(PoolValue::U64(0))
    );
    assert_eq!(
        d.set_pool_attribute(pool, pa::USED_MEM_HIGH, PoolValue::U64(5)),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
    assert_eq!(
        d.set_pool_attribute(pool, pa::USED_MEM_CURRENT, PoolValue::U64(0)),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
    d.set_pool_attribute(pool, pa::RELEASE_THRESHOLD, PoolValue::U64(u64::MAX))
        .unwrap();
    assert_eq!(
        d.pool_attribute(pool, pa::RELEASE_THRESHOLD),
        Ok(PoolValue::U64(u64::MAX))
    );
    assert_eq!(d.pool_trim(pool), Ok(()));
    // A destroyed stream is rejected.
    d.stream_destroy(stream).unwrap();
    assert_eq!(
        d.mem_alloc_async(&stack, 1, stream),
        Err(CUDA_ERROR_INVALID_HANDLE)
    );
    assert_eq!(d.stream_destroy(stream), Err(CUDA_ERROR_INVALID_HANDLE));
}

#[test]
fn explicit_pools() {
    let (mut d, stack) = with_context(GIB);
    let props = CUmemPoolProps {
        allocType: abi::CU_MEM_ALLOCATION_TYPE_PINNED,
        handleTypes: 0,
        location: CUmemLocation {
            type_: abi::CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        },
        win32SecurityAttributes: std::ptr::null_mut(),
        maxSize: 0,
        usage: 0,
        reserved: [0; 54],
    };
    let pool = d.pool_create(&props).unwrap();
    let p = d.mem_alloc_from_pool(&stack, 3 * MIB, pool, 0).unwrap();
    assert_eq!(d.used(0), 3 * MIB);
    d.set_current_pool(0, pool).unwrap();
    let q = d.mem_alloc_async(&stack, MIB, 0).unwrap();
    assert_eq!(
        d.pool_attribute(pool, abi::pool_attribute::USED_MEM_CURRENT),
        Ok(PoolValue::U64(4 * MIB))
    );
    d.mem_free(p).unwrap();
    d.mem_free(q).unwrap();
    d.pool_destroy(pool).unwrap();
    assert_eq!(d.current_pool(0), d.default_pool(0));
    assert_eq!(
        d.pool_destroy(d.default_pool(0).unwrap()),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
    assert_eq!(
        d.mem_alloc_from_pool(&stack, 1, pool, 0),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
}

#[test]
fn vmm_reserve_create_map_unmap_release() {
    let (mut d, stack) = with_context(GIB);
    let g = GRANULARITY;
    assert_eq!(
        d.granularity(&prop(0), abi::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
        Ok(g)
    );

    // Address space is free of charge.
    let va = d.address_reserve(&stack, 64 * g, 0, 0, 0).unwrap();
    assert_eq!(va % g, 0);
    assert_eq!(d.used(0), 0);

    // Physical memory counts at creation, once, however it is mapped.
    assert_eq!(
        d.mem_create(g + 1, &prop(0), 0),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
    assert_eq!(d.mem_create(g, &prop(3), 0), Err(CUDA_ERROR_INVALID_DEVICE));
    let h1 = d.mem_create(10 * g, &prop(0), 0).unwrap();
    let h2 = d.mem_create(10 * g, &prop(0), 0).unwrap();
    assert_eq!(d.used(0), 20 * g);
    d.mem_map(va, 10 * g, 0, h1, 0).unwrap();
    d.mem_map(va + 10 * g, 10 * g, 0, h2, 0).unwrap();
    assert_eq!(d.used(0), 20 * g);
    assert_eq!(d.mem_get_info(&stack), Ok((GIB - 20 * g, GIB)));

    // Refused maps: overlapping, outside the reservation, past the handle, misaligned.
    assert_eq!(
        d.mem_map(va + 5 * g, g, 0, h1, 0),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
    assert_eq!(
        d.mem_map(va + 60 * g, 8 * g, 0, h1, 0),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
    assert_eq!(
        d.mem_map(va + 40 * g, 2 * g, 9 * g, h1, 0),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
    assert_eq!(
        d.mem_map(va + 40 * g + 4096, g, 0, h1, 0),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
    assert_eq!(
        d.mem_map(0x1234_0000_0000, g, 0, h1, 0),
        Err(CUDA_ERROR_INVALID_VALUE)
    );

    // Mapped memory is device memory for copies, across adjacent mappings too.
    assert_eq!(d.check_device_range(va + 9 * g, 2 * g), Ok(()));
    assert_eq!(
        d.check_device_range(va + 19 * g, 2 * g),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
    assert_eq!(
        d.pointer_attribute(va + 12 * g, attr::DEVICE_ORDINAL),
        Ok(PointerValue::I32(0))
    );
    assert_eq!(
        d.pointer_attribute(va + 12 * g, attr::RANGE_START_ADDR),
        Ok(PointerValue::Address(va))
    );
    assert_eq!(
        d.pointer_attribute(va + 30 * g, attr::MAPPED),
        Ok(PointerValue::Bool(false))
    );
    let access = CUmemAccessDesc {
        location: CUmemLocation {
            type_: abi::CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        },
        flags: abi::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    assert_eq!(d.set_access(va, 20 * g, &[access]), Ok(()));
    assert_eq!(
        d.set_access(va, 21 * g, &[access]),
        Err(CUDA_ERROR_INVALID_VALUE)
    );

    // Released while mapped: the memory stays until the last unmap.
    d.mem_release(h1).unwrap();
    assert_eq!(d.mem_release(h1), Err(CUDA_ERROR_INVALID_VALUE));
    assert_eq!(d.used(0), 20 * g);
    assert_eq!(d.mem_unmap(va, 5 * g), Err(CUDA_ERROR_INVALID_VALUE));
    assert_eq!(d.address_free(va, 64 * g), Err(CUDA_ERROR_INVALID_VALUE));
    d.mem_unmap(va, 20 * g).unwrap();
    assert_eq!(d.used(0), 10 * g);
    assert_eq!(d.mem_unmap(va, 10 * g), Err(CUDA_ERROR_INVALID_VALUE));
    d.mem_release(h2).unwrap();
    assert_eq!(d.used(0), 0);
    assert_eq!(d.physical_count(), 0);

    // The reservation goes with its own size only.
    assert_eq!(d.address_free(va, 32 * g), Err(CUDA_ERROR_INVALID_VALUE));
    d.address_free(va, 64 * g).unwrap();
    assert_eq!(d.address_free(va, 64 * g), Err(CUDA_ERROR_INVALID_VALUE));
}

#[test]
fn reservations_honour_free_hints_and_never_count() {
    let mut d = driver(&[GIB, GIB]);
    let stack = Vec::new();
    let big = d.address_reserve(&stack, 100 * GIB, 0, 0, 0).unwrap();
    assert_eq!(d.used(0), 0);
    let hint = big + 200 * GIB;
    assert_eq!(d.address_reserve(&stack, GRANULARITY, 0, hint, 0), Ok(hint));
    // A taken hint is ignored, not an error.
    let elsewhere = d.address_reserve(&stack, GRANULARITY, 0, hint, 0).unwrap();
    assert_ne!(elsewhere, hint);
    assert_eq!(
        d.address_reserve(&stack, 0, 0, 0, 0),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
    assert_eq!(
        d.address_reserve(&stack, GRANULARITY, 3, 0, 0),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
}

#[test]
fn arrays_are_sized_by_their_descriptor() {
    let (mut d, stack) = with_context(GIB);
    let float4_2d = d.array_create(&stack, [100, 200, 0], 0x20, 4).unwrap();
    assert_eq!(d.used(0), 100 * 200 * 16);
    let uchar_1d = d.array_create(&stack, [1000, 0, 0], 0x01, 1).unwrap();
    assert_eq!(d.used(0), 100 * 200 * 16 + 1000);
    let half2_3d = d.array_create(&stack, [64, 64, 8], 0x10, 2).unwrap();
    assert_eq!(d.used(0), 100 * 200 * 16 + 1000 + 64 * 64 * 8 * 4);
    d.array_destroy(float4_2d).unwrap();
    d.array_destroy(uchar_1d).unwrap();
    d.array_destroy(half2_3d).unwrap();
    assert_eq!(d.used(0), 0);
    assert_eq!(d.array_destroy(half2_3d), Err(CUDA_ERROR_INVALID_HANDLE));
    assert_eq!(
        d.array_create(&stack, [0, 1, 1], 0x20, 1),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
    assert_eq!(
        d.array_create(&stack, [1, 1, 1], 0x20, 3),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
    assert_eq!(
        d.array_create(&stack, [4, 4, 0], 0x91, 4),
        Err(CUDA_ERROR_NOT_SUPPORTED)
    );
    assert_eq!(
        d.array_create(&stack, [1 << 20, 1 << 20, 0], 0x20, 4),
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    );
}

#[test]
fn pinned_host_memory_is_real_and_separate() {
    let (mut d, stack) = with_context(GIB);
    let p = d.host_alloc(&stack, 10_000, 0).unwrap();
    assert_eq!(p % 4096, 0);
    // Safety: `p` is a live 10 000-byte host allocation.
    unsafe { std::ptr::write_bytes(p as *mut u8, 0xab, 10_000) };
    assert_eq!(d.used(0), 0);
    assert_eq!(d.host_bytes(), 10_000);
    assert_eq!(
        d.pointer_attribute(p + 5, attr::MEMORY_TYPE),
        Ok(PointerValue::U32(abi::memory_type::HOST))
    );
    assert_eq!(d.host_device_pointer(p, 0), Ok(p));
    assert_eq!(d.host_alloc(&stack, 16, 8), Err(CUDA_ERROR_INVALID_VALUE));
    d.host_free(p).unwrap();
    assert_eq!(d.host_free(p), Err(CUDA_ERROR_INVALID_VALUE));
    assert_eq!(d.host_bytes(), 0);
}

#[test]
fn pointer_attributes_of_device_memory() {
    let mut d = driver(&[GIB, 2 * GIB]);
    let mut stack = Vec::new();
    let ctx = d.context_create(&mut stack, 0, 1).unwrap();
    let p = d.mem_alloc(&stack, 10_000).unwrap();
    assert_eq!(
        d.pointer_attribute(p + 9_999, attr::DEVICE_ORDINAL),
        Ok(PointerValue::I32(1))
    );
    assert_eq!(
        d.pointer_attribute(p + 100, attr::RANGE_START_ADDR),
        Ok(PointerValue::Address(p))
    );
    assert_eq!(
        d.pointer_attribute(p + 100, attr::RANGE_SIZE),
        Ok(PointerValue::U64(10_000))
    );
    assert_eq!(
        d.pointer_attribute(p, attr::CONTEXT),
        Ok(PointerValue::Address(ctx))
    );
    assert_eq!(
        d.pointer_attribute(p, attr::MEMORY_TYPE),
        Ok(PointerValue::U32(abi::memory_type::DEVICE))
    );
    assert_eq!(
        d.pointer_attribute(p + 10_000, attr::DEVICE_ORDINAL),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
    assert_eq!(
        d.pointer_attribute(p, attr::HOST_POINTER),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
    assert_eq!(d.address_range(p + 5), Ok((p, 10_000)));
    assert!(p >= 0x1000_0000_0000 + (1 << 43), "device 1's range");
}

#[test]
fn devices_have_their_own_capacity() {
    let mut d = driver(&[GIB, 2 * GIB]);
    let mut stack = Vec::new();
    assert_eq!(d.device_count(), 2);
    assert_eq!(d.device_total_mem(1), Ok(2 * GIB));
    assert_eq!(d.device_total_mem(2), Err(CUDA_ERROR_INVALID_DEVICE));
    assert_eq!(d.device_get(-1), Err(CUDA_ERROR_INVALID_DEVICE));
    let c1 = d.primary_retain(1).unwrap();
    d.push_current(&mut stack, c1).unwrap();
    d.mem_alloc(&stack, 2 * GIB).unwrap();
    assert_eq!(d.mem_get_info(&stack), Ok((0, 2 * GIB)));
    let c0 = d.primary_retain(0).unwrap();
    d.push_current(&mut stack, c0).unwrap();
    assert_eq!(d.mem_get_info(&stack), Ok((GIB, GIB)));
    assert_eq!(d.pop_current(&mut stack), Ok(c0));
    assert_eq!(d.mem_get_info(&stack), Ok((0, 2 * GIB)));
    assert_ne!(d.device_uuid(0), d.device_uuid(1));
}

#[test]
fn contexts_take_their_resources_with_them() {
    let mut d = driver(&[GIB]);
    let mut stack = Vec::new();
    let ctx = d.context_create(&mut stack, 0, 0).unwrap();
    assert_eq!(stack, vec![ctx]);
    let stream = d.stream_create(&stack, 0).unwrap();
    let event = d.event_create(&stack, 0).unwrap();
    d.mem_alloc(&stack, MIB).unwrap();
    d.array_create(&stack, [16, 16, 0], 0x20, 1).unwrap();
    assert_eq!(d.used(0), MIB + 1024);
    d.context_destroy(&mut stack, ctx).unwrap();
    assert!(stack.is_empty());
    assert_eq!(d.used(0), 0);
    assert_eq!(d.check_event(event), Err(CUDA_ERROR_INVALID_HANDLE));
    assert_eq!(d.stream_destroy(stream), Err(CUDA_ERROR_INVALID_HANDLE));
    assert_eq!(
        d.context_destroy(&mut stack, ctx),
        Err(CUDA_ERROR_INVALID_CONTEXT)
    );
    assert_eq!(
        d.set_current(&mut stack, ctx),
        Err(CUDA_ERROR_INVALID_CONTEXT)
    );

    // The primary context is retained and released, not destroyed; its last
    // release frees what was made in it, and retaining again revives it.
    let primary = d.primary_retain(0).unwrap();
    assert_eq!(d.primary_retain(0), Ok(primary));
    assert_eq!(d.primary_state(0), Ok((0, true)));
    d.set_current(&mut stack, primary).unwrap();
    d.mem_alloc(&stack, MIB).unwrap();
    assert_eq!(
        d.context_destroy(&mut stack, primary),
        Err(CUDA_ERROR_INVALID_CONTEXT)
    );
    d.primary_release(0).unwrap();
    assert_eq!(d.used(0), MIB);
    d.primary_release(0).unwrap();
    assert_eq!(d.used(0), 0);
    assert_eq!(d.primary_state(0), Ok((0, false)));
    assert_eq!(d.primary_retain(0), Ok(primary));
    assert_eq!(d.mem_get_info(&stack), Ok((GIB, GIB)));
}

#[test]
fn context_stack_operations() {
    let mut d = driver(&[GIB]);
    let mut stack = Vec::new();
    let a = d.context_create(&mut stack, 0, 0).unwrap();
    let b = d.context_create(&mut stack, 0, 0).unwrap();
    assert_eq!(stack, vec![a, b]);
    d.set_current(&mut stack, a).unwrap();
    assert_eq!(stack, vec![a, a]);
    d.set_current(&mut stack, 0).unwrap();
    assert_eq!(stack, vec![a]);
    assert_eq!(d.pop_current(&mut stack), Ok(a));
    assert_eq!(d.pop_current(&mut stack), Err(CUDA_ERROR_INVALID_CONTEXT));
    d.set_current(&mut stack, 0).unwrap();
    assert_eq!(
        d.context_create(&mut stack, 3, 0),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
    assert_eq!(
        d.context_create(&mut stack, 0x100, 0),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
    d.push_current(&mut stack, b).unwrap();
    d.set_context_flags(&stack, 4).unwrap();
    assert_eq!(d.context_flags(&stack), Ok(4));
    assert_eq!(d.limit(&stack, 2), Ok(8 << 20));
    d.set_limit(&stack, 2, 1 << 30).unwrap();
    assert_eq!(d.limit(&stack, 2), Ok(1 << 30));
    assert_eq!(d.limit(&stack, 9), Err(CUDA_ERROR_UNSUPPORTED_LIMIT));
    assert_eq!(d.stream_priority_range(&stack), Ok((0, -5)));
}

#[test]
fn streams_and_events() {
    let (mut d, stack) = with_context(GIB);
    let stream = d
        .stream_create(&stack, abi::CU_STREAM_NON_BLOCKING)
        .unwrap();
    assert_eq!(d.stream_create(&stack, 2), Err(CUDA_ERROR_INVALID_VALUE));
    let start = d.event_create(&stack, 0).unwrap();
    let end = d.event_create(&stack, 0).unwrap();
    let untimed = d
        .event_create(&stack, abi::CU_EVENT_DISABLE_TIMING)
        .unwrap();
    assert_eq!(
        d.event_create(&stack, abi::CU_EVENT_INTERPROCESS),
        Err(CUDA_ERROR_INVALID_VALUE)
    );

    assert_eq!(
        d.event_elapsed(start, end),
        Err(CUDA_ERROR_INVALID_HANDLE),
        "not recorded yet"
    );
    d.event_record(&stack, start, stream).unwrap();
    d.event_record(&stack, end, 0).unwrap();
    assert!(d.event_elapsed(start, end).unwrap() >= 0.0);
    d.event_record(&stack, untimed, stream).unwrap();
    assert_eq!(
        d.event_elapsed(start, untimed),
        Err(CUDA_ERROR_INVALID_HANDLE)
    );

    // Waiting on a never-recorded event is fine; on a destroyed one it is not.
    let fresh = d
        .event_create(&stack, abi::CU_EVENT_DISABLE_TIMING)
        .unwrap();
    assert_eq!(d.stream_wait_event(&stack, stream, fresh, 0), Ok(()));
    d.event_destroy(fresh).unwrap();
    assert_eq!(
        d.stream_wait_event(&stack, stream, fresh, 0),
        Err(CUDA_ERROR_INVALID_HANDLE)
    );
    assert_eq!(d.event_destroy(fresh), Err(CUDA_ERROR_INVALID_HANDLE));

    // An event cannot be recorded on another context's stream.
    let mut other_stack = Vec::new();
    d.context_create(&mut other_stack, 0, 0).unwrap();
    let foreign = d.stream_create(&other_stack, 0).unwrap();
    assert_eq!(
        d.event_record(&stack, start, foreign),
        Err(CUDA_ERROR_INVALID_HANDLE)
    );
    assert_eq!(d.check_stream(&stack, foreign), Ok(()));
    assert_eq!(
        d.check_stream(&stack, 0xdead_beef),
        Err(CUDA_ERROR_INVALID_HANDLE)
    );
}

#[test]
fn copies_must_stay_inside_an_allocation() {
    let (mut d, stack) = with_context(GIB);
    let p = d.mem_alloc(&stack, 1000).unwrap();
    assert_eq!(d.check_device_range(p, 1000), Ok(()));
    assert_eq!(d.check_device_range(p + 500, 500), Ok(()));
    assert_eq!(
        d.check_device_range(p + 500, 501),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
    assert_eq!(
        d.check_device_range(p - 1, 2),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
    assert_eq!(d.check_device_range(0, 0), Ok(()));
    d.mem_free(p).unwrap();
    assert_eq!(d.check_device_range(p, 1), Err(CUDA_ERROR_INVALID_VALUE));
}
