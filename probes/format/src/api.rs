//! The driver entry points vramtrace records, as stable numeric ids.
//!
//! The table is append-only: an id, once written into a trace, keeps its meaning forever.
//! A reader that meets an id it does not know shows it as `unknown(N)` instead of failing.

/// Which CUDA driver function produced an event (an index into [`API_NAMES`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Api(pub u16);

/// Names of the driver functions, indexed by [`Api`] id. Append only.
pub const API_NAMES: &[&str] = &[
    "unknown",
    "cuMemAlloc_v2",
    "cuMemAllocPitch_v2",
    "cuMemAllocManaged",
    "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocFromPoolAsync_ptsz",
    "cuMemFree_v2",
    "cuMemFreeAsync",
    "cuMemFreeAsync_ptsz",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemAllocHost_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuArrayCreate_v2",
    "cuArray3DCreate_v2",
    "cuArrayDestroy",
    "cuMemImportFromShareableHandle",
    "cuMemRetainAllocationHandle",
];

impl Api {
    /// The id of a driver function name, if it is in the table.
    pub fn from_name(name: &str) -> Option<Api> {
        API_NAMES
            .iter()
            .position(|n| *n == name)
            .map(|i| Api(i as u16))
    }

    /// The driver function's name (`unknown` for ids this reader does not know).
    pub fn name(self) -> &'static str {
        API_NAMES.get(self.0 as usize).copied().unwrap_or("unknown")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable() {
        // These ids are on disk in recorded traces: they must never move.
        assert_eq!(Api::from_name("cuMemAlloc_v2"), Some(Api(1)));
        assert_eq!(Api::from_name("cuMemFree_v2"), Some(Api(8)));
        assert_eq!(Api::from_name("cuMemCreate"), Some(Api(11)));
        assert_eq!(Api::from_name("cuArrayDestroy"), Some(Api(22)));
        assert_eq!(
            Api::from_name("cuMemImportFromShareableHandle"),
            Some(Api(23))
        );
        assert_eq!(Api::from_name("cuMemRetainAllocationHandle"), Some(Api(24)));
        assert_eq!(Api(999).name(), "unknown");
    }
}
