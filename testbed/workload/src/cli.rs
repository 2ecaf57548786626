//! Command-line arguments, turned into the library's plain config structs.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use vramtrace_models::WeightFormat;
use vramtrace_workload::DType;
use vramtrace_workload::fa::{FaApi, FaConfig};
use vramtrace_workload::gdn::GdnConfig;
use vramtrace_workload::prefill::{DEFAULT_CHUNK, KvCacheMode, PrefillOptions};

/// vramtrace's reference workload: fla's gated delta rule chunk forward and
/// FlashAttention's varlen forward on real CUDA kernels, one driver allocation
/// per tensor, each named for vramtrace.
#[derive(Debug, Parser)]
#[command(name = "vramtrace-workload", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// fla 0.6.0 `chunk_gated_delta_rule` forward (gated DeltaNet prefill).
    ///
    /// Allocates, computes and frees what fla 0.6.0 does, in its order: g cumsum,
    /// A, w, u, h, final_state, v_new, o (plus the l2norm outputs and, with
    /// --seqlens, the chunk index tensors).
    Gdn(GdnArgs),
    /// FlashAttention-2 varlen forward (`_flash_attention_forward` / `flash_attn_varlen_func`).
    ///
    /// Allocates out, softmax_lse [H, total_q] (or the old padded [B, H, max_seqlen_q]
    /// with --padded-lse), rng_state and, for PyTorch, the 0-dim philox offset.
    Fa(FaArgs),
    /// Run every kernel at small sizes on the GPU for bf16, f16 and f32 and compare
    /// with the CPU references (needs a GPU and NVRTC).
    Selfcheck(SelfcheckArgs),
    /// A model-shaped chunked prefill of one prompt, from a HuggingFace config.json.
    ///
    /// First the persistent stand-ins (weights, GDN states, and with --kv-cache
    /// preallocate the KV cache), sized from the config; then the prompt in chunks
    /// of --chunk tokens through every layer in order: GDN layers run fla 0.6.0's
    /// chunk forward (carrying the layer's recurrent state from chunk to chunk),
    /// attention layers run FlashAttention over the chunk's own keys and write the
    /// chunk's K and V into the KV cache, and every layer runs an MLP stand-in
    /// that allocates what vLLM's dense MLP allocates (no GEMM is launched).
    /// FlashAttention's outputs are sized by the chunk's tokens, not by the
    /// context: what grows with the prompt is the KV cache.
    ///
    /// An allocation the device refuses ends the run with exit status 3 and a
    /// report of the tensor, the chunk, the layer and what was held.
    Prefill(PrefillArgs),
}

/// Options shared by `gdn` and `fa`.
#[derive(Debug, Args)]
pub struct Common {
    /// Make the identical allocations without compiling or launching kernels
    /// (for the stand-in driver: LD_LIBRARY_PATH=$CARGO_TARGET_DIR/debug).
    #[arg(long)]
    pub simulate: bool,
    /// Compare every tensor the kernels produced with the CPU reference and print
    /// the max abs error (exit status 1 if any is out of tolerance). Needs a GPU.
    #[arg(long, conflicts_with = "simulate")]
    pub check: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Write inputs, intermediates and outputs as raw little-endian files plus
    /// manifest.json into DIR (for scripts/validate/workload_vs_fla.py).
    #[arg(long, value_name = "DIR", conflicts_with = "simulate")]
    pub dump: Option<PathBuf>,
    /// Seed of the generated inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
}

fn parse_dtype(s: &str) -> Result<DType, String> {
    s.parse()
}

#[derive(Debug, Args)]
pub struct GdnArgs {
    /// Tokens of a single sequence, called without cu_seqlens.
    #[arg(long, conflicts_with = "seqlens", required_unless_present = "seqlens")]
    pub tokens: Option<usize>,
    /// Sequence lengths (a,b,c), called with cu_seqlens as vLLM does.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub seqlens: Option<Vec<usize>>,
    /// Value heads (fla's HV: v, g, beta and every intermediate).
    #[arg(long)]
    pub heads: usize,
    /// Query/key heads (fla's H, default --heads); --heads must be a multiple.
    #[arg(long)]
    pub key_heads: Option<usize>,
    /// Key head dimension K (at most 256).
    #[arg(long)]
    pub key_dim: usize,
    /// Value head dimension V.
    #[arg(long)]
    pub value_dim: usize,
    /// Input dtype: bf16, f16 or f32.
    #[arg(long, default_value = "bf16", value_parser = parse_dtype)]
    pub dtype: DType,
    /// Output scale (default K^-0.5).
    #[arg(long)]
    pub scale: Option<f32>,
    /// use_qk_l2norm_in_kernel=True: l2-normalise q and k inside the call.
    #[arg(long)]
    pub qk_l2norm: bool,
    /// Pass an fp32 initial_state [N, HV, K, V].
    #[arg(long)]
    pub initial_state: bool,
    #[command(flatten)]
    pub common: Common,
}

impl GdnArgs {
    pub fn config(&self) -> GdnConfig {
        let (seqlens, varlen) = match (&self.seqlens, self.tokens) {
            (Some(s), _) => (s.clone(), true),
            (None, Some(t)) => (vec![t], false),
            (None, None) => (Vec::new(), false),
        };
        GdnConfig {
            seqlens,
            varlen,
            heads: self.heads,
            key_heads: self.key_heads.unwrap_or(self.heads),
            key_dim: self.key_dim,
            value_dim: self.value_dim,
            dtype: self.dtype,
            scale: self.scale,
            qk_l2norm: self.qk_l2norm,
            initial_state: self.initial_state,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ApiArg {
    /// PyTorch's copy, torch.ops.aten._flash_attention_forward.
    Torch,
    /// Dao-AILab flash-attn's varlen_fwd.
    FlashAttn,
}

#[derive(Debug, Args)]
pub struct FaArgs {
    /// Query lengths per sequence (a,b,c).
    #[arg(long, value_delimiter = ',', num_args = 1.., required = true)]
    pub seqlens: Vec<usize>,
    /// Key lengths per sequence (default: the query lengths); longer keys model
    /// chunked prefill over a cached prefix.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub kv_seqlens: Option<Vec<usize>>,
    /// Query heads.
    #[arg(long)]
    pub heads: usize,
    /// Key/value heads (default --heads).
    #[arg(long)]
    pub kv_heads: Option<usize>,
    /// Head dimension (a multiple of 8, at most 256).
    #[arg(long)]
    pub head_dim: usize,
    /// bf16 or f16.
    #[arg(long, default_value = "bf16", value_parser = parse_dtype)]
    pub dtype: DType,
    /// Attend to every key (default: causal, aligned to the bottom right).
    #[arg(long)]
    pub no_causal: bool,
    /// Softmax scale (default head_dim^-0.5).
    #[arg(long)]
    pub scale: Option<f32>,
    /// Allocate softmax_lse in FlashAttention <= 2.5's padded layout [B, H, max_seqlen_q].
    #[arg(long)]
    pub padded_lse: bool,
    /// max_seqlen_q passed to the API (default: the longest query).
    #[arg(long)]
    pub max_seqlen_q: Option<usize>,
    /// max_seqlen_k passed to the API, like the real one (default: the longest
    /// key run); it sizes no allocation.
    #[arg(long)]
    pub max_seqlen_k: Option<usize>,
    /// Whose allocations to follow.
    #[arg(long, value_enum, default_value = "torch")]
    pub api: ApiArg,
    /// The caller passes `out` (allocated with the inputs, as vLLM does).
    #[arg(long)]
    pub preallocated_out: bool,
    #[command(flatten)]
    pub common: Common,
}

impl FaArgs {
    pub fn config(&self) -> FaConfig {
        FaConfig::new(
            &self.seqlens,
            self.heads,
            self.kv_heads.unwrap_or(self.heads),
            self.head_dim,
            self.dtype,
        )
        .with_kv_seqlens(self.kv_seqlens.as_deref().unwrap_or(&self.seqlens))
        .with_causal(!self.no_causal)
        .with_softmax_scale(self.scale)
        .with_padded_lse(self.padded_lse)
        .with_max_seqlen_q(self.max_seqlen_q)
        .with_max_seqlen_k(self.max_seqlen_k)
        .with_api(match self.api {
            ApiArg::Torch => FaApi::Torch,
            ApiArg::FlashAttn => FaApi::FlashAttn,
        })
        .with_preallocated_out(self.preallocated_out)
    }
}

fn parse_weight_format(s: &str) -> Result<WeightFormat, String> {
    s.parse()
}

fn parse_capacity(s: &str) -> Result<u64, String> {
    match vramtrace_models::units::parse_bytes(s).map_err(|e| e.to_string())? {
        0 => Err("a capacity of 0 bytes holds nothing; give e.g. 24GiB".into()),
        n => Ok(n),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KvCacheArg {
    /// A block per chunk and attention layer, allocated as the context grows
    /// (a paged allocator on demand): memory fills with the prompt.
    Grow,
    /// One block per attention layer for --kv-tokens tokens, before the first chunk.
    Preallocate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KvDtypeArg {
    /// The model's 16-bit activation dtype.
    Bf16,
    /// fp8 e4m3 (vLLM's --kv-cache-dtype fp8); a real run allocates it but does
    /// not write it (no quantising kernel).
    Fp8,
}

#[derive(Debug, Args)]
#[command(after_help = "\
Labels (range paths the preload records with every allocation):
  prefill/capacity                          the capacity ballast (real GPU with --capacity)
  prefill/weights                           embed_tokens, layer.{l}.weights, norm, lm_head
  prefill/gdn_state                         layer.{l}.conv_state, layer.{l}.ssm_state
  prefill/kv_cache                          layer.{l}.kv.chunk.{i} (grow) or layer.{l}.kv (preallocate)
  prefill/chunk.{i}/layer.{l}/gdn/...       fla 0.6.0's inputs and chunk_gated_delta_rule ranges
  prefill/chunk.{i}/layer.{l}/attention/... FlashAttention's inputs and _flash_attention_forward
  prefill/chunk.{i}/layer.{l}/mlp           gate_up, act (silu_and_mul), down

Exit status: 0 when the whole prompt was prefilled, 3 when an allocation did not fit,
2 for any other error.")]
pub struct PrefillArgs {
    /// The model's HuggingFace config.json (text_config is used for multimodal ones).
    #[arg(long, value_name = "PATH")]
    pub config: PathBuf,
    /// Tokens of the prompt (one sequence).
    #[arg(long, value_name = "N")]
    pub prompt_tokens: usize,
    /// Tokens per chunk (vLLM's --max-num-batched-tokens); the last chunk may be shorter.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_CHUNK)]
    pub chunk: usize,
    /// Storage of the weight stand-ins: bf16, fp8 or int4[:GROUP] (an estimate from the
    /// config; int4 because a 24 GiB card serves a 27B model in 4 bits).
    #[arg(long, value_name = "FORMAT", default_value = "int4", value_parser = parse_weight_format)]
    pub weights: WeightFormat,
    /// How the KV cache gets its memory.
    #[arg(long, value_enum, default_value = "grow")]
    pub kv_cache: KvCacheArg,
    /// Tokens the preallocated KV cache holds (default: the prompt).
    #[arg(long, value_name = "N")]
    pub kv_tokens: Option<usize>,
    /// KV cache element type.
    #[arg(long, value_enum, default_value = "bf16")]
    pub kv_dtype: KvDtypeArg,
    /// Device memory the run may use, like a smaller card (24GiB, 25769803776, ...).
    /// On a real GPU a ballast allocation leaves exactly this much free, so the driver
    /// itself refuses what does not fit; with --simulate the stand-in's own capacity
    /// (VRAMTRACE_FAKE_CAPACITY) limits and this is only reported.
    #[arg(long, value_name = "BYTES", value_parser = parse_capacity)]
    pub capacity: Option<u64>,
    /// Make the identical allocations without compiling or launching kernels
    /// (for the stand-in driver: LD_LIBRARY_PATH=$CARGO_TARGET_DIR/debug).
    #[arg(long)]
    pub simulate: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// With --json, list every allocation and free in order, with its label.
    #[arg(long, requires = "json")]
    pub ledger: bool,
    /// No progress line per chunk on stderr.
    #[arg(long, short)]
    pub quiet: bool,
    /// Seed of the generated inputs (real runs).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
}

impl PrefillArgs {
    pub fn options(&self) -> Result<PrefillOptions, String> {
        let kv_cache = match (self.kv_cache, self.kv_tokens) {
            (KvCacheArg::Grow, Some(_)) => {
                return Err(
                    "--kv-tokens sizes a preallocated cache; add --kv-cache preallocate".into(),
                );
            }
            (KvCacheArg::Grow, None) => KvCacheMode::Grow,
            (KvCacheArg::Preallocate, t) => KvCacheMode::Preallocate {
                tokens: t.unwrap_or(self.prompt_tokens),
            },
        };
        Ok(PrefillOptions {
            prompt_tokens: self.prompt_tokens,
            chunk: self.chunk,
            weights: self.weights,
            kv_cache,
            kv_dtype: match self.kv_dtype {
                KvDtypeArg::Bf16 => DType::BF16,
                KvDtypeArg::Fp8 => DType::F8E4M3,
            },
            seed: self.seed,
        })
    }
}

#[derive(Debug, Args)]
pub struct SelfcheckArgs {
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Only this dtype (default: bf16, f16 and f32).
    #[arg(long, value_parser = parse_dtype)]
    pub dtype: Option<DType>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn gdn_args_become_a_config() {
        let cli = Cli::try_parse_from([
            "vramtrace-workload",
            "gdn",
            "--seqlens",
            "100,64,1",
            "--heads",
            "48",
            "--key-heads",
            "16",
            "--key-dim",
            "128",
            "--value-dim",
            "128",
            "--simulate",
        ])
        .unwrap();
        let Command::Gdn(a) = cli.command else {
            panic!("not gdn")
        };
        let c = a.config();
        assert_eq!(c.seqlens, vec![100, 64, 1]);
        assert!(c.varlen);
        assert_eq!((c.heads, c.key_heads), (48, 16));
        assert_eq!(c.dtype, DType::BF16);
        assert!(a.common.simulate);
    }

    #[test]
    fn tokens_and_seqlens_conflict_and_one_is_required() {
        let base = [
            "vramtrace-workload",
            "gdn",
            "--heads",
            "4",
            "--key-dim",
            "8",
            "--value-dim",
            "8",
        ];
        assert!(Cli::try_parse_from(base).is_err());
        let mut both = base.to_vec();
        both.extend(["--tokens", "5", "--seqlens", "5"]);
        assert!(Cli::try_parse_from(both).is_err());
        let mut one = base.to_vec();
        one.extend(["--tokens", "5"]);
        let Command::Gdn(a) = Cli::try_parse_from(one).unwrap().command else {
            panic!("not gdn")
        };
        assert!(!a.config().varlen);
    }

    #[test]
    fn fa_args_become_a_config() {
        let cli = Cli::try_parse_from([
            "vramtrace-workload",
            "fa",
            "--seqlens",
            "4128",
            "--heads",
            "24",
            "--kv-heads",
            "4",
            "--head-dim",
            "256",
            "--padded-lse",
            "--max-seqlen-q",
            "262144",
            "--max-seqlen-k",
            "262144",
            "--api",
            "flash-attn",
        ])
        .unwrap();
        let Command::Fa(a) = cli.command else {
            panic!("not fa")
        };
        let c = a.config();
        assert!(c.causal && c.padded_lse);
        assert_eq!(c.lse_shape(), vec![1, 24, 262_144]);
        assert_eq!(c.max_seqlen_k(), 262_144);
        assert_eq!(c.api, FaApi::FlashAttn);
    }

    #[test]
    fn prefill_args_become_options() {
        let parse = |extra: &[&str]| {
            let mut args = vec![
                "vramtrace-workload",
                "prefill",
                "--config",
                "c.json",
                "--prompt-tokens",
                "262144",
            ];
            args.extend_from_slice(extra);
            Cli::try_parse_from(args)
        };
        let Command::Prefill(a) = parse(&["--capacity", "24GiB", "--simulate"])
            .unwrap()
            .command
        else {
            panic!("not prefill")
        };
        assert_eq!(a.capacity, Some(24 << 30));
        let o = a.options().unwrap();
        assert_eq!(o.chunk, 4128);
        assert_eq!(o.weights, WeightFormat::Int4 { group: 128 });
        assert_eq!(o.kv_cache, KvCacheMode::Grow);
        assert_eq!(o.kv_dtype, DType::BF16);

        let Command::Prefill(a) = parse(&[
            "--kv-cache",
            "preallocate",
            "--kv-dtype",
            "fp8",
            "--weights",
            "int4:64",
        ])
        .unwrap()
        .command
        else {
            panic!("not prefill")
        };
        let o = a.options().unwrap();
        assert_eq!(o.kv_cache, KvCacheMode::Preallocate { tokens: 262_144 });
        assert_eq!(o.kv_dtype, DType::F8E4M3);
        assert_eq!(o.weights, WeightFormat::Int4 { group: 64 });

        let Command::Prefill(a) = parse(&["--kv-tokens", "5"]).unwrap().command else {
            panic!("not prefill")
        };
        assert!(a.options().unwrap_err().contains("--kv-cache preallocate"));
        assert!(parse(&["--weights", "int3"]).is_err());
        assert!(parse(&["--capacity", "lots"]).is_err());
        assert!(parse(&["--ledger"]).is_err(), "--ledger needs --json");
    }

    #[test]
    fn bad_dtype_is_a_clear_error() {
        let err = Cli::try_parse_from([
            "vramtrace-workload",
            "gdn",
            "--tokens",
            "5",
            "--heads",
            "4",
            "--key-dim",
            "8",
            "--value-dim",
            "8",
            "--dtype",
            "int8",
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("expected bf16, f16 or f32"), "{err}");
    }
}
