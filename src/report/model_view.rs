//! What a model says beside a trace's step, as the report's triage and `report --json` carry it:
//! the whole-step model's or an engine planner's view of the step ([`ModelView`]), its fit to a
//! peak without a failure ([`PeakFit`]), and the levers it predicts ([`Lever`]). Kept apart from
//! the triage that computes them so that the planners' views (`engine_view.rs`) and the triage
//! both build them without importing each other.

use serde::Serialize;
use vramtrace_models::ModelError;
use vramtrace_models::engine::Part;
use vramtrace_models::engine::transformers_5::Attention;
use vramtrace_models::{
    ChunkFrontier, ContextFrontier, KnownParts, Limit, Residuals, Runtime, ServingShape,
};

/// The whole-step model beside the failing step.
#[derive(Debug, Clone, Serialize)]
pub struct ModelView {
    /// The program the step was modelled as.
    pub runtime: Runtime,
    /// The engine's planner that predicted this view (`models/src/engine/`); absent for the
    /// whole-step model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<&'static str>,
    /// How the planner ran the traced program, as the trace shows it (absent for the whole-step
    /// model).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub planner: Option<PlannerSettings>,
    /// Every part of the step with where its figure comes from: `predicted` from the config and
    /// the flags, `copied` from this trace (which then agrees with it by construction).
    pub parts: Vec<Part>,
    /// Of the parts' bytes, the share copied from this trace, in percent.
    pub copied_percent: f64,
    /// The step modelled.
    pub shape: ServingShape,
    /// Whether the failing step fits the enforced limit (absent without a failure).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_fits: Option<bool>,
    /// Whether the step before it (one chunk less context) fits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before_fits: Option<bool>,
    /// What `failure_fits` and `before_fits` rest on (absent for the whole-step model, whose
    /// answer is the config's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fits_basis: Option<FitsBasis>,
    /// The planner's answer from the config alone, when `failure_fits` rests on the traced
    /// segments: the two differ by what the run's segment placement left.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_fits_config: Option<bool>,
    /// The limit's bytes minus what the step counts against it (negative: short by).
    pub headroom: i64,
    /// Bytes the step counts against the limit.
    pub counted: u64,
    /// The parts given from the trace (not predicted).
    pub known: KnownParts,
    /// Predicted beside observed per category, with the likely cause of each difference.
    pub residuals: Residuals,
    /// The largest chunk that fits at the failing context.
    pub chunk_frontier: ChunkFrontier,
    /// The largest context that fits at the step's chunk.
    pub context_frontier: ContextFrontier,
    /// Without a failure: the model's peak beside the observed one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_fit: Option<PeakFit>,
}

/// What a planner's answer on the failing step rests on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FitsBasis {
    /// The planner's run from the config and the limit alone, its allocator replayed from an
    /// empty cache.
    Config,
    /// The planner's step from the segments and blocks PyTorch's allocator held at the step's
    /// start in the trace (copied), every tensor the step allocates predicted: on the default
    /// allocator the holes between blocks, which the driver's placement of segments decides,
    /// are the run's, not a replay's.
    TracedSegments,
}

impl FitsBasis {
    /// In words, for the report.
    pub fn words(self) -> &'static str {
        match self {
            FitsBasis::Config => "predicted from the config",
            FitsBasis::TracedSegments => {
                "its tensors predicted from the config, met with the allocator's segments and blocks the trace held at the step's start"
            }
        }
    }
}

/// The settings of the traced program the planner runs with, read from the trace: the attention
/// its frames show (`eager_attention_forward`, else transformers' default SDPA) and the
/// allocator mode `vramtrace run` recorded (`PYTORCH_CUDA_ALLOC_CONF` in `versions.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PlannerSettings {
    /// `attn_implementation`.
    pub attn_implementation: Attention,
    /// `expandable_segments:True`.
    pub expandable_segments: bool,
}

/// The whole-step model's predicted peak beside the observed one, for a run without a failure.
#[derive(Debug, Clone, Serialize)]
pub struct PeakFit {
    /// The model's peak: every part, predicted or given from the trace.
    pub predicted: u64,
    /// The observed peak: every category at the moment, `unnamed` included.
    pub observed: u64,
    /// `(predicted − observed) / observed`, in percent.
    pub difference_percent: f64,
    /// The same over the predicted parts alone (those not copied from this trace), in percent;
    /// `None` when every part was copied.
    pub predicted_parts_difference_percent: Option<f64>,
    /// Whether the prediction is within [`PEAK_TOLERANCE_PERCENT`] of the observation.
    pub within_tolerance: bool,
    /// The parts that differ most (largest |residual| first), each with its likely cause, when
    /// the prediction is off by more than the tolerance.
    pub differs: Vec<String>,
    /// What was given from the trace and what was checked, one sentence each.
    pub notes: Vec<String>,
    /// The limit the frontier is against (the card, `--capacity`, or the budget given).
    pub limit: Limit,
}

/// How close the whole-step model must come to an observed peak to be said to agree (the
/// issue's bar: 5 %).
pub const PEAK_TOLERANCE_PERCENT: f64 = 5.0;

/// One lever and what the model predicts it does.
#[derive(Debug, Clone, Serialize)]
pub struct Lever {
    /// What to change (`--max-num-batched-tokens 2048`).
    pub change: String,
    /// Whether the failing step fits with it (absent when the model cannot tell).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fits: Option<bool>,
    /// The new ceiling, in words with numbers (the largest context or chunk that fits).
    pub ceiling: String,
    /// Whether it can be turned at all (the chunk lever below vLLM's block floor cannot).
    pub feasible: bool,
}

/// Why no model could be set beside a step: what the trace does not say, or what the model
/// refused. The report prints it in place of the model's view (`model_error`).
#[derive(Debug, thiserror::Error)]
pub enum ModelViewError {
    /// Neither `--runtime` nor the trace's frames name the program.
    #[error(
        "the trace does not say which program ran the step (no engine's frames, or both vLLM's and transformers'); pass --runtime (workload, torch-prefill-script, vllm-0.20.1, transformers)"
    )]
    NoRuntime,
    /// No step was found before the failure.
    #[error(
        "the trace does not say which chunk failed (no chunk label, no step loop in the tensors' lines)"
    )]
    NoFailingStep,
    /// The step was found, not its tokens.
    #[error(
        "the trace does not say how many tokens the chunk held ({source_of_step}); pass a config whose hidden size it matches"
    )]
    NoChunkTokens {
        /// How the step was found.
        source_of_step: String,
    },
    /// No embedding output of the config's hidden size at a peak.
    #[error(
        "no embedding output of the config's hidden size is live at the peak, so the step's tokens are not known; is the config the traced model's?"
    )]
    NoPeakTokens,
    /// The model refused the shape, the limit or the config.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Reading the trace for the program's settings failed.
    #[error(transparent)]
    Trace(#[from] crate::Error),
}
