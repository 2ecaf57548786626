//! Virtual memory management (`cuMemCreate`, reservations, mappings) and arrays.

use super::*;

/// The first word of an exported handle's memory file: "fakecuda" in ASCII.
const EXPORT_MAGIC: u64 = u64::from_le_bytes(*b"fakecuda");

impl Driver {
    pub(super) fn check_location(&self, location: &CUmemLocation) -> Res<usize> {
        if location.type_ != abi::CU_MEM_LOCATION_TYPE_DEVICE {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.ordinal(location.id)
    }

    fn check_prop(&self, prop: &CUmemAllocationProp) -> Res<usize> {
        if prop.type_ != abi::CU_MEM_ALLOCATION_TYPE_PINNED {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.check_location(&prop.location)
    }

    /// `cuMemGetAllocationGranularity`.
    pub(crate) fn granularity(&self, prop: &CUmemAllocationProp, option: u32) -> Res<u64> {
        self.check_prop(prop)?;
        match option {
            abi::CU_MEM_ALLOC_GRANULARITY_MINIMUM | abi::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED => {
                Ok(GRANULARITY)
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// `cuMemCreate`: physical memory, charged to the device now.
    pub(crate) fn mem_create(
        &mut self,
        size: u64,
        prop: &CUmemAllocationProp,
        flags: u64,
    ) -> Res<u64> {
        let device = self.check_prop(prop)?;
        if size == 0 || !granular(size) || flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let dev = &mut self.devices[device];
        if size > dev.capacity - dev.used {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        dev.used += size;
        let handle = self.new_handle(HandleKind::Physical);
        let id = self.new_buffer_id();
        self.physical.insert(
            handle,
            Physical {
                device,
                size,
                refs: 1,
                imported: false,
                mappings: 0,
                id,
            },
        );
        Ok(handle)
    }

    /// `cuMemRelease`: drops one reference; the memory is returned once no reference is left
    /// and it is no longer mapped.
    pub(crate) fn mem_release(&mut self, handle: u64) -> Res<()> {
        let physical = self
            .physical
            .get_mut(&handle)
            .filter(|p| p.refs > 0)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        physical.refs -= 1;
        if physical.refs == 0 && physical.mappings == 0 {
            self.drop_physical(handle);
        }
        Ok(())
    }

    fn drop_physical(&mut self, handle: u64) {
        if let Some(physical) = self.physical.remove(&handle)
            && !physical.imported
        {
            self.devices[physical.device].used -= physical.size;
        }
    }

    /// `cuMemExportToShareableHandle` with `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`: a new
    /// file descriptor (an anonymous memory file) holding the allocation's device and size,
    /// which `cuMemImportFromShareableHandle` reads back, in this process or another one that
    /// received the descriptor.
    pub(crate) fn export_handle(&self, handle: u64, handle_type: u32, flags: u64) -> Res<i32> {
        let physical = self
            .physical
            .get(&handle)
            .filter(|p| p.refs > 0)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if handle_type != abi::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut bytes = [0u8; 24];
        bytes[..8].copy_from_slice(&EXPORT_MAGIC.to_le_bytes());
        bytes[8..16].copy_from_slice(&(physical.device as u64).to_le_bytes());
        bytes[16..].copy_from_slice(&physical.size.to_le_bytes());
        // Safety: a valid C string and plain flags.
        let fd = unsafe { libc::memfd_create(c"fakecuda-export".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        // Safety: a descriptor we own and a buffer of the length given.
        let n = unsafe { libc::pwrite(fd, bytes.as_ptr().cast(), bytes.len(), 0) };
        if n != bytes.len() as isize {
            // Safety: our descriptor, not used again.
            unsafe { libc::close(fd) };
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        Ok(fd)
    }

    /// `cuMemImportFromShareableHandle`: a new handle to the memory an exported descriptor
    /// names. The memory is the exporter's: nothing is charged here.
    pub(crate) fn import_handle(&mut self, fd: i32, handle_type: u32) -> Res<u64> {
        if handle_type != abi::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut bytes = [0u8; 24];
        // Safety: a buffer of the length given; a bad descriptor is an error, not UB.
        let n = unsafe { libc::pread(fd, bytes.as_mut_ptr().cast(), bytes.len(), 0) };
        let word = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
        if n != bytes.len() as isize || word(0) != EXPORT_MAGIC {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (device, size) = (word(8) as usize, word(16));
        if device >= self.devices.len() || size == 0 || !granular(size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let handle = self.new_handle(HandleKind::Physical);
        let id = self.new_buffer_id();
        self.physical.insert(
            handle,
            Physical {
                device,
                size,
                refs: 1,
                imported: true,
                mappings: 0,
                id,
            },
        );
        Ok(handle)
    }

    /// `cuMemRetainAllocationHandle`: the handle mapped at `addr`, with one more reference
    /// (the same handle value; each reference needs its own `cuMemRelease`).
    pub(crate) fn retain_handle(&mut self, addr: u64) -> Res<u64> {
        let (&start, mapping) = self
            .mappings
            .range(..=addr)
            .next_back()
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if addr >= start + mapping.size {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let handle = mapping.handle;
        let physical = self
            .physical
            .get_mut(&handle)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        physical.refs += 1;
        Ok(handle)
    }

    /// Physical allocations not yet released or still mapped.
    #[cfg(test)]
    pub(crate) fn physical_count(&self) -> usize {
        self.physical.len()
    }

    /// `cuMemAddressReserve`: address space only, never counted as memory.
    /// Placed in the current device's range (device 0 without a context);
    /// a free, aligned `addr` hint is honoured.
    pub(crate) fn address_reserve(
        &mut self,
        stack: &ContextStack,
        size: u64,
        alignment: u64,
        addr: u64,
        flags: u64,
    ) -> Res<u64> {
        if size == 0 || flags != 0 || (alignment != 0 && !alignment.is_power_of_two()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let alignment = alignment.max(GRANULARITY);
        let span = align_up(size, GRANULARITY).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let hinted = (addr != 0 && addr.is_multiple_of(alignment))
            .then(|| self.devices.iter().position(|d| d.space.covers(addr)))
            .flatten()
            .filter(|&device| self.devices[device].space.allocate_at(addr, span));
        let (device, ptr) = match hinted {
            Some(device) => (device, addr),
            None => {
                let device = self.current(stack).map_or(0, |(_, device)| device);
                let space = &mut self
                    .devices
                    .get_mut(device)
                    .ok_or(CUDA_ERROR_NO_DEVICE)?
                    .space;
                (
                    device,
                    space
                        .allocate(span, alignment)
                        .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?,
                )
            }
        };
        self.reservations
            .insert(ptr, Reservation { device, size, span });
        Ok(ptr)
    }

    /// `cuMemAddressFree`: the whole reservation, with the size it was made with, unmapped.
    pub(crate) fn address_free(&mut self, ptr: u64, size: u64) -> Res<()> {
        let reservation = self
            .reservations
            .get(&ptr)
            .filter(|r| r.size == size)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if self
            .mappings
            .range(ptr..ptr + reservation.span)
            .next()
            .is_some()
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let device = reservation.device;
        self.reservations.remove(&ptr);
        self.devices[device].space.release(ptr);
        Ok(())
    }

    /// `cuMemMap`: maps `size` bytes of `handle` from `offset` at `ptr`, which
    /// must lie in one reservation and not overlap another mapping. Counts nothing.
    pub(crate) fn mem_map(
        &mut self,
        ptr: u64,
        size: u64,
        offset: u64,
        handle: u64,
        flags: u64,
    ) -> Res<()> {
        if flags != 0 || size == 0 || !granular(ptr) || !granular(size) || !granular(offset) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let physical = self
            .physical
            .get(&handle)
            .filter(|p| p.refs > 0)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if offset
            .checked_add(size)
            .is_none_or(|end| end > physical.size)
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let end = ptr.checked_add(size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let (&base, reservation) = self
            .reservations
            .range(..=ptr)
            .next_back()
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if end > base + reservation.span {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if let Some((&m, mapping)) = self.mappings.range(..end).next_back()
            && m + mapping.size > ptr
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.mappings.insert(ptr, Mapping { size, handle });
        self.physical
            .get_mut(&handle)
            .expect("checked above")
            .mappings += 1;
        Ok(())
    }

    /// `cuMemUnmap`: `ptr..ptr + size` must consist of whole mappings.
    pub(crate) fn mem_unmap(&mut self, ptr: u64, size: u64) -> Res<()> {
        let end = ptr.checked_add(size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let mut covered = ptr;
        let mut starts = Vec::new();
        while covered < end {
            let mapping = self
                .mappings
                .get(&covered)
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            starts.push(covered);
            covered += mapping.size;
        }
        if size == 0 || covered != end {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for start in starts {
            let mapping = self.mappings.remove(&start).expect("walked above");
            let physical = self
                .physical
                .get_mut(&mapping.handle)
                .expect("mapped memory exists");
            physical.mappings -= 1;
            if physical.refs == 0 && physical.mappings == 0 {
                self.drop_physical(mapping.handle);
            }
        }
        Ok(())
    }

    /// `cuMemSetAccess`: the range must be mapped and the descriptors valid. Nothing changes.
    pub(crate) fn set_access(
        &self,
        ptr: u64,
        size: u64,
        descriptors: &[CUmemAccessDesc],
    ) -> Res<()> {
        if descriptors.is_empty() || !self.mapped(ptr, size) || size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for descriptor in descriptors {
            self.check_location(&descriptor.location)?;
            if descriptor.flags > abi::CU_MEM_ACCESS_FLAGS_PROT_READWRITE {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
        }
        Ok(())
    }

    /// `cuArrayCreate` / `cuArray3DCreate`: width × max(height, 1) × max(depth, 1)
    /// × element size × channels bytes, charged to the current device.
    pub(crate) fn array_create(
        &mut self,
        stack: &ContextStack,
        extent: [u64; 3],
        format: u32,
        channels: u32,
    ) -> Res<u64> {
        let (context, device) = self.current(stack)?;
        let [width, height, depth] = extent;
        if width == 0 || !matches!(channels, 1 | 2 | 4) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let element = abi::array_element_bytes(format, channels).ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
        let bytes = width
            .checked_mul(height.max(1))
            .and_then(|b| b.checked_mul(depth.max(1)))
            .and_then(|b| b.checked_mul(element))
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let dev = &mut self.devices[device];
        if bytes > dev.capacity - dev.used {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        dev.used += bytes;
        let handle = self.new_handle(HandleKind::Array);
        self.arrays.insert(
            handle,
            Array {
                device,
                context,
                bytes,
            },
        );
        Ok(handle)
    }

    /// `cuArrayDestroy`.
    pub(crate) fn array_destroy(&mut self, handle: u64) -> Res<()> {
        let array = self
            .arrays
            .remove(&handle)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        self.devices[array.device].used -= array.bytes;
        Ok(())
    }
}
