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
}

/// A request the simulated device could not satisfy even after releasing cached segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Oom {
    /// The segment size that could not be allocated.
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
    prev: Option<usize>,
    next: Option<usize>,
}

/// A single-stream simulation of the default caching allocator.
#[derive(Debug, Default)]
pub struct CachingAllocator {
    blocks: Vec<Block>,
    free: BTreeSet<(Pool, u64, u64, usize)>,
    next_ptr: u64,
    capacity: Option<u64>,
    reserved: u64,
    allocated: u64,
    peak_reserved: u64,
    events: Vec<SegmentEvent>,
}

impl CachingAllocator {
    /// An empty allocator; with `capacity`, `cudaMalloc` fails once segments would exceed it.
    pub fn new(capacity: Option<u64>) -> Self {
        CachingAllocator {
            capacity,
            next_ptr: 1 << 32,
            ..Default::default()
        }
    }

    /// Allocates a block for `request` bytes (`malloc`). Zero-byte requests are not supported by
    /// the simulation (PyTorch does not call the allocator for them).
    pub fn malloc(&mut self, request: u64) -> Result<BlockId, Oom> {
        let r = rounding(request.max(1));
        let found = self
            .free
            .range((r.pool, r.block, 0, 0)..)
            .next()
            .copied()
            .filter(|(p, ..)| *p == r.pool);
        let idx = match found {
            Some(key) => {
                self.free.remove(&key);
                key.3
            }
            None => {
                if self.capacity.is_some_and(|c| self.reserved + r.segment > c) {
                    self.release_cached_segments();
                    if self.capacity.is_some_and(|c| self.reserved + r.segment > c) {
                        return Err(Oom {
                            segment: r.segment,
                            reserved: self.reserved,
                            allocated: self.allocated,
                        });
                    }
                }
                let ptr = self.next_ptr;
                self.next_ptr += r.segment.next_multiple_of(ROUND_LARGE);
                self.reserved += r.segment;
                self.peak_reserved = self.peak_reserved.max(self.reserved);
                self.events.push(SegmentEvent::SegmentAlloc {
                    ptr,
                    size: r.segment,
                });
                self.blocks.push(Block {
                    ptr,
                    size: r.segment,
                    pool: r.pool,
                    allocated: false,
                    prev: None,
                    next: None,
                });
                self.blocks.len() - 1
            }
        };
        if should_split(r.pool, self.blocks[idx].size, r.block) {
            let b = self.blocks[idx].clone();
            let rest = Block {
                ptr: b.ptr + r.block,
                size: b.size - r.block,
                pool: b.pool,
                allocated: false,
                prev: Some(idx),
                next: b.next,
            };
            self.blocks.push(rest);
            let rest_idx = self.blocks.len() - 1;
            if let Some(n) = b.next {
                self.blocks[n].prev = Some(rest_idx);
            }
            self.blocks[idx].next = Some(rest_idx);
            self.blocks[idx].size = r.block;
            let rb = &self.blocks[rest_idx];
            self.free.insert((rb.pool, rb.size, rb.ptr, rest_idx));
        }
        self.blocks[idx].allocated = true;
        self.allocated += self.blocks[idx].size;
        Ok(BlockId(idx))
    }

    /// Returns a block to its pool, merging it with free neighbours (`free_block`).
    pub fn free(&mut self, id: BlockId) {
        let idx = id.0;
        assert!(self.blocks[idx].allocated, "block freed twice");
        self.blocks[idx].allocated = false;
        self.allocated -= self.blocks[idx].size;
        for neighbour in [self.blocks[idx].prev, self.blocks[idx].next] {
            let Some(n) = neighbour else { continue };
            if self.blocks[n].allocated {
                continue;
            }
            let nb = self.blocks[n].clone();
            self.free.remove(&(nb.pool, nb.size, nb.ptr, n));
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
        let b = &self.blocks[idx];
        self.free.insert((b.pool, b.size, b.ptr, idx));
    }

    /// `release_cached_blocks`: every free, unsplit segment goes back to the driver.
    fn release_cached_segments(&mut self) {
        let whole: Vec<(Pool, u64, u64, usize)> = self
            .free
            .iter()
            .copied()
            .filter(|k| self.blocks[k.3].prev.is_none() && self.blocks[k.3].next.is_none())
            .collect();
        for k in whole {
            self.free.remove(&k);
            self.reserved -= k.1;
            self.events.push(SegmentEvent::SegmentFree {
                ptr: k.2,
                size: k.1,
            });
        }
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
