//! Predicted tensors and the timeline that orders their allocations and frees.

use serde::Serialize;

use crate::{DType, ModelError};

/// One tensor a kernel allocates, in the order the upstream code allocates it.
///
/// `alloc_at` and `freed_at` are steps on one timeline shared by every allocation and free of a
/// prediction, so that the live set at any moment, and the order a trace must show, follow from
/// the list alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Tensor {
    /// The tensor's name in the upstream code (`A`, `h`, `softmax_lse`).
    pub name: String,
    /// Its shape, outermost dimension first.
    pub shape: Vec<u64>,
    /// Its element type.
    pub dtype: DType,
    /// Its size in bytes: the product of the shape times the element size.
    pub bytes: u64,
    /// The step at which it is allocated.
    pub alloc_at: usize,
    /// The step at which it is freed, or `None` when it outlives the call (returned to the caller).
    pub freed_at: Option<usize>,
    /// The upstream file, line and version the allocation was read from.
    pub source: &'static str,
    /// The PyTorch operator the tensor is an output of, as the dispatcher names it
    /// (`aten::empty_like`), when the model knows it: what an operator's description of the
    /// allocation (`vramtrace run --torch-shapes`) must name for its shape to be evidence. Read
    /// from the citation when it is a PyTorch factory call in Python ([`factory_operator`]),
    /// or set by the model when the tensor is made below a Python-visible operator
    /// ([`Timeline::inside_operator`]: FlashAttention's outputs are made inside
    /// `aten::_flash_attention_forward`); `None` otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
}

/// PyTorch's factory functions, whose call in a model's citation names the operator the
/// allocation is an output of (`torch.empty_like(v)`: `aten::empty_like`; `k.new_empty(..)`:
/// `aten::new_empty`).
const FACTORIES: [&str; 14] = [
    "empty",
    "empty_like",
    "empty_strided",
    "zeros",
    "zeros_like",
    "ones",
    "ones_like",
    "full",
    "full_like",
    "new_empty",
    "new_empty_strided",
    "new_zeros",
    "new_ones",
    "new_full",
];

/// The operator a citation names, when it cites a Python line (`file.py:LINE`) whose call is a
/// PyTorch factory function: `fla-0.6.0 fla/ops/common/chunk_o.py:565 torch.empty_like(v)` →
/// `aten::empty_like`, `... rstd = torch.empty((T,), float32)` → `aten::empty`. A C++ line, a
/// line without a number, or any other call names none.
pub fn factory_operator(source: &str) -> Option<String> {
    let mut words = source.split_whitespace();
    words.find(|w| {
        w.split_once(':').is_some_and(|(file, line)| {
            file.ends_with(".py") && !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit())
        })
    })?;
    let call: String = words.collect::<Vec<_>>().join(" ");
    let callee = call.split('(').next()?.rsplit(['=', ' ']).next()?.trim();
    let name = callee.rsplit('.').next()?;
    FACTORIES.contains(&name).then(|| format!("aten::{name}"))
}

impl Tensor {
    /// Whether the tensor is live just after `step` has happened.
    pub fn is_live_after(&self, step: usize) -> bool {
        self.alloc_at <= step && self.freed_at.is_none_or(|f| f > step)
    }

    /// `"[4128, 48, 64]"`, the shape as PyTorch prints it.
    pub fn shape_string(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(u64::to_string).collect();
        format!("[{}]", dims.join(", "))
    }
}

/// What happens at one step of a prediction's timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Event {
    /// The tensor at this index of the list is allocated.
    Alloc {
        /// Index into the tensor list.
        tensor: usize,
    },
    /// The tensor at this index of the list is freed.
    Free {
        /// Index into the tensor list.
        tensor: usize,
    },
}

/// A handle to a tensor being recorded on a [`Timeline`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorId(usize);

/// Records allocations and frees in program order and numbers them.
///
/// Every model variant describes its kernel as a sequence of `alloc` and `free` calls in the order
/// the upstream code performs them; the timeline turns that into a [`Tensor`] list.
#[derive(Debug, Default)]
pub struct Timeline {
    tensors: Vec<Tensor>,
    step: usize,
    /// The first tensor whose size does not fit, in words; [`Timeline::finish`] returns it.
    too_large: Option<String>,
}

impl Timeline {
    /// An empty timeline.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records the allocation of a tensor of `shape` and `dtype`.
    pub fn alloc(
        &mut self,
        name: &str,
        shape: &[u64],
        dtype: DType,
        source: &'static str,
    ) -> TensorId {
        // Exact or refused: the product is taken in 128 bits (checked), and a size past
        // MAX_BYTES is recorded as the error `finish` returns, never wrapped.
        let bytes = shape
            .iter()
            .try_fold(u128::from(dtype.size_bytes()), |acc, &d| {
                acc.checked_mul(u128::from(d))
            });
        let bytes = match bytes {
            Some(b) if b <= u128::from(crate::MAX_BYTES) => b as u64,
            other => {
                if self.too_large.is_none() {
                    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
                    let size = match other {
                        Some(b) => format!("{b} bytes"),
                        None => "more than 2^128 bytes".to_string(),
                    };
                    self.too_large = Some(format!(
                        "tensor {name} {dtype}[{}] would take {size}, more than the {} bytes (4 EiB) the models count; no device holds it: check the token count and the config's sizes",
                        dims.join(", "),
                        crate::MAX_BYTES
                    ));
                }
                0
            }
        };
        self.tensors.push(Tensor {
            name: name.to_string(),
            shape: shape.to_vec(),
            dtype,
            bytes,
            alloc_at: self.step,
            freed_at: None,
            source,
            op: factory_operator(source),
        });
        self.step += 1;
        TensorId(self.tensors.len() - 1)
    }

    /// Says that every tensor recorded so far is made inside the Python-visible operator `op`
    /// (`aten::_flash_attention_forward`): the operator a description of its allocation names.
    pub fn inside_operator(&mut self, op: &str) {
        for t in &mut self.tensors {
            t.op = Some(op.to_string());
        }
    }

    /// Records the free of a tensor recorded earlier.
    ///
    /// # Panics
    /// When the tensor was already freed: a model that does so has a bug.
    pub fn free(&mut self, id: TensorId) {
        let t = &mut self.tensors[id.0];
        assert!(t.freed_at.is_none(), "tensor {} freed twice", t.name);
        t.freed_at = Some(self.step);
        self.step += 1;
    }

    /// The recorded tensors, in allocation order; an error naming the first tensor whose size
    /// is past [`crate::MAX_BYTES`], or when all of them together are (so every sum of a
    /// prediction, its peak among them, is exact).
    pub fn finish(self) -> Result<Vec<Tensor>, ModelError> {
        if let Some(e) = self.too_large {
            return Err(ModelError::TooLarge(e));
        }
        let total = self
            .tensors
            .iter()
            .fold(0u128, |acc, t| acc + u128::from(t.bytes));
        if total > u128::from(crate::MAX_BYTES) {
            return Err(ModelError::TooLarge(format!(
                "the {} tensors together would take {total} bytes, more than the {} bytes (4 EiB) the models count; check the token count and the config's sizes",
                self.tensors.len(),
                crate::MAX_BYTES
            )));
        }
        Ok(self.tensors)
    }
}

/// The allocation and free events of a tensor list, in timeline order.
pub fn events(tensors: &[Tensor]) -> Vec<Event> {
    let mut ev: Vec<(usize, Event)> = Vec::with_capacity(tensors.len() * 2);
    for (i, t) in tensors.iter().enumerate() {
        ev.push((t.alloc_at, Event::Alloc { tensor: i }));
        if let Some(f) = t.freed_at {
            ev.push((f, Event::Free { tensor: i }));
        }
    }
    ev.sort_by_key(|(s, _)| *s);
    ev.into_iter().map(|(_, e)| e).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factory_calls_in_python_name_their_operator() {
        let op = |s| factory_operator(s);
        assert_eq!(
            op("fla-0.6.0 fla/ops/common/chunk_o.py:565 torch.empty_like(v)").as_deref(),
            Some("aten::empty_like")
        );
        assert_eq!(
            op("fla-0.6.0 fla/modules/norm/l2norm.py:128 rstd = torch.empty((T,), float32)")
                .as_deref(),
            Some("aten::empty")
        );
        assert_eq!(
            op("vllm-0.20.1 vllm/model_executor/layers/fla/ops/chunk_delta_h.py:332 k.new_empty(B, NT, H, V, K)")
                .as_deref(),
            Some("aten::new_empty")
        );
        // A C++ line, a line without its number, a call that is not a factory: none.
        assert_eq!(
            op("fa-2.8.3 csrc/flash_attn/flash_api.cpp:643 out = torch::empty_like(q)"),
            None
        );
        assert_eq!(
            op(
                "vllm-0.20.1 vllm/model_executor/models/qwen2_moe.py Qwen2MoeMLP.forward: gate_up, _ = self.gate_up_proj(x)"
            ),
            None
        );
        assert_eq!(op("x.py:3 y = self.proj(x)"), None);
    }

    #[test]
    fn a_size_past_the_cap_names_the_tensor_and_is_never_wrapped() {
        let mut tl = Timeline::new();
        tl.alloc("h", &[1 << 42, 48, 128, 128], DType::BF16, "test");
        let e = tl.finish().unwrap_err().to_string();
        assert!(
            e.starts_with("tensor h bfloat16[4398046511104, 48, 128, 128] would take 6917529027641081856 bytes"),
            "{e}"
        );
        let mut tl = Timeline::new();
        tl.alloc("x", &[u64::MAX, u64::MAX, u64::MAX], DType::F32, "test");
        assert!(
            tl.finish()
                .unwrap_err()
                .to_string()
                .contains("more than 2^128 bytes")
        );
        // Each fits, the sum does not.
        let mut tl = Timeline::new();
        for _ in 0..5 {
            tl.alloc("a", &[1 << 60], DType::F8, "test");
        }
        assert!(
            tl.finish()
                .unwrap_err()
                .to_string()
                .starts_with("the 5 tensors together")
        );
    }

    #[test]
    fn timeline_numbers_allocs_and_frees_in_order() {
        let mut tl = Timeline::new();
        let a = tl.alloc("a", &[2, 3], DType::F32, "test");
        let b = tl.alloc("b", &[4], DType::BF16, "test");
        tl.free(a);
        let _ = b;
        let t = tl.finish().unwrap();
        assert_eq!(t[0].bytes, 24);
        assert_eq!(t[1].bytes, 8);
        assert_eq!((t[0].alloc_at, t[0].freed_at), (0, Some(2)));
        assert_eq!((t[1].alloc_at, t[1].freed_at), (1, None));
        assert_eq!(
            events(&t),
            vec![
                Event::Alloc { tensor: 0 },
                Event::Alloc { tensor: 1 },
                Event::Free { tensor: 0 }
            ]
        );
        assert_eq!(t[0].shape_string(), "[2, 3]");
    }
}
