//! Fake device virtual addresses. Nothing is mapped behind them: device memory
//! of 24–141 GiB cannot be backed by the host, and no caller may dereference a
//! device pointer anyway.

use std::collections::BTreeMap;

/// First address of device 0's range. Far below where Linux places shared
/// libraries, thread stacks and the heap (0x55.., 0x7f..), so a real host
/// pointer (pinned memory is real) is never mistaken for a device one.
pub(crate) const ARENA_BASE: u64 = 0x1000_0000_0000;
/// Size of each device's range: 8 TiB, twice the largest capacity, so
/// address-space reservations and fragmentation do not run it out first.
pub(crate) const ARENA_SIZE: u64 = 1 << 43;

/// Rounds `value` up to a multiple of `align` (a power of two); `None` on overflow.
pub(crate) fn align_up(value: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    Some(value.checked_add(align - 1)? & !(align - 1))
}

/// One device's address range and the parts of it in use.
///
/// Placement is next-fit: the search starts where the previous one ended and
/// wraps around once, so a freed address is handed out again only after the
/// rest of the range has been tried, the way a trace reader should expect
/// addresses to be reused: eventually, never while live.
#[derive(Debug)]
pub(crate) struct AddressSpace {
    base: u64,
    end: u64,
    cursor: u64,
    /// Start → length of every range in use.
    used: BTreeMap<u64, u64>,
}

impl AddressSpace {
    /// The range of device `ordinal`.
    pub(crate) fn for_device(ordinal: usize) -> Self {
        let base = ARENA_BASE + ordinal as u64 * ARENA_SIZE;
        Self::new(base, base + ARENA_SIZE)
    }

    /// An address space covering `base..end`.
    pub(crate) fn new(base: u64, end: u64) -> Self {
        Self {
            base,
            end,
            cursor: base,
            used: BTreeMap::new(),
        }
    }

    /// Whether `addr` lies in this space's range (used or not).
    pub(crate) fn covers(&self, addr: u64) -> bool {
        (self.base..self.end).contains(&addr)
    }

    /// Takes `len` bytes aligned to `align` (a power of two); `None` when no gap is large enough.
    pub(crate) fn allocate(&mut self, len: u64, align: u64) -> Option<u64> {
        if len == 0 || len > self.end - self.base {
            return None;
        }
        let mut candidate = align_up(self.cursor, align)?;
        let mut wrapped = false;
        loop {
            let fits = candidate
                .checked_add(len)
                .is_some_and(|end| end <= self.end);
            if !fits {
                if wrapped {
                    return None;
                }
                wrapped = true;
                candidate = align_up(self.base, align)?;
                continue;
            }
            match self.conflict(candidate, len) {
                Some(conflict_end) => candidate = align_up(conflict_end, align)?,
                None => {
                    self.used.insert(candidate, len);
                    self.cursor = candidate + len;
                    return Some(candidate);
                }
            }
        }
    }

    /// Takes exactly `addr..addr + len` if it is inside the range and free.
    pub(crate) fn allocate_at(&mut self, addr: u64, len: u64) -> bool {
        let inside = addr >= self.base && addr.checked_add(len).is_some_and(|end| end <= self.end);
        if len == 0 || !inside || self.conflict(addr, len).is_some() {
            return false;
        }
        self.used.insert(addr, len);
        true
    }

    /// Gives back the range starting at `addr`; returns its length.
    pub(crate) fn release(&mut self, addr: u64) -> Option<u64> {
        self.used.remove(&addr)
    }

    /// The end of a used range overlapping `start..start + len`, if there is one.
    fn conflict(&self, start: u64, len: u64) -> Option<u64> {
        let end = start + len;
        if let Some((&s, &l)) = self.used.range(..=start).next_back()
            && s + l > start
        {
            return Some(s + l);
        }
        if let Some((&s, &l)) = self.used.range(start..).next()
            && s < end
        {
            return Some(s + l);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_aligned_and_disjoint() {
        let mut space = AddressSpace::new(0x1000, 0x10_0000);
        let a = space.allocate(100, 512).unwrap();
        let b = space.allocate(1000, 512).unwrap();
        assert_eq!(a, 0x1000);
        assert_eq!(b, 0x1000 + 512);
        assert_eq!(a % 512, 0);
        assert_eq!(b % 512, 0);
    }

    #[test]
    fn freed_addresses_come_back_only_after_wrapping() {
        let mut space = AddressSpace::new(0, 4096);
        let a = space.allocate(1024, 1024).unwrap();
        let b = space.allocate(1024, 1024).unwrap();
        space.release(a);
        // Next-fit: the gap at `a` is skipped while the tail still has room.
        assert_eq!(space.allocate(1024, 1024), Some(2048));
        assert_eq!(space.allocate(1024, 1024), Some(3072));
        // Then the search wraps to the freed gap; `b` stays taken.
        assert_eq!(space.allocate(1024, 1024), Some(a));
        assert_eq!(space.allocate(1024, 1024), None);
        assert_eq!(space.release(b), Some(1024));
        assert_eq!(space.allocate(1024, 1024), Some(b));
    }

    #[test]
    fn exhaustion_and_fixed_placement() {
        let mut space = AddressSpace::new(0, 4096);
        assert_eq!(space.allocate(8192, 512), None);
        assert!(space.allocate_at(1024, 1024));
        assert!(!space.allocate_at(1536, 1024));
        assert!(!space.allocate_at(4000, 1024));
        assert_eq!(space.allocate(2048, 2048), Some(2048));
        assert_eq!(space.allocate(2048, 2048), None);
        assert!(space.covers(0) && space.covers(4095) && !space.covers(4096));
    }

    #[test]
    fn device_ranges_do_not_overlap() {
        let first = AddressSpace::for_device(0);
        let last = AddressSpace::for_device(crate::config::MAX_DEVICES - 1);
        assert_eq!(first.base, 0x1000_0000_0000);
        assert!(first.end <= AddressSpace::for_device(1).base);
        // Every device address stays below where Linux maps PIE binaries.
        assert!(last.end <= 0x5000_0000_0000);
    }
}
