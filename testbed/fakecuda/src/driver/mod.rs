//! The simulated driver: devices, contexts, streams, events, memory pools and
//! every allocation, with the validation and error codes of the real driver.
//!
//! Everything here is plain safe bookkeeping over `u64` handles and addresses;
//! the exported C functions in `api` translate pointers and call in. The
//! calling thread's context stack is passed in explicitly so that tests can
//! play several threads.

use std::alloc::Layout;
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use crate::abi::{self, CUmemAccessDesc, CUmemAllocationProp, CUmemLocation, CUmemPoolProps};
use crate::address_space::{AddressSpace, align_up};
use crate::attributes;
use crate::config::Config;
use crate::result::*;

/// What `cuDriverGetVersion` reports: CUDA 13.0.
pub(crate) const DRIVER_VERSION: i32 = 13000;
/// Alignment of every linear device allocation, as the real driver gives.
pub(crate) const ALLOCATION_ALIGNMENT: u64 = 512;
/// Row alignment of `cuMemAllocPitch`.
pub(crate) const PITCH_ALIGNMENT: u64 = 512;
/// `cuMemGetAllocationGranularity`, minimum and recommended: 2 MiB.
pub(crate) const GRANULARITY: u64 = 2 << 20;
/// Alignment of pinned host allocations: one page.
const HOST_ALIGNMENT: usize = 4096;
/// `cuCtxGetStreamPriorityRange`: least and greatest priority.
const STREAM_PRIORITIES: (i32, i32) = (0, -5);
/// Default `CUlimit` values, indexed by limit: stack size, printf FIFO, malloc
/// heap, device-runtime sync depth, pending launches, L2 fetch granularity,
/// persisting L2 size.
const DEFAULT_LIMITS: [u64; 7] = [1024, 1 << 20, 8 << 20, 2, 2048, 128, 0];

/// The calling thread's context stack; the current context is the last.
pub(crate) type ContextStack = Vec<u64>;

/// Which API made a linear device allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AllocationKind {
    /// `cuMemAlloc`.
    Linear,
    /// `cuMemAllocPitch`.
    Pitch,
    /// `cuMemAllocManaged`.
    Managed,
    /// `cuMemAllocAsync` / `cuMemAllocFromPoolAsync`.
    StreamOrdered,
}

/// A live linear device allocation.
#[derive(Clone, Debug)]
pub(crate) struct Allocation {
    /// Bytes charged against the device: exactly what was asked for (pitch × height for pitched memory).
    pub size: u64,
    /// Device the memory lives on.
    pub device: usize,
    /// Context it was made in; it dies with that context.
    pub context: u64,
    /// The API that made it.
    pub kind: AllocationKind,
    /// Pool of a stream-ordered allocation, else 0.
    pub pool: u64,
    /// `CU_POINTER_ATTRIBUTE_BUFFER_ID`: unique over the process lifetime.
    pub id: u64,
}

/// A value `cuPointerGetAttribute` writes, typed as the attribute's C type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PointerValue {
    /// A pointer-sized handle or address (`CUcontext`, `CUdeviceptr`, `void*`, `CUmemoryPool`).
    Address(u64),
    /// `unsigned int` (memory type).
    U32(u32),
    /// `int` (device ordinal).
    I32(i32),
    /// `unsigned long long` or `size_t`.
    U64(u64),
    /// `bool`.
    Bool(bool),
}

/// A value of a memory-pool attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PoolValue {
    /// The `int` reuse policies.
    Int(i32),
    /// The `cuuint64_t` sizes.
    U64(u64),
}

/// Whether a pool attribute is an `int` (the reuse policies) rather than a `cuuint64_t`.
pub(crate) fn pool_attribute_is_int(attribute: u32) -> bool {
    (abi::pool_attribute::REUSE_FOLLOW_EVENT_DEPENDENCIES
        ..=abi::pool_attribute::REUSE_ALLOW_INTERNAL_DEPENDENCIES)
        .contains(&attribute)
}

#[derive(Clone, Copy)]
enum HandleKind {
    Context = 0xc7,
    Stream = 0x57,
    Event = 0xe7,
    Pool = 0x9f,
    Array = 0xa7,
    Physical = 0x4d,
}

struct Device {
    name: String,
    capacity: u64,
    /// Physical bytes in use: linear, managed, stream-ordered, array and `cuMemCreate` memory.
    used: u64,
    space: AddressSpace,
    primary: u64,
    primary_refs: u32,
    primary_flags: u32,
    default_pool: u64,
    current_pool: u64,
}

struct Context {
    device: usize,
    primary: bool,
    flags: u32,
    limits: [u64; DEFAULT_LIMITS.len()],
}

struct Stream {
    context: u64,
}

struct Event {
    context: u64,
    flags: u32,
    recorded: Option<Instant>,
}

struct Pool {
    device: usize,
    default: bool,
    reuse: [i32; 3],
    release_threshold: u64,
    used: u64,
    used_high: u64,
    reserved_high: u64,
}

struct Array {
    device: usize,
    context: u64,
    bytes: u64,
}

/// Physical memory from `cuMemCreate`.
struct Physical {
    device: usize,
    size: u64,
    /// Handle references not yet released: 1 from `cuMemCreate` or an import, one more per
    /// `cuMemRetainAllocationHandle`. At 0 the memory goes when the last mapping does.
    refs: u32,
    /// Imported from a shareable handle: the memory is the exporter's, never charged here.
    imported: bool,
    mappings: u32,
    id: u64,
}

/// Address space from `cuMemAddressReserve`.
struct Reservation {
    device: usize,
    /// The size asked for; `cuMemAddressFree` must repeat it.
    size: u64,
    /// The size mappings may use: `size` rounded up to the granularity.
    span: u64,
}

/// A `cuMemMap` of part of a physical allocation into a reservation.
struct Mapping {
    size: u64,
    handle: u64,
}

struct HostAllocation {
    size: u64,
    context: u64,
    id: u64,
}

/// Every piece of driver state.
pub(crate) struct Driver {
    devices: Vec<Device>,
    contexts: HashMap<u64, Context>,
    streams: HashMap<u64, Stream>,
    events: HashMap<u64, Event>,
    pools: HashMap<u64, Pool>,
    /// Linear device allocations by address.
    allocations: BTreeMap<u64, Allocation>,
    arrays: HashMap<u64, Array>,
    physical: HashMap<u64, Physical>,
    reservations: BTreeMap<u64, Reservation>,
    mappings: BTreeMap<u64, Mapping>,
    /// Pinned host allocations by address.
    host: BTreeMap<u64, HostAllocation>,
    next_handle: u64,
    next_buffer_id: u64,
}

/// The null, legacy and per-thread default streams: they exist without being created.
fn is_default_stream(stream: u64) -> bool {
    stream == 0 || stream == abi::CU_STREAM_LEGACY || stream == abi::CU_STREAM_PER_THREAD
}

/// Whether `value` is a multiple of the VMM granularity.
fn granular(value: u64) -> bool {
    value.is_multiple_of(GRANULARITY)
}

impl Driver {
    /// A freshly initialised driver for `config`: every device with an
    /// inactive primary context and a default memory pool.
    pub(crate) fn new(config: &Config) -> Self {
        let mut driver = Driver {
            devices: Vec::new(),
            contexts: HashMap::new(),
            streams: HashMap::new(),
            events: HashMap::new(),
            pools: HashMap::new(),
            allocations: BTreeMap::new(),
            arrays: HashMap::new(),
            physical: HashMap::new(),
            reservations: BTreeMap::new(),
            mappings: BTreeMap::new(),
            host: BTreeMap::new(),
            next_handle: 0,
            next_buffer_id: 0,
        };
        for (ordinal, device) in config.devices.iter().enumerate() {
            let primary = driver.new_handle(HandleKind::Context);
            driver
                .contexts
                .insert(primary, Context::new(ordinal, true, 0));
            let pool = driver.new_handle(HandleKind::Pool);
            driver.pools.insert(pool, Pool::new(ordinal, true));
            driver.devices.push(Device {
                name: device.name.clone(),
                capacity: device.capacity,
                used: 0,
                space: AddressSpace::for_device(ordinal),
                primary,
                primary_refs: 0,
                primary_flags: 0,
                default_pool: pool,
                current_pool: pool,
            });
        }
        driver
    }

    fn new_handle(&mut self, kind: HandleKind) -> u64 {
        // Never reused, so a stale handle is always recognised as stale.
        self.next_handle += 1;
        (kind as u64) << 36 | self.next_handle << 4
    }

    fn new_buffer_id(&mut self) -> u64 {
        self.next_buffer_id += 1;
        self.next_buffer_id
    }

    /// `cuDeviceGetCount`.
    pub(crate) fn device_count(&self) -> usize {
        self.devices.len()
    }

    fn ordinal(&self, ordinal: i32) -> Res<usize> {
        usize::try_from(ordinal)
            .ok()
            .filter(|&o| o < self.devices.len())
            .ok_or(CUDA_ERROR_INVALID_DEVICE)
    }

    /// `cuDeviceGet`: the device handle is the ordinal.
    pub(crate) fn device_get(&self, ordinal: i32) -> Res<i32> {
        self.ordinal(ordinal).map(|_| ordinal)
    }

    /// `cuDeviceGetName`.
    pub(crate) fn device_name(&self, device: i32) -> Res<&str> {
        Ok(&self.devices[self.ordinal(device)?].name)
    }

    /// `cuDeviceTotalMem`: the configured capacity.
    pub(crate) fn device_total_mem(&self, device: i32) -> Res<u64> {
        Ok(self.devices[self.ordinal(device)?].capacity)
    }

    /// `cuDeviceGetAttribute`.
    pub(crate) fn device_attribute(&self, attribute: u32, device: i32) -> Res<i32> {
        let ordinal = self.ordinal(device)?;
        attributes::value(attribute, ordinal).ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    /// `cuDeviceGetUuid`: stable per ordinal, recognisably fake.
    pub(crate) fn device_uuid(&self, device: i32) -> Res<[u8; 16]> {
        let ordinal = self.ordinal(device)?;
        let mut bytes = *b"vramtrace-fake\0\0";
        bytes[14..].copy_from_slice(&(ordinal as u16).to_be_bytes());
        Ok(bytes)
    }

    /// Physical bytes in use on `device` (for tests and `cuMemGetInfo`).
    #[cfg(test)]
    pub(crate) fn used(&self, device: usize) -> u64 {
        self.devices[device].used
    }

    fn context(&self, context: u64) -> Res<&Context> {
        let ctx = self
            .contexts
            .get(&context)
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if ctx.primary && self.devices[ctx.device].primary_refs == 0 {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        Ok(ctx)
    }

    /// The calling thread's current context and its device; 201 without one.
    pub(crate) fn current(&self, stack: &ContextStack) -> Res<(u64, usize)> {
        let context = *stack.last().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        Ok((context, self.context(context)?.device))
    }

    /// The device of a live context.
    pub(crate) fn context_device(&self, context: u64) -> Res<usize> {
        Ok(self.context(context)?.device)
    }

    /// `cuDevicePrimaryCtxRetain`.
    pub(crate) fn primary_retain(&mut self, device: i32) -> Res<u64> {
        let ordinal = self.ordinal(device)?;
        let device = &mut self.devices[ordinal];
        device.primary_refs += 1;
        if device.primary_refs == 1 {
            let flags = device.primary_flags;
            let primary = device.primary;
            self.contexts
                .insert(primary, Context::new(ordinal, true, flags));
        }
        Ok(self.devices[ordinal].primary)
    }

    /// `cuDevicePrimaryCtxRelease`: the last release destroys everything made in the context.
    pub(crate) fn primary_release(&mut self, device: i32) -> Res<()> {
        let ordinal = self.ordinal(device)?;
        let device = &mut self.devices[ordinal];
        if device.primary_refs == 0 {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        device.primary_refs -= 1;
        if device.primary_refs == 0 {
            let primary = device.primary;
            self.release_context_resources(primary);
        }
        Ok(())
    }

    /// `cuDevicePrimaryCtxGetState`: flags and whether it is active.
    pub(crate) fn primary_state(&self, device: i32) -> Res<(u32, bool)> {
        let device = &self.devices[self.ordinal(device)?];
        Ok((device.primary_flags, device.primary_refs > 0))
    }

    /// `cuDevicePrimaryCtxSetFlags`.
    pub(crate) fn primary_set_flags(&mut self, device: i32, flags: u32) -> Res<()> {
        let ordinal = self.ordinal(device)?;
        check_context_flags(flags)?;
        let device = &mut self.devices[ordinal];
        device.primary_flags = flags;
        if let Some(ctx) = self.contexts.get_mut(&device.primary) {
            ctx.flags = flags;
        }
        Ok(())
    }

    /// `cuDevicePrimaryCtxReset`: destroys everything made in the primary context.
    pub(crate) fn primary_reset(&mut self, device: i32) -> Res<()> {
        let ordinal = self.ordinal(device)?;
        let primary = self.devices[ordinal].primary;
        self.release_context_resources(primary);
        Ok(())
    }

    /// `cuCtxCreate`: a new context, pushed onto the calling thread's stack.
    pub(crate) fn context_create(
        &mut self,
        stack: &mut ContextStack,
        flags: u32,
        device: i32,
    ) -> Res<u64> {
        let ordinal = self.ordinal(device)?;
        check_context_flags(flags)?;
        let handle = self.new_handle(HandleKind::Context);
        self.contexts
            .insert(handle, Context::new(ordinal, false, flags));
        stack.push(handle);
        Ok(handle)
    }

    /// `cuCtxDestroy`: destroys a non-primary context and everything made in it.
    pub(crate) fn context_destroy(&mut self, stack: &mut ContextStack, context: u64) -> Res<()> {
        match self.contexts.get(&context) {
            Some(ctx) if !ctx.primary => {}
            _ => return Err(CUDA_ERROR_INVALID_CONTEXT),
        }
        self.release_context_resources(context);
        self.contexts.remove(&context);
        stack.retain(|&c| c != context);
        Ok(())
    }

    /// `cuCtxSetCurrent`: replaces the top of the stack; 0 pops it.
    pub(crate) fn set_current(&self, stack: &mut ContextStack, context: u64) -> Res<()> {
        if context == 0 {
            stack.pop();
            return Ok(());
        }
        self.context(context)?;
        match stack.last_mut() {
            Some(top) => *top = context,
            None => stack.push(context),
        }
        Ok(())
    }

    /// `cuCtxPushCurrent`.
    pub(crate) fn push_current(&self, stack: &mut ContextStack, context: u64) -> Res<()> {
        self.context(context)?;
        stack.push(context);
        Ok(())
    }

    /// `cuCtxPopCurrent`: the popped context.
    pub(crate) fn pop_current(&self, stack: &mut ContextStack) -> Res<u64> {
        stack.pop().ok_or(CUDA_ERROR_INVALID_CONTEXT)
    }

    /// `cuCtxGetFlags` on the current context.
    pub(crate) fn context_flags(&self, stack: &ContextStack) -> Res<u32> {
        let (context, _) = self.current(stack)?;
        Ok(self.contexts[&context].flags)
    }

    /// `cuCtxSetFlags` on the current context.
    pub(crate) fn set_context_flags(&mut self, stack: &ContextStack, flags: u32) -> Res<()> {
        let (context, device) = self.current(stack)?;
        check_context_flags(flags)?;
        self.contexts
            .get_mut(&context)
            .expect("current context exists")
            .flags = flags;
        if self.devices[device].primary == context {
            self.devices[device].primary_flags = flags;
        }
        Ok(())
    }

    /// `cuCtxGetLimit` on the current context.
    pub(crate) fn limit(&self, stack: &ContextStack, limit: u32) -> Res<u64> {
        let (context, _) = self.current(stack)?;
        let limits = &self.contexts[&context].limits;
        limits
            .get(limit as usize)
            .copied()
            .ok_or(CUDA_ERROR_UNSUPPORTED_LIMIT)
    }

    /// `cuCtxSetLimit` on the current context.
    pub(crate) fn set_limit(&mut self, stack: &ContextStack, limit: u32, value: u64) -> Res<()> {
        let (context, _) = self.current(stack)?;
        let limits = &mut self
            .contexts
            .get_mut(&context)
            .expect("current context exists")
            .limits;
        *limits
            .get_mut(limit as usize)
            .ok_or(CUDA_ERROR_UNSUPPORTED_LIMIT)? = value;
        Ok(())
    }

    /// `cuCtxGetStreamPriorityRange`: (least, greatest).
    pub(crate) fn stream_priority_range(&self, stack: &ContextStack) -> Res<(i32, i32)> {
        self.current(stack)?;
        Ok(STREAM_PRIORITIES)
    }

    /// `cuCtxSynchronize_v2`: `context`, or the current one when 0. Work completes at once.
    pub(crate) fn synchronize(&self, stack: &ContextStack, context: u64) -> Res<()> {
        if context == 0 {
            self.current(stack).map(drop)
        } else {
            self.context(context).map(drop)
        }
    }

    /// Destroys the streams, events, allocations and arrays made in `context`.
    /// Pinned host memory is forgotten but not unmapped, so a late access
    /// through a dangling pointer cannot crash the test that made the mistake.
    fn release_context_resources(&mut self, context: u64) {
        // The context may stop being valid: threads check their current one again.
        contexts_changed();
        self.streams.retain(|_, s| s.context != context);
        self.events.retain(|_, e| e.context != context);
        let doomed: Vec<u64> = self
            .allocations
            .iter()
            .filter(|(_, a)| a.context == context)
            .map(|(&ptr, _)| ptr)
            .collect();
        for ptr in doomed {
            self.remove_allocation(ptr);
        }
        let devices = &mut self.devices;
        self.arrays.retain(|_, a| {
            if a.context == context {
                devices[a.device].used -= a.bytes;
            }
            a.context != context
        });
        self.host.retain(|_, h| h.context != context);
    }
}

impl Context {
    fn new(device: usize, primary: bool, flags: u32) -> Self {
        Context {
            device,
            primary,
            flags,
            limits: DEFAULT_LIMITS,
        }
    }
}

impl Pool {
    fn new(device: usize, default: bool) -> Self {
        Pool {
            device,
            default,
            reuse: [1, 1, 1],
            release_threshold: 0,
            used: 0,
            used_high: 0,
            reserved_high: 0,
        }
    }
}

/// Valid `CUctx_flags`: defined bits only, one scheduling mode.
fn check_context_flags(flags: u32) -> Res<()> {
    let schedule = flags & abi::CU_CTX_SCHED_MASK;
    if flags & !abi::CU_CTX_FLAGS_MASK != 0 || !matches!(schedule, 0 | 1 | 2 | 4) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

mod memory;
mod pools;
mod streams;
mod vmm;

/// Moves whenever a context may have stopped being valid (destroyed, a primary context's last
/// release, a reset), so a thread that remembered its current context's device checks again.
static CONTEXT_GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The current context generation (see [`CONTEXT_GENERATION`]).
pub(crate) fn context_generation() -> u64 {
    CONTEXT_GENERATION.load(std::sync::atomic::Ordering::Acquire)
}

/// Called under the lock when a context may have stopped being valid.
fn contexts_changed() {
    CONTEXT_GENERATION.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
}

#[cfg(test)]
mod tests;
