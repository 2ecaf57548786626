//! Linear device memory, pinned host memory and pointer attributes.

use super::*;

/// The entry of an address-keyed map whose range, `base..base + len(entry)`, holds `ptr`.
fn containing<T>(map: &BTreeMap<u64, T>, ptr: u64, len: impl Fn(&T) -> u64) -> Option<(u64, &T)> {
    let (&base, entry) = map.range(..=ptr).next_back()?;
    (ptr < base + len(entry)).then_some((base, entry))
}

impl Driver {
    /// Charges `size` bytes to `device` and places them in its address range.
    fn allocate(
        &mut self,
        device: usize,
        context: u64,
        size: u64,
        kind: AllocationKind,
        pool: u64,
    ) -> Res<u64> {
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let dev = &mut self.devices[device];
        if size > dev.capacity - dev.used {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let span = align_up(size, ALLOCATION_ALIGNMENT).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let ptr = dev
            .space
            .allocate(span, ALLOCATION_ALIGNMENT)
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        dev.used += size;
        if let Some(pool) = self.pools.get_mut(&pool) {
            pool.used += size;
            pool.used_high = pool.used_high.max(pool.used);
            pool.reserved_high = pool.reserved_high.max(pool.used);
        }
        let id = self.new_buffer_id();
        self.allocations.insert(
            ptr,
            Allocation {
                size,
                device,
                context,
                kind,
                pool,
                id,
            },
        );
        Ok(ptr)
    }

    pub(super) fn remove_allocation(&mut self, ptr: u64) -> Option<Allocation> {
        let allocation = self.allocations.remove(&ptr)?;
        let device = &mut self.devices[allocation.device];
        device.used -= allocation.size;
        device.space.release(ptr);
        if let Some(pool) = self.pools.get_mut(&allocation.pool) {
            pool.used -= allocation.size;
        }
        Some(allocation)
    }

    /// `cuMemAlloc` in the current context.
    pub(crate) fn mem_alloc(&mut self, stack: &ContextStack, size: u64) -> Res<u64> {
        let (context, device) = self.current(stack)?;
        self.allocate(device, context, size, AllocationKind::Linear, 0)
    }

    /// `cuMemAllocPitch`: (address, pitch). Rows are padded to 512 bytes.
    pub(crate) fn mem_alloc_pitch(
        &mut self,
        stack: &ContextStack,
        width: u64,
        height: u64,
        element: u32,
    ) -> Res<(u64, u64)> {
        let (context, device) = self.current(stack)?;
        if width == 0 || height == 0 || !matches!(element, 4 | 8 | 16) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let pitch = align_up(width, PITCH_ALIGNMENT).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let bytes = pitch.checked_mul(height).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let ptr = self.allocate(device, context, bytes, AllocationKind::Pitch, 0)?;
        Ok((ptr, pitch))
    }

    /// `cuMemAllocManaged`: counted against the current context's device.
    pub(crate) fn mem_alloc_managed(
        &mut self,
        stack: &ContextStack,
        size: u64,
        flags: u32,
    ) -> Res<u64> {
        let (context, device) = self.current(stack)?;
        if flags != abi::CU_MEM_ATTACH_GLOBAL && flags != abi::CU_MEM_ATTACH_HOST {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.allocate(device, context, size, AllocationKind::Managed, 0)
    }

    /// `cuMemAllocAsync`: from the current pool of the stream's device.
    /// Zero bytes succeed with address 0 (the stream-ordered allocator accepts
    /// them on Linux, and cudarc's `alloc(0)` relies on it); `cuMemAlloc` refuses them.
    pub(crate) fn mem_alloc_async(
        &mut self,
        stack: &ContextStack,
        size: u64,
        stream: u64,
    ) -> Res<u64> {
        let context = self.stream_context(stack, stream)?;
        let device = self.contexts[&context].device;
        let pool = self.devices[device].current_pool;
        if size == 0 {
            return Ok(0);
        }
        self.allocate(device, context, size, AllocationKind::StreamOrdered, pool)
    }

    /// `cuMemAllocFromPoolAsync`: from `pool`, on the pool's device. Zero bytes as `cuMemAllocAsync`.
    pub(crate) fn mem_alloc_from_pool(
        &mut self,
        stack: &ContextStack,
        size: u64,
        pool: u64,
        stream: u64,
    ) -> Res<u64> {
        let context = self.stream_context(stack, stream)?;
        let device = self
            .pools
            .get(&pool)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?
            .device;
        if size == 0 {
            return Ok(0);
        }
        self.allocate(device, context, size, AllocationKind::StreamOrdered, pool)
    }

    /// `cuMemFree`: any linear allocation, by its base address. Freeing 0 does nothing.
    pub(crate) fn mem_free(&mut self, ptr: u64) -> Res<()> {
        if ptr == 0 {
            return Ok(());
        }
        self.remove_allocation(ptr)
            .map(drop)
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    /// `cuMemFreeAsync`: frees at once; a named stream must exist.
    pub(crate) fn mem_free_async(&mut self, ptr: u64, stream: u64) -> Res<()> {
        if !is_default_stream(stream) && !self.streams.contains_key(&stream) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        self.mem_free(ptr)
    }

    /// `cuMemGetInfo`: (free, total) of the current context's device.
    pub(crate) fn mem_get_info(&self, stack: &ContextStack) -> Res<(u64, u64)> {
        let (_, device) = self.current(stack)?;
        let device = &self.devices[device];
        Ok((device.capacity - device.used, device.capacity))
    }

    /// The live linear allocation at exactly `ptr`.
    #[cfg(test)]
    pub(crate) fn allocation(&self, ptr: u64) -> Option<&Allocation> {
        self.allocations.get(&ptr)
    }

    /// The linear allocation containing `ptr`: (base, allocation).
    fn allocation_containing(&self, ptr: u64) -> Option<(u64, &Allocation)> {
        containing(&self.allocations, ptr, |a| a.size)
    }

    /// The VMM mapping containing `ptr`: (base, mapping).
    fn mapping_containing(&self, ptr: u64) -> Option<(u64, &Mapping)> {
        containing(&self.mappings, ptr, |m| m.size)
    }

    /// Whether `ptr..ptr + len` is covered by contiguous VMM mappings.
    pub(super) fn mapped(&self, ptr: u64, len: u64) -> bool {
        let Some(end) = ptr.checked_add(len) else {
            return false;
        };
        let Some((base, first)) = self.mapping_containing(ptr) else {
            return false;
        };
        let mut covered = base + first.size;
        while covered < end {
            match self.mappings.get(&covered) {
                Some(next) => covered += next.size,
                None => return false,
            }
        }
        true
    }

    /// Validates `ptr..ptr + len` as device memory (for memset and memcpy):
    /// inside one linear allocation, or inside mapped VMM memory.
    pub(crate) fn check_device_range(&self, ptr: u64, len: u64) -> Res<()> {
        if len == 0 {
            return Ok(());
        }
        if let Some((base, allocation)) = self.allocation_containing(ptr)
            && ptr
                .checked_add(len)
                .is_some_and(|end| end <= base + allocation.size)
        {
            return Ok(());
        }
        if self.mapped(ptr, len) {
            return Ok(());
        }
        Err(CUDA_ERROR_INVALID_VALUE)
    }

    /// `cuMemGetAddressRange`: (base, size) of the allocation or mapping containing `ptr`.
    pub(crate) fn address_range(&self, ptr: u64) -> Res<(u64, u64)> {
        if let Some((base, allocation)) = self.allocation_containing(ptr) {
            return Ok((base, allocation.size));
        }
        if let Some((base, mapping)) = self.mapping_containing(ptr) {
            return Ok((base, mapping.size));
        }
        Err(CUDA_ERROR_NOT_FOUND)
    }

    /// `cuMemAllocHost` / `cuMemHostAlloc`: real, page-aligned host memory,
    /// tracked apart from device memory.
    pub(crate) fn host_alloc(&mut self, stack: &ContextStack, size: u64, flags: u32) -> Res<u64> {
        let (context, _) = self.current(stack)?;
        if size == 0 || flags & !abi::CU_MEMHOSTALLOC_ALL != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let size_usize = usize::try_from(size).map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
        let layout = Layout::from_size_align(size_usize, HOST_ALIGNMENT)
            .map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
        // Safety: the layout has a non-zero size (checked above).
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let id = self.new_buffer_id();
        self.host
            .insert(ptr as u64, HostAllocation { size, context, id });
        Ok(ptr as u64)
    }

    /// `cuMemFreeHost`.
    pub(crate) fn host_free(&mut self, ptr: u64) -> Res<()> {
        let allocation = self.host.remove(&ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let layout = Layout::from_size_align(allocation.size as usize, HOST_ALIGNMENT)
            .expect("layout was valid at allocation");
        // Safety: `ptr` came from `std::alloc::alloc` with this layout in
        // `host_alloc` and was still tracked, so it is freed exactly once.
        unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
        Ok(())
    }

    /// The pinned host allocation containing `ptr`: (base, allocation).
    fn host_containing(&self, ptr: u64) -> Option<(u64, &HostAllocation)> {
        containing(&self.host, ptr, |h| h.size)
    }

    /// `cuMemHostGetDevicePointer`: with unified addressing, the host address itself.
    pub(crate) fn host_device_pointer(&self, ptr: u64, flags: u32) -> Res<u64> {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.host_containing(ptr)
            .map(|_| ptr)
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    /// Bytes of pinned host memory tracked.
    #[cfg(test)]
    pub(crate) fn host_bytes(&self) -> u64 {
        self.host.values().map(|h| h.size).sum()
    }

    /// `cuPointerGetAttribute`.
    pub(crate) fn pointer_attribute(&self, ptr: u64, attribute: u32) -> Res<PointerValue> {
        use PointerValue::*;
        use abi::pointer_attribute as a;
        if let Some((base, allocation)) = self.allocation_containing(ptr) {
            let managed = allocation.kind == AllocationKind::Managed;
            return Ok(match attribute {
                a::CONTEXT => Address(allocation.context),
                a::MEMORY_TYPE => U32(abi::memory_type::DEVICE),
                a::DEVICE_POINTER => Address(ptr),
                a::HOST_POINTER if managed => Address(ptr),
                a::BUFFER_ID => U64(allocation.id),
                a::IS_MANAGED => Bool(managed),
                a::DEVICE_ORDINAL => I32(allocation.device as i32),
                a::RANGE_START_ADDR => Address(base),
                a::RANGE_SIZE => U64(allocation.size),
                a::MAPPED => Bool(true),
                a::MEMPOOL_HANDLE if allocation.pool != 0 => Address(allocation.pool),
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            });
        }
        if let Some((base, allocation)) = self.host_containing(ptr) {
            let device = self
                .contexts
                .get(&allocation.context)
                .map_or(0, |c| c.device);
            return Ok(match attribute {
                a::CONTEXT => Address(allocation.context),
                a::MEMORY_TYPE => U32(abi::memory_type::HOST),
                a::DEVICE_POINTER | a::HOST_POINTER => Address(ptr),
                a::BUFFER_ID => U64(allocation.id),
                a::IS_MANAGED => Bool(false),
                a::DEVICE_ORDINAL => I32(device as i32),
                a::RANGE_START_ADDR => Address(base),
                a::RANGE_SIZE => U64(allocation.size),
                a::MAPPED => Bool(true),
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            });
        }
        if let Some((base, reservation)) = containing(&self.reservations, ptr, |r| r.span) {
            let mapping = self
                .mapping_containing(ptr)
                .map(|(_, mapping)| &self.physical[&mapping.handle]);
            return Ok(match (attribute, mapping) {
                (a::MAPPED, mapping) => Bool(mapping.is_some()),
                (a::RANGE_START_ADDR, _) => Address(base),
                (a::RANGE_SIZE, _) => U64(reservation.size),
                (a::CONTEXT, Some(_)) => Address(0),
                (a::MEMORY_TYPE, Some(_)) => U32(abi::memory_type::DEVICE),
                (a::DEVICE_POINTER, Some(_)) => Address(ptr),
                (a::BUFFER_ID, Some(physical)) => U64(physical.id),
                (a::IS_MANAGED, Some(_)) => Bool(false),
                (a::DEVICE_ORDINAL, Some(physical)) => I32(physical.device as i32),
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            });
        }
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}
