//! `vllm-0.20.1-mlp`: the dense MLP of Qwen3.5 / Qwen3.6 in vLLM 0.20.1, `Qwen2MoeMLP.forward`
//! (`vllm/model_executor/models/qwen2_moe.py`, imported as `Qwen3NextMLP` by `qwen3_5.py` and
//! `qwen3_next.py`), run eagerly on one chunk of tokens.
//!
//! `gate_up, _ = self.gate_up_proj(x)` allocates `[T, 2 * I / tp]`; `out = self.act_fn(gate_up)`
//! (`SiluAndMul`) allocates `[T, I / tp]`; `out, _ = self.down_proj(out)` allocates
//! `[T, hidden]`, after which the activation dies as `out` is rebound, and `gate_up` dies when the
//! method returns. Under `torch.compile` Inductor plans its own buffers (the seed notes show
//! `empty_strided_cuda((s18, 17408))`, the activation) and may reuse them; this model describes
//! the eager order. The all-reduce of the row-parallel `down_proj` at TP > 1 is not modelled.

use crate::{DType, ModelConfig, ModelError, Tensor, Timeline, tp_split};

/// The variant's name on the command line.
pub const NAME: &str = "vllm-0.20.1-mlp";

/// One dense MLP call on a chunk of tokens, on one rank.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FfnShape {
    /// Tokens in the chunk (vLLM's `max_num_batched_tokens` at most).
    pub tokens: u64,
    /// `hidden_size`.
    pub hidden: u64,
    /// `intermediate_size / tp`.
    pub intermediate: u64,
    /// Activation dtype.
    pub dtype: DType,
}

impl FfnShape {
    /// The dense MLP of `cfg`; MoE models without `intermediate_size` use the shared expert's size.
    pub fn from_config(
        cfg: &ModelConfig,
        tokens: u64,
        tp: u64,
        dtype: DType,
    ) -> Result<Self, ModelError> {
        let i = match (cfg.intermediate_size, &cfg.moe) {
            (_, Some(m)) if m.shared_expert_intermediate_size > 0 => {
                m.shared_expert_intermediate_size
            }
            (Some(i), _) => i,
            (None, _) => {
                return Err(ModelError::Invalid(
                    "the config has neither intermediate_size nor shared_expert_intermediate_size"
                        .into(),
                ));
            }
        };
        Ok(FfnShape {
            tokens,
            hidden: cfg.hidden_size,
            intermediate: tp_split("intermediate_size", i, tp)?,
            dtype,
        })
    }
}

/// The tensors one MLP call allocates, in allocation order.
pub fn tensors(s: &FfnShape) -> Result<Vec<Tensor>, ModelError> {
    if s.tokens == 0 {
        return Err(ModelError::Invalid("the chunk has no tokens".into()));
    }
    let mut tl = Timeline::new();
    let gate_up = tl.alloc(
        "gate_up",
        &[s.tokens, 2 * s.intermediate],
        s.dtype,
        "vllm-0.20.1 vllm/model_executor/models/qwen2_moe.py Qwen2MoeMLP.forward: gate_up, _ = self.gate_up_proj(x)",
    );
    let act = tl.alloc(
        "act (silu_and_mul)",
        &[s.tokens, s.intermediate],
        s.dtype,
        "vllm-0.20.1 vllm/model_executor/models/qwen2_moe.py Qwen2MoeMLP.forward: out = self.act_fn(gate_up)",
    );
    tl.alloc(
        "down",
        &[s.tokens, s.hidden],
        s.dtype,
        "vllm-0.20.1 vllm/model_executor/models/qwen2_moe.py Qwen2MoeMLP.forward: out, _ = self.down_proj(out)",
    );
    tl.free(act);
    tl.free(gate_up);
    tl.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peak;

    #[test]
    fn qwen36_chunk_of_4128() {
        let s = FfnShape {
            tokens: 4128,
            hidden: 5120,
            intermediate: 17408,
            dtype: DType::BF16,
        };
        let t = tensors(&s).unwrap();
        let got: Vec<u64> = t.iter().map(|t| t.bytes).collect();
        // The seed notes' "138 MiB" is the activation alone: 4128 x 17408 x 2 = 143,720,448 B.
        assert_eq!(got, [287_440_896, 143_720_448, 42_270_720]);
        assert_eq!(peak(&t).bytes, 473_432_064);
    }
}
