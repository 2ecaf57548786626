//! PyTorch's CUDA caching allocator: how a tensor request becomes a block and a segment, and a
//! simulation of a sequence of allocations and frees that yields the segments `cudaMalloc`
//! (`cuMemAlloc`) would see.
//!
//! Read from `c10/cuda/CUDACachingAllocator.cpp` (pytorch/pytorch, stored at commit `001074d2`):
//! `kMinBlockSize = 512`, `kSmallSize = 1 MiB`, `kSmallBuffer = 2 MiB`, `kLargeBuffer = 20 MiB`,
//! `kMinLargeAlloc = 10 MiB`, `kRoundLarge = 2 MiB`; `round_size` (512-byte rounding, the
//! optional `roundup_power2_divisions` off by default); `get_pool` (≤ 1 MiB small pool);
//! `get_allocation_size` (2 MiB segments for small requests, 20 MiB for requests under 10 MiB,
//! otherwise rounded up to 2 MiB); `get_free_block` (best fit: the smallest cached block of the
//! same stream and pool that is large enough, lowest address first among equals); `should_split`
//! (small pool: remainder ≥ 512 B; large pool: remainder > 1 MiB); `free_block` and
//! `try_merge_blocks` (a freed block merges with free neighbours of its segment); and on a failed
//! `cudaMalloc` `release_cached_blocks` (every cached segment that is not split goes back to the
//! driver, then one retry).
//!
//! The simulation assumes the default configuration: one stream, no `max_split_size_mb`, no
//! `expandable_segments`, no garbage-collection threshold, no CUDA graph pools. Segment
//! addresses are synthetic (consecutive), which only matters for best-fit ties.

use std::collections::BTreeSet;

use serde::Serialize;

use crate::{Event, Tensor, events};

/// All sizes are rounded to at least this many bytes.
pub const MIN_BLOCK_SIZE: u64 = 512;
/// The largest "small" request: 1 MiB.
pub const SMALL_SIZE: u64 = 1 << 20;
/// Small requests are packed into segments of 2 MiB.
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Requests between 1 and 10 MiB are carved from segments of 20 MiB.
pub const LARGE_BUFFER: u64 = 20 << 20;
/// Requests of at least 10 MiB get a segment of their own size rounded to 2 MiB.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Rounding of large segments.
pub const ROUND_LARGE: u64 = 2 << 20;

/// Which of the allocator's two pools serves a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pool {
    /// Blocks of at most 1 MiB, carved from 2 MiB segments.
    Small,
    /// Everything larger.
    Large,
}

/// What one request turns into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Rounding {
    /// The bytes asked for (the tensor's bytes).
    pub request: u64,
    /// The block the allocator hands out (`round_size`).
    pub block: u64,
    /// The pool it comes from.
    pub pool: Pool,
    /// The segment `cudaMalloc` is asked for when no cached block fits (`get_allocation_size`).
    pub segment: u64,
}

/// `round_size`: at least 512 bytes, then a multiple of 512.
pub fn round_size(request: u64) -> u64 {
    if request < MIN_BLOCK_SIZE {
        MIN_BLOCK_SIZE
    } else {
        request.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
    }
}

/// `get_pool`: blocks of at most 1 MiB are small.
pub fn pool_for(block: u64) -> Pool {
    if block <= SMALL_SIZE {
        Pool::Small
    } else {
        Pool::Large
    }
}

/// `get_allocation_size`: the segment requested from the driver for a block of this size.
pub fn allocation_size(block: u64) -> u64 {
    if block <= SMALL_SIZE {
        SMALL_BUFFER
    } else if block < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        block.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

/// Block, pool and segment for a request. A zero-byte request allocates nothing in PyTorch;
/// it is reported with a zero block and segment.
pub fn rounding(request: u64) -> Rounding {
    if request == 0 {
        return Rounding {
            request,
            block: 0,
            pool: Pool::Small,
            segment: 0,
        };
    }
    let block = round_size(request);
    Rounding {
        request,
        block,
        pool: pool_for(block),
        segment: allocation_size(block),
    }
}

/// `should_split`: whether the rest of a found block goes back to the pool as its own block.
pub fn should_split(pool: Pool, block_size: u64, request_block: u64) -> bool {
    let remaining = block_size - request_block;
    match pool {
        Pool::Small => remaining >= MIN_BLOCK_SIZE,
        Pool::Large => remaining > SMALL_SIZE,
    }
}

/// A driver-level event the simulation produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SegmentEvent {
    /// `cudaMalloc` of a new segment.
    SegmentAlloc {
        /// Synthetic address.
        ptr: u64,
        /// Segment bytes.
        size: u64,
    },
    /// `cudaFree` of a cached, unsplit segment (only after a failed `cudaMalloc`).
    SegmentFree {
        /// Synthetic address.
        ptr: u64,
        /// Segment bytes.
        size: u64,
    },
    /// Pages mapped into an expandable segment (`cuMemCreate` + `cuMemMap`, one handle a page).
    Map {
        /// Synthetic address of the first page.
        ptr: u64,
        /// Bytes mapped, whole pages.
        size: u64,
    },
    /// Pages of an expandable segment unmapped (only after a failed allocation).
    Unmap {
        /// Synthetic address of the first page.
        ptr: u64,
        /// Bytes unmapped, whole pages.
        size: u64,
    },
}

/// A request the simulated device could not satisfy even after releasing cached segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Oom {
    /// The segment size that could not be allocated (`get_allocation_size`, the size PyTorch's
    /// message names, with expandable segments too).
    pub segment: u64,
    /// Bytes reserved in segments at that moment.
    pub reserved: u64,
    /// Bytes handed out in blocks at that moment.
    pub allocated: u64,
}

/// A handle to a block handed out by [`CachingAllocator::malloc`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockId(usize);

#[derive(Clone, Debug)]
struct Block {
    ptr: u64,
    size: u64,
    pool: Pool,
    allocated: bool,
    /// Backed by pages: always, except the unmapped ranges of an expandable segment.
    mapped: bool,
    /// The expandable segment this block is part of (an index into `segments`).
    segment: Option<usize>,
    prev: Option<usize>,
    next: Option<usize>,
}

/// An expandable segment: address space for the whole device, mapped page by page.
#[derive(Clone, Copy, Debug)]
struct Expandable {
    base: u64,
    page: u64,
}

/// Address space an expandable segment reserves: PyTorch reserves 1.125 × the device's memory;
/// the simulation never comes near its end.
const EXPANDABLE_ADDRESS_SPACE: u64 = 1 << 44;

/// A single-stream simulation of the caching allocator, in its default configuration or with
/// `expandable_segments:True` ([`CachingAllocator::expandable`]).
#[derive(Debug, Default)]
pub struct CachingAllocator {
    blocks: Vec<Block>,
    /// Free mapped blocks by (pool, size, address): `BlockPool::blocks`.
    free: BTreeSet<(Pool, u64, u64, usize)>,
    /// Free unmapped ranges of expandable segments by (pool, address): `BlockPool::unmapped`.
    unmapped: BTreeSet<(Pool, u64, usize)>,
    segments: Vec<Expandable>,
    expandable: bool,
    next_ptr: u64,
    capacity: Option<u64>,
    reserved: u64,
    allocated: u64,
    peak_reserved: u64,
    events: Vec<SegmentEvent>,
}

impl CachingAllocator {
    /// An empty allocator; with `capacity`, a new segment (or, with expandable segments, new
    /// pages) is refused once the reserve and the request's segment size would pass it, as
    /// PyTorch's `alloc_block` refuses past `set_per_process_memory_fraction`.
    pub fn new(capacity: Option<u64>) -> Self {
        CachingAllocator {
            capacity,
            next_ptr: 1 << 32,
            ..Default::default()
        }
    }

    /// The same allocator with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, as
    /// `c10/cuda/CUDACachingAllocator.cpp` (commit `001074d2`) runs it: one segment per pool that
    /// grows by pages (2 MiB for the small pool, 20 MiB for the large, `find_expandable_block`),
    /// mapped at the lowest free range that fits with the free block before it
    /// (`try_allocate_expandable_block`, `map_block`); any remainder of 512 B or more split off
    /// in both pools (`should_split`); best fit preferring blocks not followed by unmapped space
    /// (`get_free_block`); the fraction checked against the request's `get_allocation_size`
    /// before mapping (`alloc_block`); on a refusal every whole free page unmapped, holes
    /// included, then one retry (`release_blocks`, `unmap_block`).
    pub fn expandable(mut self) -> Self {
        self.expandable = true;
        self
    }

    /// The allocator in the state a trace shows at one moment, default mode: `segments` are the
    /// segments it held (base and bytes, as `cudaMalloc` gave them), `blocks` the blocks handed
    /// out in them (base and block bytes, as PyTorch's hooks report a block), and every gap
    /// between blocks of a segment a free block of that segment's pool (2 MiB segments are the
    /// small pool's, `get_allocation_size`). Returns, beside it, each of `blocks`' handles in
    /// the same order; `None` for a block inside no segment or overlapping one before it, which
    /// then takes no part.
    pub fn from_state(
        capacity: Option<u64>,
        segments: &[(u64, u64)],
        blocks: &[(u64, u64)],
    ) -> (Self, Vec<Option<BlockId>>) {
        let mut a = CachingAllocator::new(capacity);
        let mut segs: Vec<(u64, u64)> = segments.iter().copied().filter(|s| s.1 > 0).collect();
        segs.sort_unstable();
        segs.dedup_by_key(|s| s.0);
        // Each block with the segment it lies in, in address order.
        let mut placed: Vec<(usize, u64, u64, usize)> = Vec::new();
        for (i, &(ptr, size)) in blocks.iter().enumerate() {
            let s = segs.partition_point(|x| x.0 <= ptr);
            if s == 0 || size == 0 {
                continue;
            }
            let (base, bytes) = segs[s - 1];
            if ptr.saturating_add(size) <= base + bytes {
                placed.push((s - 1, ptr, size, i));
            }
        }
        placed.sort_unstable();
        let mut ids = vec![None; blocks.len()];
        let mut at = 0;
        for (si, &(base, bytes)) in segs.iter().enumerate() {
            let pool = if bytes == SMALL_BUFFER {
                Pool::Small
            } else {
                Pool::Large
            };
            let end = base + bytes;
            let mut cursor = base;
            let mut prev: Option<usize> = None;
            let mut push = |a: &mut CachingAllocator, ptr: u64, size: u64, allocated: bool| {
                a.blocks.push(Block {
                    ptr,
                    size,
                    pool,
                    allocated,
                    mapped: true,
                    segment: None,
                    prev,
                    next: None,
                });
                let idx = a.blocks.len() - 1;
                if let Some(p) = prev {
                    a.blocks[p].next = Some(idx);
                }
                prev = Some(idx);
                if allocated {
                    a.allocated += size;
                } else {
                    a.free.insert(a.free_key(idx));
                }
                idx
            };
            while at < placed.len() && placed[at].0 == si {
                let (_, ptr, size, i) = placed[at];
                at += 1;
                if ptr < cursor {
                    continue;
                }
                if ptr > cursor {
                    push(&mut a, cursor, ptr - cursor, false);
                }
                ids[i] = Some(BlockId(push(&mut a, ptr, size, true)));
                cursor = ptr + size;
            }
            if cursor < end {
                push(&mut a, cursor, end - cursor, false);
            }
            a.add_reserved(bytes);
            a.next_ptr = a.next_ptr.max(end.next_multiple_of(ROUND_LARGE));
        }
        (a, ids)
    }

    /// The limit new segments are checked against, if any.
    pub fn capacity(&self) -> Option<u64> {
        self.capacity
    }

    /// Allocates a block for `request` bytes (`malloc`). Zero-byte requests are not supported by
    /// the simulation (PyTorch does not call the allocator for them).
    pub fn malloc(&mut self, request: u64) -> Result<BlockId, Oom> {
        let r = rounding(request.max(1));
        let idx = match self.free_block(r.pool, r.block) {
            Some(idx) => idx,
            None => match self.alloc_block(&r) {
                Some(idx) => idx,
                None => {
                    self.release_cached_blocks();
                    self.alloc_block(&r).ok_or(Oom {
                        segment: r.segment,
                        reserved: self.reserved,
                        allocated: self.allocated,
                    })?
                }
            },
        };
        self.free.remove(&self.free_key(idx));
        let remaining = self.blocks[idx].size - r.block;
        let split = if self.expandable {
            remaining >= MIN_BLOCK_SIZE
        } else {
            should_split(r.pool, self.blocks[idx].size, r.block)
        };
        if split {
            let b = self.blocks[idx].clone();
            let rest = Block {
                ptr: b.ptr + r.block,
                size: remaining,
                prev: Some(idx),
                ..b
            };
            self.blocks.push(rest);
            let rest_idx = self.blocks.len() - 1;
            if let Some(n) = b.next {
                self.blocks[n].prev = Some(rest_idx);
            }
            self.blocks[idx].next = Some(rest_idx);
            self.blocks[idx].size = r.block;
            self.free.insert(self.free_key(rest_idx));
        }
        self.blocks[idx].allocated = true;
        self.allocated += self.blocks[idx].size;
        Ok(BlockId(idx))
    }

    fn free_key(&self, idx: usize) -> (Pool, u64, u64, usize) {
        let b = &self.blocks[idx];
        (b.pool, b.size, b.ptr, idx)
    }

    /// `get_free_block`: the smallest cached block of the pool that fits, lowest address first;
    /// with expandable segments, a block followed by unmapped space counts with that space, and
    /// the search moves on to a larger block while that one counts as smaller.
    fn free_block(&self, pool: Pool, block: u64) -> Option<usize> {
        let mut fits = self
            .free
            .range((pool, block, 0, 0)..)
            .take_while(|k| k.0 == pool)
            .map(|k| k.3);
        let mut found = fits.next()?;
        if self.expandable {
            let counted = |i: usize| {
                let b = &self.blocks[i];
                b.size
                    + b.next
                        .filter(|&n| !self.blocks[n].mapped)
                        .map_or(0, |n| self.blocks[n].size)
            };
            for next in fits {
                if counted(next) < counted(found) {
                    found = next;
                } else {
                    break;
                }
            }
        }
        Some(found)
    }

    /// `alloc_block`: a new segment from the driver, or pages mapped into an expandable segment,
    /// unless the limit refuses the request's segment size. The block is free, in the free set.
    fn alloc_block(&mut self, r: &Rounding) -> Option<usize> {
        if self.capacity.is_some_and(|c| self.reserved + r.segment > c) {
            return None;
        }
        if self.expandable {
            return Some(self.grow(r.pool, r.block));
        }
        let ptr = self.next_ptr;
        self.next_ptr += r.segment.next_multiple_of(ROUND_LARGE);
        self.add_reserved(r.segment);
        self.events.push(SegmentEvent::SegmentAlloc {
            ptr,
            size: r.segment,
        });
        self.blocks.push(Block {
            ptr,
            size: r.segment,
            pool: r.pool,
            allocated: false,
            mapped: true,
            segment: None,
            prev: None,
            next: None,
        });
        let idx = self.blocks.len() - 1;
        self.free.insert(self.free_key(idx));
        Some(idx)
    }

    fn add_reserved(&mut self, bytes: u64) {
        self.reserved += bytes;
        self.peak_reserved = self.peak_reserved.max(self.reserved);
    }

    /// Whether a block can take part in growing a mapping: not handed out.
    fn is_free(&self, i: usize) -> bool {
        !self.blocks[i].allocated
    }

    /// `find_expandable_block` and `try_allocate_expandable_block`: the lowest unmapped range of
    /// the pool that, with the free block before it and the free or unmapped blocks after it,
    /// holds `size`, mapped page by page until the block starting there holds it. A new segment
    /// when none does.
    fn grow(&mut self, pool: Pool, size: u64) -> usize {
        let found = self
            .unmapped
            .range((pool, 0, 0)..)
            .take_while(|k| k.0 == pool)
            .map(|k| {
                let u = k.2;
                self.blocks[u]
                    .prev
                    .filter(|&p| self.is_free(p))
                    .unwrap_or(u)
            })
            .find(|&c| {
                let mut bytes = 0;
                let mut at = Some(c);
                while let Some(i) = at.filter(|&i| self.is_free(i)) {
                    bytes += self.blocks[i].size;
                    if bytes >= size {
                        return true;
                    }
                    at = self.blocks[i].next;
                }
                false
            });
        let mut cand = found.unwrap_or_else(|| self.new_segment(pool));
        if !self.blocks[cand].mapped {
            let n = self.blocks[cand].size.min(size);
            cand = self.map_block(cand, n);
        }
        while self.blocks[cand].size < size {
            let nb = self.blocks[cand]
                .next
                .expect("find_expandable_block counted the unmapped range after it");
            let n = (size - self.blocks[cand].size).min(self.blocks[nb].size);
            cand = self.map_block(nb, n);
        }
        cand
    }

    fn new_segment(&mut self, pool: Pool) -> usize {
        let page = match pool {
            Pool::Small => SMALL_BUFFER,
            Pool::Large => LARGE_BUFFER,
        };
        let base = self.next_ptr;
        self.next_ptr += EXPANDABLE_ADDRESS_SPACE;
        self.segments.push(Expandable { base, page });
        self.blocks.push(Block {
            ptr: base,
            size: EXPANDABLE_ADDRESS_SPACE,
            pool,
            allocated: false,
            mapped: false,
            segment: Some(self.segments.len() - 1),
            prev: None,
            next: None,
        });
        let idx = self.blocks.len() - 1;
        self.unmapped.insert((pool, base, idx));
        idx
    }

    /// `map_block`: maps whole pages for `n` bytes at the start of the unmapped block `u`, the
    /// rest staying unmapped; the mapped block merges with free mapped neighbours and goes to
    /// the free set. Returns the merged block.
    fn map_block(&mut self, u: usize, n: u64) -> usize {
        let seg = self.segments[self.blocks[u].segment.expect("an expandable block")];
        let mapped = n.div_ceil(seg.page) * seg.page;
        let b = self.blocks[u].clone();
        self.unmapped.remove(&(b.pool, b.ptr, u));
        if mapped < b.size {
            let rest = Block {
                ptr: b.ptr + mapped,
                size: b.size - mapped,
                prev: Some(u),
                ..b.clone()
            };
            self.blocks.push(rest);
            let r = self.blocks.len() - 1;
            if let Some(x) = b.next {
                self.blocks[x].prev = Some(r);
            }
            self.blocks[u].next = Some(r);
            self.blocks[u].size = mapped;
            self.unmapped.insert((b.pool, b.ptr + mapped, r));
        }
        self.blocks[u].mapped = true;
        self.add_reserved(mapped);
        self.events.push(SegmentEvent::Map {
            ptr: b.ptr,
            size: mapped,
        });
        self.merge_free_neighbours(u);
        self.free.insert(self.free_key(u));
        u
    }

    /// `try_merge_blocks` with both neighbours: those free and in the same mapped state as `idx`
    /// join it (taken out of their set).
    fn merge_free_neighbours(&mut self, idx: usize) {
        for neighbour in [self.blocks[idx].prev, self.blocks[idx].next] {
            let Some(n) = neighbour else { continue };
            let nb = self.blocks[n].clone();
            if nb.allocated || nb.mapped != self.blocks[idx].mapped {
                continue;
            }
            if nb.mapped {
                self.free.remove(&(nb.pool, nb.size, nb.ptr, n));
            } else {
                self.unmapped.remove(&(nb.pool, nb.ptr, n));
            }
            if self.blocks[idx].prev == Some(n) {
                self.blocks[idx].ptr = nb.ptr;
                self.blocks[idx].prev = nb.prev;
                if let Some(p) = nb.prev {
                    self.blocks[p].next = Some(idx);
                }
            } else {
                self.blocks[idx].next = nb.next;
                if let Some(x) = nb.next {
                    self.blocks[x].prev = Some(idx);
                }
            }
            self.blocks[idx].size += nb.size;
        }
    }

    /// Returns a block to its pool, merging it with free neighbours (`free_block`); freeing
    /// never unmaps.
    pub fn free(&mut self, id: BlockId) {
        let idx = id.0;
        assert!(self.blocks[idx].allocated, "block freed twice");
        self.blocks[idx].allocated = false;
        self.allocated -= self.blocks[idx].size;
        self.merge_free_neighbours(idx);
        self.free.insert(self.free_key(idx));
    }

    /// `release_cached_blocks`: every free, unsplit segment goes back to the driver; every whole
    /// page inside a free block of an expandable segment is unmapped.
    fn release_cached_blocks(&mut self) {
        let candidates: Vec<(Pool, u64, u64, usize)> = self
            .free
            .iter()
            .copied()
            .filter(|k| {
                let b = &self.blocks[k.3];
                b.segment.is_some() || (b.prev.is_none() && b.next.is_none())
            })
            .collect();
        for k in candidates {
            if self.blocks[k.3].segment.is_some() {
                self.unmap_block(k.3);
                continue;
            }
            self.free.remove(&k);
            self.reserved -= k.1;
            self.events.push(SegmentEvent::SegmentFree {
                ptr: k.2,
                size: k.1,
            });
        }
    }

    /// `unmap_block`: the whole pages inside the free block `idx` are unmapped; the pieces
    /// before and after them stay free and mapped; the unmapped range merges with unmapped
    /// neighbours. A segment left wholly unmapped is released.
    fn unmap_block(&mut self, idx: usize) {
        let b = self.blocks[idx].clone();
        let seg = self.segments[b.segment.expect("an expandable block")];
        let begin = seg.base + (b.ptr - seg.base).div_ceil(seg.page) * seg.page;
        let end = seg.base + (b.ptr + b.size - seg.base) / seg.page * seg.page;
        if end <= begin {
            return;
        }
        self.free.remove(&(b.pool, b.size, b.ptr, idx));
        if b.ptr < begin {
            self.blocks.push(Block {
                size: begin - b.ptr,
                next: Some(idx),
                ..b.clone()
            });
            let before = self.blocks.len() - 1;
            if let Some(p) = b.prev {
                self.blocks[p].next = Some(before);
            }
            self.blocks[idx].prev = Some(before);
            self.free.insert(self.free_key(before));
        }
        if end < b.ptr + b.size {
            self.blocks.push(Block {
                ptr: end,
                size: b.ptr + b.size - end,
                prev: Some(idx),
                ..b.clone()
            });
            let after = self.blocks.len() - 1;
            if let Some(n) = b.next {
                self.blocks[n].prev = Some(after);
            }
            self.blocks[idx].next = Some(after);
            self.free.insert(self.free_key(after));
        }
        let blk = &mut self.blocks[idx];
        blk.ptr = begin;
        blk.size = end - begin;
        blk.mapped = false;
        self.reserved -= end - begin;
        self.events.push(SegmentEvent::Unmap {
            ptr: begin,
            size: end - begin,
        });
        self.merge_free_neighbours(idx);
        let u = &self.blocks[idx];
        if u.prev.is_some() || u.next.is_some() {
            self.unmapped.insert((u.pool, u.ptr, idx));
        }
        // Wholly unmapped: `release_expandable_segment` gives its address space back.
    }

    /// Bytes currently held in segments (`memory_reserved`).
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// The most bytes ever held in segments (`max_memory_reserved`).
    pub fn peak_reserved(&self) -> u64 {
        self.peak_reserved
    }

    /// The bytes of a block handed out (its request rounded, and the rest of a segment it did
    /// not split off).
    pub fn block_size(&self, id: BlockId) -> u64 {
        self.blocks[id.0].size
    }

    /// Bytes currently handed out in blocks (`memory_allocated`, block-rounded).
    pub fn allocated(&self) -> u64 {
        self.allocated
    }

    /// The driver-level events so far.
    pub fn segment_events(&self) -> &[SegmentEvent] {
        &self.events
    }
}

/// The outcome of replaying a predicted tensor list through the allocator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SegmentReplay {
    /// `cudaMalloc`/`cudaFree` events in order.
    pub events: Vec<SegmentEvent>,
    /// The most bytes held in segments.
    pub peak_reserved: u64,
    /// Bytes held in segments at the end.
    pub reserved_at_end: u64,
    /// The first allocation that failed, with the name of its tensor.
    pub oom: Option<(String, Oom)>,
}

/// Replays a tensor list's allocations and frees on a fresh allocator (an empty cache, as with
/// `PYTORCH_NO_CUDA_MEMORY_CACHING` unset and nothing allocated before).
pub fn replay(tensors: &[Tensor], capacity: Option<u64>) -> SegmentReplay {
    let mut a = CachingAllocator::new(capacity);
    let mut ids: Vec<Option<BlockId>> = vec![None; tensors.len()];
    let mut oom = None;
    for e in events(tensors) {
        match e {
            Event::Alloc { tensor } if tensors[tensor].bytes > 0 => {
                match a.malloc(tensors[tensor].bytes) {
                    Ok(id) => ids[tensor] = Some(id),
                    Err(o) => {
                        oom = Some((tensors[tensor].name.clone(), o));
                        break;
                    }
                }
            }
            Event::Free { tensor } => {
                if let Some(id) = ids[tensor].take() {
                    a.free(id);
                }
            }
            Event::Alloc { .. } => {}
        }
    }
    SegmentReplay {
        events: a.segment_events().to_vec(),
        peak_reserved: a.peak_reserved(),
        reserved_at_end: a.reserved(),
        oom,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_read_from_a_trace_keeps_its_holes() {
        const MIB: u64 = 1 << 20;
        let base = 1 << 40;
        // One 100 MiB segment holding 30 MiB at its start and 20 MiB at 60 MiB: free holes of
        // 30 MiB and 20 MiB; and one 2 MiB segment of the small pool, empty.
        let (mut a, ids) = CachingAllocator::from_state(
            Some(102 * MIB),
            &[(base, 100 * MIB), (base + 200 * MIB, SMALL_BUFFER)],
            &[
                (base, 30 * MIB),
                (base + 60 * MIB, 20 * MIB),
                (base + 500 * MIB, MIB),
            ],
        );
        assert!(ids[0].is_some() && ids[1].is_some());
        assert_eq!(ids[2], None, "a block in no segment takes no part");
        assert_eq!(a.reserved(), 102 * MIB);
        assert_eq!(a.allocated(), 50 * MIB);
        // 40 MiB fits no hole and no new segment fits the limit, even after the empty small
        // segment went back: refused, though 50 MiB is free.
        let oom = a.malloc(40 * MIB).unwrap_err();
        assert_eq!(oom.segment, 40 * MIB);
        assert_eq!(a.reserved(), 100 * MIB);
        // Freeing the first block merges it with the hole after it: 60 MiB, which takes it.
        a.free(ids[0].unwrap());
        let big = a.malloc(40 * MIB).unwrap();
        assert_eq!(a.block_size(big), 40 * MIB);
        // Best fit: 18 MiB goes to the 20 MiB hole at the end, not the 20 MiB left at the start
        // (equal size: the lower address), whole since less than 1 MiB more would remain.
        let small = a.malloc(19 * MIB + 512).unwrap();
        assert_eq!(a.block_size(small), 20 * MIB);
        assert_eq!(a.reserved(), 100 * MIB, "no segment was added");
    }

    #[test]
    fn rounding_cases() {
        assert_eq!(
            rounding(1),
            Rounding {
                request: 1,
                block: 512,
                pool: Pool::Small,
                segment: 2 << 20
            }
        );
        assert_eq!(rounding(16).block, 512);
        assert_eq!(rounding(513).block, 1024);
        assert_eq!(
            rounding(792_576),
            Rounding {
                request: 792_576,
                block: 792_576,
                pool: Pool::Small,
                segment: 2 << 20
            }
        );
        assert_eq!(rounding(1 << 20).pool, Pool::Small);
        assert_eq!(
            rounding((1 << 20) + 1),
            Rounding {
                request: (1 << 20) + 1,
                block: (1 << 20) + 512,
                pool: Pool::Large,
                segment: 20 << 20
            }
        );
        assert_eq!(rounding(3_145_728).segment, 20 << 20);
        assert_eq!(rounding((10 << 20) - 512).segment, 20 << 20);
        assert_eq!(rounding(10 << 20).segment, 10 << 20);
        // 48.375 MiB rounds up to the next 2 MiB.
        assert_eq!(rounding(50_724_864).segment, 50 << 20);
        assert_eq!(rounding(25_362_432).segment, 26 << 20);
        assert_eq!(rounding(102_236_160).segment, 98 << 20);
        assert_eq!(rounding(0).segment, 0);
    }

    #[test]
    fn small_requests_share_a_segment_and_large_remainders_split_only_over_1mib() {
        let mut a = CachingAllocator::new(None);
        let x = a.malloc(1000).unwrap();
        let _y = a.malloc(1000).unwrap();
        assert_eq!(a.segment_events().len(), 1);
        a.free(x);
        // A 3 MiB request takes a 20 MiB segment and leaves a 17 MiB free block behind.
        let big = a.malloc(3 << 20).unwrap();
        assert_eq!(a.segment_events().len(), 2);
        let _z = a.malloc(2 << 20).unwrap();
        assert_eq!(
            a.segment_events().len(),
            2,
            "served from the 20 MiB segment's remainder"
        );
        a.free(big);
        // A 12 MiB segment with a 11.5 MiB request: the 0.5 MiB remainder is not split off.
        let mut b = CachingAllocator::new(None);
        let s = b.malloc(12 << 20).unwrap();
        b.free(s);
        let _t = b.malloc((11 << 20) + (1 << 19)).unwrap();
        assert_eq!(b.allocated(), 12 << 20);
    }

    const M: u64 = 1 << 20;

    /// `expandable_segments:True`: the large pool grows by 20 MiB pages at the end of one
    /// segment, splits any remainder, and prefers a block not followed by unmapped space.
    #[test]
    fn an_expandable_segment_grows_by_pages_and_splits_every_remainder() {
        let mut a = CachingAllocator::new(None).expandable();
        let x = a.malloc(100 * M).unwrap();
        assert_eq!(a.reserved(), 100 * M);
        // 30 MiB: two pages, the 10 MiB left split off.
        let _y = a.malloc(30 * M).unwrap();
        assert_eq!(a.reserved(), 140 * M);
        assert_eq!(a.allocated(), 130 * M);
        // 15 MiB: the free 10 MiB at the end grows by one page and is split again.
        let _z = a.malloc(15 * M).unwrap();
        assert_eq!(a.reserved(), 160 * M);
        // Freed, the first 100 MiB is a block of its own; a 10 MiB request is carved from it,
        // not from the 15 MiB at the end (which counts with the unmapped space after it).
        a.free(x);
        let w = a.malloc(10 * M).unwrap();
        assert_eq!(a.reserved(), 160 * M);
        a.free(w);
        assert!(
            a.segment_events()
                .iter()
                .all(|e| matches!(e, SegmentEvent::Map { size, .. } if size % (20 * M) == 0))
        );
        // A small request maps one 2 MiB page of the small pool's own segment.
        let _s = a.malloc(4096).unwrap();
        assert_eq!(a.reserved(), 162 * M);
    }

    /// Under a limit the request's segment size is checked before mapping; on a refusal the
    /// whole free pages are unmapped (a hole where the freed block was), the retry maps at the
    /// end, and a later request that fits the hole is mapped there, the lowest range.
    #[test]
    fn an_expandable_refusal_unmaps_free_pages_and_a_later_request_fills_the_hole() {
        let base = 1 << 32;
        let mut a = CachingAllocator::new(Some(200 * M)).expandable();
        let x = a.malloc(100 * M).unwrap();
        let _y = a.malloc(60 * M).unwrap();
        a.free(x);
        // 160 MiB mapped, 100 free: 120 more would pass 200 MiB, so the free 100 MiB are
        // unmapped first, then 120 MiB mapped after the 60.
        let _z = a.malloc(120 * M).unwrap();
        assert_eq!(a.reserved(), 180 * M);
        let events = a.segment_events().to_vec();
        assert_eq!(
            events[events.len() - 2..],
            [
                SegmentEvent::Unmap {
                    ptr: base,
                    size: 100 * M
                },
                SegmentEvent::Map {
                    ptr: base + 160 * M,
                    size: 120 * M
                }
            ]
        );
        // 20 MiB more reach the limit exactly (not past it): one page, in the hole.
        let w = a.malloc(20 * M).unwrap();
        assert_eq!(a.reserved(), 200 * M);
        assert_eq!(
            a.segment_events().last(),
            Some(&SegmentEvent::Map {
                ptr: base,
                size: 20 * M
            })
        );
        assert_eq!(a.block_size(w), 20 * M);
        assert!(a.malloc(2 * M).is_err());
    }

    #[test]
    fn a_failed_cudamalloc_releases_unsplit_cached_segments_and_retries() {
        let mut a = CachingAllocator::new(Some(100 << 20));
        let x = a.malloc(60 << 20).unwrap();
        a.free(x);
        // 60 MiB are cached; 50 MiB more would exceed 100 MiB, so the cache is released first.
        let _y = a.malloc(70 << 20).unwrap();
        assert!(
            matches!(a.segment_events()[1], SegmentEvent::SegmentFree { size, .. } if size == 60 << 20)
        );
        assert_eq!(a.reserved(), 70 << 20);
        assert!(a.malloc(40 << 20).is_err());
    }
}
