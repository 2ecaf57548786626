//! Stream-ordered memory pools. Nothing is cached: freed memory returns to the device at once.

use super::*;

impl Driver {
    fn pool(&self, pool: u64) -> Res<&Pool> {
        self.pools.get(&pool).ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    /// `cuDeviceGetDefaultMemPool`.
    pub(crate) fn default_pool(&self, device: i32) -> Res<u64> {
        Ok(self.devices[self.ordinal(device)?].default_pool)
    }

    /// `cuDeviceGetMemPool`: the pool `cuMemAllocAsync` uses.
    pub(crate) fn current_pool(&self, device: i32) -> Res<u64> {
        Ok(self.devices[self.ordinal(device)?].current_pool)
    }

    /// `cuDeviceSetMemPool`.
    pub(crate) fn set_current_pool(&mut self, device: i32, pool: u64) -> Res<()> {
        let ordinal = self.ordinal(device)?;
        if self.pool(pool)?.device != ordinal {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.devices[ordinal].current_pool = pool;
        Ok(())
    }

    /// `cuMemPoolCreate`: pinned device memory only.
    pub(crate) fn pool_create(&mut self, props: &CUmemPoolProps) -> Res<u64> {
        if props.allocType != abi::CU_MEM_ALLOCATION_TYPE_PINNED {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let device = self.check_location(&props.location)?;
        let handle = self.new_handle(HandleKind::Pool);
        self.pools.insert(handle, Pool::new(device, false));
        Ok(handle)
    }

    /// `cuMemPoolDestroy`: not the default pool. A destroyed current pool
    /// gives way to the default one.
    pub(crate) fn pool_destroy(&mut self, pool: u64) -> Res<()> {
        let device = match self.pool(pool)? {
            p if p.default => return Err(CUDA_ERROR_INVALID_VALUE),
            p => p.device,
        };
        self.pools.remove(&pool);
        let device = &mut self.devices[device];
        if device.current_pool == pool {
            device.current_pool = device.default_pool;
        }
        Ok(())
    }

    /// `cuMemPoolTrimTo`: freed memory is never cached, so there is nothing to trim.
    pub(crate) fn pool_trim(&self, pool: u64) -> Res<()> {
        self.pool(pool).map(drop)
    }

    /// `cuMemPoolGetAttribute`. Freed memory is never cached, so reserved equals used.
    pub(crate) fn pool_attribute(&self, pool: u64, attribute: u32) -> Res<PoolValue> {
        use abi::pool_attribute as a;
        let pool = self.pool(pool)?;
        Ok(match attribute {
            a::REUSE_FOLLOW_EVENT_DEPENDENCIES..=a::REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                PoolValue::Int(pool.reuse[(attribute - 1) as usize])
            }
            a::RELEASE_THRESHOLD => PoolValue::U64(pool.release_threshold),
            a::RESERVED_MEM_CURRENT | a::USED_MEM_CURRENT => PoolValue::U64(pool.used),
            a::RESERVED_MEM_HIGH => PoolValue::U64(pool.reserved_high),
            a::USED_MEM_HIGH => PoolValue::U64(pool.used_high),
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        })
    }

    /// `cuMemPoolSetAttribute`. High-water marks may only be reset (set to 0).
    pub(crate) fn set_pool_attribute(
        &mut self,
        pool: u64,
        attribute: u32,
        value: PoolValue,
    ) -> Res<()> {
        use abi::pool_attribute as a;
        let pool = self.pools.get_mut(&pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        match (attribute, value) {
            (
                a::REUSE_FOLLOW_EVENT_DEPENDENCIES..=a::REUSE_ALLOW_INTERNAL_DEPENDENCIES,
                PoolValue::Int(v),
            ) => pool.reuse[(attribute - 1) as usize] = v,
            (a::RELEASE_THRESHOLD, PoolValue::U64(v)) => pool.release_threshold = v,
            (a::RESERVED_MEM_HIGH, PoolValue::U64(0)) => pool.reserved_high = pool.used,
            (a::USED_MEM_HIGH, PoolValue::U64(0)) => pool.used_high = pool.used,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    }
}
