//! Lifetimes from the Python frames alone: phases, steps, and what each live tensor's line did.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::{Lifetime, PyFrame, is_probe_frame, is_torch_machinery, site_of};

/// Steps of a program, found from its Python frames, and the lifetime of what is live.
///
/// - A tensor's **phase** is its two outermost Python frames that are not PyTorch's machinery
///   (`<module>:115` → `main:108`): loading, a warm-up and the run are different phases; a
///   thread is its own phase.
/// - A phase's **steps**: a step begins each time the phase's first allocating line allocates
///   again (a prefill chunk's first tensor, a decode step's input).
/// - At a moment: a tensor of a phase that ended before the latest phase began is
///   [`Lifetime::Persistent`] when the latest phase steps (a loop) — [`Lifetime::Leftover`] when
///   under a tenth of that phase's allocations are live — else unknown; a tensor of a phase
///   without steps is unknown. Otherwise, by its line within its phase: a line that keeps
///   tensors of two or more earlier steps is [`Lifetime::Accumulating`] (its current step's
///   tensors are the newest entries); a line whose tensors are never freed within their own
///   step but in the next one (replaced), or that keeps two or more of the previous step before
///   any was freed, is [`Lifetime::Carried`] (a state per layer; the current step's are the
///   replacements); otherwise a line's only tensor of the previous step is
///   [`Lifetime::Lingering`] (a local variable the loop has not reassigned yet:
///   `samples/h200/torch-oom`'s `vc`), an older one [`Lifetime::Kept`], the current step's
///   [`Lifetime::WithinStep`].
#[derive(Debug, Clone, Default)]
pub struct Steps {
    phases: Vec<PhaseState>,
    latest: Option<usize>,
    seq: u64,
    live: BTreeMap<u64, LiveEntry>,
    /// Per phase and line: frees within the tensor's own step, frees in the step after.
    frees: BTreeMap<(usize, Arc<str>), (u32, u32)>,
    /// Phase index by phase key.
    phase_index: HashMap<String, usize>,
    /// Phase and line by the caller's key for a stack ([`Steps::alloc_keyed`]).
    by_stack: HashMap<u64, Option<(usize, Arc<str>)>>,
}

#[derive(Debug, Clone)]
struct PhaseState {
    /// Allocations made in it, and of those still live.
    made: u32,
    live: u32,
    first_site: String,
    step: u32,
    first_seq: u64,
    last_seq: u64,
}

#[derive(Debug, Clone)]
struct LiveEntry {
    phase: usize,
    step: u32,
    site: Arc<str>,
}

/// The phase key of a Python stack (innermost first): its two outermost frames that are not
/// the probe's or PyTorch's machinery, as `file:line`.
pub fn phase_of(python: &[PyFrame<'_>]) -> String {
    let own: Vec<&PyFrame<'_>> = python
        .iter()
        .filter(|f| !is_probe_frame(f.file, f.function) && !is_torch_machinery(f.file))
        .collect();
    own.iter()
        .rev()
        .take(2)
        .map(|f| format!("{}:{}", f.file, f.line))
        .collect::<Vec<_>>()
        .join(" > ")
}

impl Steps {
    /// Nothing seen.
    pub fn new() -> Steps {
        Steps::default()
    }

    /// A tensor (or allocation) `id` made with these Python frames (without any, it is not
    /// followed: its lifetime stays unknown).
    pub fn alloc(&mut self, id: u64, python: &[PyFrame<'_>]) {
        let found = self.place(python);
        self.record(id, found);
    }

    /// As [`Steps::alloc`], with the phase and line of `stack` (any key that names one Python
    /// stack, such as a process's stack id) worked out once: `python` is read only the first
    /// time a key is seen.
    pub fn alloc_keyed<'a>(
        &mut self,
        id: u64,
        stack: u64,
        python: impl FnOnce() -> Vec<PyFrame<'a>>,
    ) {
        let found = match self.by_stack.get(&stack) {
            Some(f) => f.clone(),
            None => {
                let f = self.place(&python());
                self.by_stack.insert(stack, f.clone());
                f
            }
        };
        self.record(id, found);
    }

    /// The phase (created if new) and the line of a stack; `None` without a Python frame.
    fn place(&mut self, python: &[PyFrame<'_>]) -> Option<(usize, Arc<str>)> {
        if python.iter().all(|f| is_probe_frame(f.file, f.function)) {
            return None;
        }
        let key = phase_of(python);
        let site: Arc<str> = site_of(python, &[]).into();
        let phase = match self.phase_index.get(&key) {
            Some(&i) => i,
            None => {
                self.phases.push(PhaseState {
                    made: 0,
                    live: 0,
                    first_site: site.to_string(),
                    step: 0,
                    first_seq: 0,
                    last_seq: 0,
                });
                let i = self.phases.len() - 1;
                self.phase_index.insert(key, i);
                i
            }
        };
        Some((phase, site))
    }

    fn record(&mut self, id: u64, found: Option<(usize, Arc<str>)>) {
        self.free(id);
        let Some((phase, site)) = found else {
            return;
        };
        self.seq += 1;
        let p = &mut self.phases[phase];
        if p.first_seq == 0 {
            p.first_seq = self.seq;
        } else if *p.first_site == *site {
            p.step += 1;
        }
        p.last_seq = self.seq;
        p.made += 1;
        p.live += 1;
        self.latest = Some(phase);
        let step = p.step;
        self.live.insert(id, LiveEntry { phase, step, site });
    }

    /// `id` freed.
    pub fn free(&mut self, id: u64) {
        if let Some(e) = self.live.remove(&id) {
            let ph = &mut self.phases[e.phase];
            ph.live = ph.live.saturating_sub(1);
            let now = ph.step;
            let f = self.frees.entry((e.phase, e.site)).or_default();
            if now == e.step {
                f.0 += 1;
            } else if now == e.step + 1 {
                f.1 += 1;
            }
        }
    }

    /// The current step of the latest phase (0 before any).
    pub fn step(&self) -> u32 {
        self.latest.map_or(0, |p| self.phases[p].step)
    }

    /// The lifetime of every live id, now.
    pub fn lifetimes(&self) -> BTreeMap<u64, Lifetime> {
        let Some(latest) = self.latest else {
            return BTreeMap::new();
        };
        // Before the first step means before a loop: only when the latest phase steps.
        let stepping = self.phases[latest].step > 0;
        let began = self.phases[latest].first_seq;
        // Per phase and line: the earlier steps it still holds tensors of, how many of the
        // previous step, and how many live in all.
        let mut held: BTreeMap<(usize, &str), (BTreeSet<u32>, u32, u32)> = BTreeMap::new();
        for e in self.live.values() {
            let now = self.phases[e.phase].step;
            let k = held.entry((e.phase, &*e.site)).or_default();
            k.2 += 1;
            if e.step < now {
                k.0.insert(e.step);
                if e.step + 1 == now {
                    k.1 += 1;
                }
            }
        }
        self.live
            .iter()
            .map(|(id, e)| {
                let p = &self.phases[e.phase];
                let l = if p.last_seq < began {
                    if !stepping {
                        Lifetime::Unknown
                    } else if u64::from(p.live) * 10 < u64::from(p.made) {
                        Lifetime::Leftover
                    } else {
                        Lifetime::Persistent
                    }
                } else if p.step == 0 {
                    // A phase without steps (straight-line code) says nothing.
                    Lifetime::Unknown
                } else {
                    let (steps, previous, live) = held
                        .get(&(e.phase, &*e.site))
                        .map_or((0, 0, 0), |(s, n, l)| (s.len() as u32, *n, *l));
                    let (within, next) = self
                        .frees
                        .get(&(e.phase, e.site.clone()))
                        .copied()
                        .unwrap_or_default();
                    // Replaced each step, never freed within one: a state per layer.
                    let carried = within == 0 && (next > 0 || previous >= 2) && steps <= 1;
                    match steps {
                        n if n >= 2 => Lifetime::Accumulating { steps: n },
                        _ if carried && (steps == 1 || next > 0) => {
                            Lifetime::Carried { per_step: live }
                        }
                        1 if previous == 1 && e.step + 1 == p.step => Lifetime::Lingering,
                        _ if e.step < p.step => Lifetime::Kept {
                            steps_ago: p.step - e.step,
                        },
                        _ => Lifetime::WithinStep,
                    }
                };
                (*id, l)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py<'a>(file: &'a str, function: &'a str, line: u32) -> PyFrame<'a> {
        PyFrame {
            file,
            function,
            line,
        }
    }

    /// The chunked prefill of scripts/validate/torch_prefill.py, in small: weights made in
    /// `main:103`, then chunks in `main:108`, each starting at line 53; a GDN state replaced
    /// each chunk; K/V kept by every chunk; activations freed.
    #[test]
    fn steps_give_lifetimes() {
        let s = "/w/torch_prefill.py";
        let run = |line: u32| {
            vec![
                py(s, "prefill", line),
                py(s, "main", 108),
                py(s, "<module>", 115),
            ]
        };
        let mut st = Steps::new();
        st.alloc(
            1,
            &[
                py(s, "w", 33),
                py(s, "make_layers", 37),
                py(s, "main", 103),
                py(s, "<module>", 115),
            ],
        );
        // Per chunk: x (the previous x dropped after), then per layer the K/V kept, the
        // layer's state replaced, an activation freed, and `vc` reassigned (the previous one
        // dropped after); chunk 0 also keeps one tensor of line 90 for good.
        // A warm-up (main:104) that frees all but one of what it makes.
        let warm = |line: u32| vec![py(s, "prefill", line), py(s, "main", 104)];
        for i in 0..20 {
            st.alloc(50 + i, &warm(55));
            if i > 0 {
                st.free(50 + i);
            }
        }
        let mut states = [None, None];
        let mut x = None;
        let mut vc = None;
        let mut id = 100;
        let mut next = || {
            id += 1;
            id
        };
        for chunk in 0..3 {
            let n = next();
            st.alloc(n, &run(53));
            if let Some(old) = x.replace(n) {
                st.free(old);
            }
            // x = x + ...: the chunk's first x is dropped within the chunk.
            let n = next();
            st.alloc(n, &run(79));
            st.free(x.replace(n).unwrap());
            for state in &mut states {
                st.alloc(next(), &run(55));
                let n = next();
                st.alloc(n, &run(64));
                if let Some(old) = state.replace(n) {
                    st.free(old);
                }
                let n = next();
                st.alloc(n, &run(80));
                st.free(n);
                let n = next();
                st.alloc(n, &run(73));
                if let Some(old) = vc.replace(n) {
                    st.free(old);
                }
            }
            if chunk == 0 {
                st.alloc(900, &run(90));
            }
        }
        assert_eq!(st.step(), 2);
        // The fourth chunk begins and layer 0 runs up to its activation, which is live.
        st.alloc(500, &run(53));
        st.free(x.unwrap());
        st.alloc(501, &run(55));
        st.alloc(502, &run(64));
        st.free(states[0].replace(502).unwrap());
        st.alloc(503, &run(80));
        let l = st.lifetimes();
        assert_eq!(l[&1], Lifetime::Persistent);
        assert_eq!(l[&50], Lifetime::Leftover);
        // K/V: 2 per chunk, 3 chunks done, and the current chunk's.
        let kv: Vec<u64> = l
            .iter()
            .filter(|(_, v)| **v == Lifetime::Accumulating { steps: 3 })
            .map(|(k, _)| *k)
            .collect();
        assert_eq!(kv, [103, 107, 113, 117, 123, 127, 501]);
        // Layer 1's state of chunk 3 and layer 0's replacement: carried.
        assert_eq!(states, [Some(502), Some(128)]);
        assert_eq!(l[&128], Lifetime::Carried { per_step: 2 });
        assert_eq!(l[&502], Lifetime::Carried { per_step: 2 });
        // The last `vc` of chunk 3, not yet reassigned: lingering.
        assert_eq!(vc, Some(130));
        assert_eq!(l[&130], Lifetime::Lingering);
        assert_eq!(l[&900], Lifetime::Kept { steps_ago: 3 });
        assert_eq!(l[&500], Lifetime::WithinStep);
        assert_eq!(l[&503], Lifetime::WithinStep);
        assert_eq!(l.len(), 15);
    }
}
