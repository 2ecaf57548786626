//! The live set and the peak of a predicted tensor list.

use serde::Serialize;

use crate::Tensor;

/// The largest number of bytes live at once, and what was live then.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Peak {
    /// Bytes live at the peak (the sum of `live`'s tensors).
    pub bytes: u64,
    /// The step just after which the peak is reached (the first such step).
    pub step: usize,
    /// Indices into the tensor list of the tensors live at the peak, in allocation order.
    pub live: Vec<usize>,
}

/// Computes the peak of a tensor list: the first step after which the live bytes are largest.
///
/// This is the one place the peak is computed; every variant, the CLI and the sweep use it.
/// A tensor freed at step `s` no longer counts from `s` on, so a tensor freed before another is
/// allocated never counts together with it. An empty list has a peak of zero bytes.
pub fn peak(tensors: &[Tensor]) -> Peak {
    let last = tensors
        .iter()
        .flat_map(|t| std::iter::once(t.alloc_at).chain(t.freed_at))
        .max();
    let Some(last) = last else {
        return Peak {
            bytes: 0,
            step: 0,
            live: Vec::new(),
        };
    };
    let mut delta = vec![0i128; last + 2];
    for t in tensors {
        delta[t.alloc_at] += i128::from(t.bytes);
        if let Some(f) = t.freed_at {
            delta[f] -= i128::from(t.bytes);
        }
    }
    let (mut cur, mut best, mut best_step) = (0i128, -1i128, 0usize);
    for (s, d) in delta.iter().enumerate() {
        cur += d;
        if cur > best {
            best = cur;
            best_step = s;
        }
    }
    live_at(tensors, best_step)
}

/// The tensors live just after `step`, and their total.
pub fn live_at(tensors: &[Tensor], step: usize) -> Peak {
    let live: Vec<usize> = (0..tensors.len())
        .filter(|&i| tensors[i].is_live_after(step))
        .collect();
    Peak {
        bytes: live.iter().map(|&i| tensors[i].bytes).sum(),
        step,
        live,
    }
}

/// The sum of every tensor's bytes, as a formula that ignores lifetimes would count them.
pub fn naive_sum(tensors: &[Tensor]) -> u64 {
    tensors.iter().map(|t| t.bytes).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Timeline};

    #[test]
    fn a_tensor_freed_before_the_next_alloc_does_not_add_up() {
        let mut tl = Timeline::new();
        let a = tl.alloc("a", &[100], DType::F32, "t");
        let b = tl.alloc("b", &[10], DType::F32, "t");
        tl.free(a);
        let _c = tl.alloc("c", &[50], DType::F32, "t");
        tl.free(b);
        let t = tl.finish().unwrap();
        let p = peak(&t);
        assert_eq!(p.bytes, 440);
        assert_eq!(p.live, vec![0, 1]);
        assert_eq!(naive_sum(&t), 640);
        assert_eq!(live_at(&t, 3).bytes, 240);
        assert_eq!(peak(&[]).bytes, 0);
    }
}
