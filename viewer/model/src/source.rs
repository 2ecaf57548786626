//! Where the live view's data comes from.

use std::collections::VecDeque;

use crate::model::{LiveSnapshot, SnapshotQuery, Update};

/// A supply of view-model updates: the library implements it over a growing
/// trace directory (`DirSource`, src/live.rs; the CLI adds NVML); tests use
/// [`ScriptedSource`].
///
/// Both methods are called from the event loop between frames, so they
/// should return quickly: do the reading in small steps, or on a thread that
/// sends its results over a channel. Problems (a damaged file, no traces
/// yet) are reported as [`Update::Notice`], not as errors: the view goes on.
pub trait LiveSource {
    /// Updates since the last call, in order. Samples should already be
    /// aggregated to a few per device per call (the view draws, it does not
    /// replay): one sample per device per call plus the peak moments is plenty.
    fn poll(&mut self) -> Vec<Update>;

    /// What was live at the query's time, largest first; `None` if unknown.
    fn snapshot(&mut self, query: &SnapshotQuery) -> Option<LiveSnapshot>;
}

/// A source that plays back prepared batches, one per [`LiveSource::poll`],
/// and answers snapshot queries with the latest prepared snapshot at or
/// before the queried time.
#[derive(Debug, Clone, Default)]
pub struct ScriptedSource {
    batches: VecDeque<Vec<Update>>,
    snapshots: Vec<LiveSnapshot>,
    queries: Vec<SnapshotQuery>,
}

impl ScriptedSource {
    /// A source that will give `batches`, one per poll, then nothing.
    pub fn new(batches: Vec<Vec<Update>>) -> Self {
        Self {
            batches: batches.into(),
            snapshots: Vec::new(),
            queries: Vec::new(),
        }
    }

    /// Adds snapshots to answer queries with (any order).
    pub fn with_snapshots(mut self, mut snapshots: Vec<LiveSnapshot>) -> Self {
        self.snapshots.append(&mut snapshots);
        self.snapshots.sort_by(|a, b| a.time_s.total_cmp(&b.time_s));
        self
    }

    /// The queries asked so far, in order.
    pub fn queries(&self) -> &[SnapshotQuery] {
        &self.queries
    }

    /// Batches not yet polled.
    pub fn remaining(&self) -> usize {
        self.batches.len()
    }
}

impl LiveSource for ScriptedSource {
    fn poll(&mut self) -> Vec<Update> {
        self.batches.pop_front().unwrap_or_default()
    }

    fn snapshot(&mut self, query: &SnapshotQuery) -> Option<LiveSnapshot> {
        self.queries.push(*query);
        let after = self.snapshots.partition_point(|s| s.time_s <= query.time_s);
        after.checked_sub(1).map(|i| self.snapshots[i].clone())
    }
}
