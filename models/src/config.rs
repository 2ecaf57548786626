//! Model configurations read from a HuggingFace `config.json`.

use std::path::{Path, PathBuf};

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use serde_path_to_error::Segment;

use crate::{DType, ModelError, WeightFormat};

/// Whether a decoder layer mixes tokens with full attention or with a Gated DeltaNet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    /// Softmax attention with a KV cache (`full_attention`).
    FullAttention,
    /// Gated DeltaNet linear attention with conv and recurrent state (`linear_attention`).
    LinearAttention,
}

/// The mixture-of-experts fields of a config, when the model has experts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MoeConfig {
    /// `num_experts`.
    pub num_experts: u64,
    /// `num_experts_per_tok`.
    pub num_experts_per_tok: u64,
    /// `moe_intermediate_size`.
    pub moe_intermediate_size: u64,
    /// `shared_expert_intermediate_size` (0 when absent: no shared expert).
    pub shared_expert_intermediate_size: u64,
}

/// The fields of a hybrid GDN + attention model that the memory models need.
///
/// Read with [`ModelConfig::from_path`] or [`ModelConfig::from_json`]; for multimodal configs the
/// fields come from `text_config`, falling back to the top level.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ModelConfig {
    /// Where the config was read from.
    pub path: PathBuf,
    /// `model_type` of the text model, when present.
    pub model_type: Option<String>,
    /// `num_hidden_layers`.
    pub num_hidden_layers: u64,
    /// `hidden_size`.
    pub hidden_size: u64,
    /// `vocab_size`.
    pub vocab_size: u64,
    /// `intermediate_size` of the dense MLP; `None` only for MoE models that omit it.
    pub intermediate_size: Option<u64>,
    /// `num_attention_heads` (query heads of the full-attention layers).
    pub num_attention_heads: u64,
    /// `num_key_value_heads`.
    pub num_key_value_heads: u64,
    /// `head_dim` of the full-attention layers.
    pub head_dim: u64,
    /// `linear_num_value_heads` (GDN value heads, HV); the GDN fields are 0 for a dense model,
    /// one with no GDN fields and no layer pattern, whose layers are all full attention.
    pub linear_num_value_heads: u64,
    /// `linear_num_key_heads` (GDN query/key heads, Hk).
    pub linear_num_key_heads: u64,
    /// `linear_key_head_dim` (K).
    pub linear_key_head_dim: u64,
    /// `linear_value_head_dim` (V).
    pub linear_value_head_dim: u64,
    /// `linear_conv_kernel_dim` (width of the GDN short convolution).
    pub linear_conv_kernel_dim: u64,
    /// `max_position_embeddings`: the longest sequence the model takes, when the config says.
    pub max_position_embeddings: Option<u64>,
    /// Per-layer kinds, from `layer_types` or `full_attention_interval`.
    pub layer_types: Vec<LayerKind>,
    /// The MoE fields, when `num_experts` is present.
    pub moe: Option<MoeConfig>,
    /// `torch_dtype` or `dtype`.
    pub dtype: DType,
    /// `tie_word_embeddings` (when absent, transformers' default: true for Gemma, else false).
    pub tie_word_embeddings: bool,
    /// `attn_output_gate` (true when absent from a hybrid config: Qwen3-Next and Qwen3.5 gate
    /// their attention output; false when absent from a dense one).
    pub attn_output_gate: bool,
    /// The checkpoint's `quantization_config`, when it has one.
    pub quantization: Option<Quantization>,
    /// `mamba_ssm_dtype` (Qwen3.5 checkpoints declare their recurrent state's dtype), when given.
    pub mamba_ssm_dtype: Option<DType>,
}

/// A checkpoint's `quantization_config`: its method and, where this crate can count it, the
/// storage of its linear layers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Quantization {
    /// `quant_method` as written (`gptq`, `awq`, `auto-round`, `compressed-tensors`, `fp8`, ...).
    pub method: String,
    /// The linear layers' format, or why it cannot be counted.
    pub format: Result<WeightFormat, String>,
}

/// Reads a `quantization_config`: 4-bit integer methods (GPTQ, AWQ, AutoRound, and
/// compressed-tensors' `int` weights of 4 bits) as [`WeightFormat::Int4`] with their
/// `group_size` (channelwise, `-1`, as one group per input row: 4096), FP8 (`fp8`, and
/// compressed-tensors' `float` weights of 8 bits) as [`WeightFormat::Fp8Block128`]; anything
/// else is named and refused where weights are counted.
fn quantization(v: &Value) -> Quantization {
    let method = v
        .get("quant_method")
        .and_then(Value::as_str)
        .unwrap_or("unknown")
        .to_ascii_lowercase();
    let int4 = |bits: Option<u64>, group: Option<i64>| match (bits, group) {
        (Some(4), Some(g)) if g > 0 => Ok(WeightFormat::Int4 { group: g as u64 }),
        (Some(4), Some(-1)) => Ok(WeightFormat::Int4 { group: 4096 }),
        (Some(4), None) => Ok(WeightFormat::Int4 { group: 128 }),
        (b, _) => Err(format!(
            "{} bits per weight are not counted (4-bit integer and FP8 formats are)",
            b.map_or("unknown".to_string(), |b| b.to_string())
        )),
    };
    let num = |o: &Value, k: &str| o.get(k).and_then(Value::as_u64);
    let group = |o: &Value, k: &str| o.get(k).and_then(Value::as_i64);
    let format = match method.as_str() {
        "gptq" | "awq" | "auto-round" | "autoround" | "gptq_marlin" | "awq_marlin" => {
            int4(num(v, "bits"), group(v, "group_size"))
        }
        "fp8" => Ok(WeightFormat::Fp8Block128),
        "compressed-tensors" => {
            let weights = v
                .get("config_groups")
                .and_then(Value::as_object)
                .and_then(|g| g.values().find_map(|c| c.get("weights")));
            match weights {
                Some(w)
                    if w.get("type").and_then(Value::as_str) == Some("float")
                        && num(w, "num_bits") == Some(8) =>
                {
                    Ok(WeightFormat::Fp8Block128)
                }
                Some(w) => int4(num(w, "num_bits"), group(w, "group_size")),
                None => Err("no config_groups weights to read".to_string()),
            }
        }
        other => Err(format!("the method {other:?} is not counted")),
    };
    Quantization { method, format }
}

impl ModelConfig {
    /// Reads and checks a `config.json`.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let path = path.as_ref();
        let text = read_limited(path).map_err(|source| ModelError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        // Straight from the text, so that a wrong field's error gives its line and column.
        let raw = serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_str(&text))
            .map_err(|e| field_error(path, e))?;
        Self::from_raw(raw, path)
    }

    /// Reads a parsed `config.json`; `path` is only used to name the file in errors.
    pub fn from_json(value: &Value, path: &Path) -> Result<Self, ModelError> {
        let raw = serde_path_to_error::deserialize(value).map_err(|e| field_error(path, e))?;
        Self::from_raw(raw, path)
    }

    fn from_raw(mut raw: RawFields, path: &Path) -> Result<Self, ModelError> {
        // Multimodal configs nest the text model's fields; a field there wins over the top level.
        let f = match raw.text_config.take() {
            Some(text) => text.or(raw),
            None => raw,
        };
        let missing = |field| ModelError::MissingField {
            path: path.to_path_buf(),
            field,
        };
        let num_hidden_layers = f
            .num_hidden_layers
            .ok_or_else(|| missing("num_hidden_layers"))?;
        // A dense model (Llama, Qwen3) has no GDN fields and no layer pattern: every layer is full
        // attention, and the GDN dimensions are 0.
        // transformers 5 writes `layer_types` into every saved Qwen3 config (all `full_attention`
        // without a sliding window): a list without linear attention is still dense.
        let dense = f
            .layer_types
            .as_ref()
            .is_none_or(|kinds| kinds.iter().all(|k| *k == LayerKind::FullAttention))
            && f.full_attention_interval.is_none()
            && f.linear_num_value_heads.is_none()
            && f.linear_num_key_heads.is_none()
            && f.linear_key_head_dim.is_none()
            && f.linear_value_head_dim.is_none();
        let layer_types = match f.layer_types {
            Some(kinds) if kinds.len() as u64 != num_hidden_layers => {
                return Err(ModelError::InvalidField {
                    path: path.to_path_buf(),
                    field: "layer_types".into(),
                    reason: format!(
                        "it lists {} layers but num_hidden_layers is {num_hidden_layers}",
                        kinds.len()
                    ),
                });
            }
            Some(kinds) => kinds,
            None if dense => vec![LayerKind::FullAttention; num_hidden_layers as usize],
            // transformers' `Qwen3NextConfig.__post_init__`: layer `i` is full attention when
            // `(i + 1) % full_attention_interval == 0`.
            None => {
                let interval = f
                    .full_attention_interval
                    .ok_or_else(|| missing("full_attention_interval"))?;
                (0..num_hidden_layers)
                    .map(|i| {
                        if (i + 1) % interval == 0 {
                            LayerKind::FullAttention
                        } else {
                            LayerKind::LinearAttention
                        }
                    })
                    .collect()
            }
        };
        let moe = match f.num_experts.or(f.num_local_experts) {
            Some(num_experts) => Some(MoeConfig {
                num_experts,
                num_experts_per_tok: f
                    .num_experts_per_tok
                    .ok_or_else(|| missing("num_experts_per_tok"))?,
                moe_intermediate_size: match (f.moe_intermediate_size, f.num_local_experts) {
                    (Some(m), _) => m,
                    (None, Some(_)) => f
                        .intermediate_size
                        .ok_or_else(|| missing("intermediate_size"))?,
                    (None, None) => return Err(missing("moe_intermediate_size")),
                },
                shared_expert_intermediate_size: f.shared_expert_intermediate_size.unwrap_or(0),
            }),
            None => None,
        };
        let gdn = |v: Option<u64>, field| match v {
            None if dense => Ok(0),
            v => v.ok_or_else(|| missing(field)),
        };
        if moe.is_none() && f.intermediate_size.is_none() {
            return Err(missing("intermediate_size"));
        }
        let hidden_size = f.hidden_size.ok_or_else(|| missing("hidden_size"))?;
        let num_attention_heads = f
            .num_attention_heads
            .ok_or_else(|| missing("num_attention_heads"))?;
        // transformers' default where the config is silent: the Gemma configs tie (their
        // `__init__`'s `tie_word_embeddings=True`), the others do not.
        let tied = f.tie_word_embeddings.unwrap_or_else(|| {
            f.model_type
                .as_deref()
                .is_some_and(|t| t.starts_with("gemma"))
        });
        let cfg = ModelConfig {
            path: path.to_path_buf(),
            model_type: f.model_type,
            num_hidden_layers,
            hidden_size,
            vocab_size: f.vocab_size.ok_or_else(|| missing("vocab_size"))?,
            intermediate_size: f.intermediate_size,
            num_attention_heads,
            // transformers' dense configs default the KV heads to the query heads and the head
            // dimension to `hidden_size / num_attention_heads`; the hybrid ones must say.
            num_key_value_heads: match f.num_key_value_heads {
                None if dense => num_attention_heads,
                v => v.ok_or_else(|| missing("num_key_value_heads"))?,
            },
            head_dim: match f.head_dim {
                None if dense => hidden_size / num_attention_heads,
                v => v.ok_or_else(|| missing("head_dim"))?,
            },
            linear_num_value_heads: gdn(f.linear_num_value_heads, "linear_num_value_heads")?,
            linear_num_key_heads: gdn(f.linear_num_key_heads, "linear_num_key_heads")?,
            linear_key_head_dim: gdn(f.linear_key_head_dim, "linear_key_head_dim")?,
            linear_value_head_dim: gdn(f.linear_value_head_dim, "linear_value_head_dim")?,
            linear_conv_kernel_dim: gdn(f.linear_conv_kernel_dim, "linear_conv_kernel_dim")?,
            max_position_embeddings: f.max_position_embeddings,
            layer_types,
            moe,
            // `torch_dtype` (older transformers) wins over `dtype` (newer), wherever each is.
            dtype: f
                .torch_dtype
                .or(f.dtype)
                .ok_or_else(|| missing("torch_dtype"))?,
            tie_word_embeddings: tied,
            attn_output_gate: f.attn_output_gate.unwrap_or(!dense),
            quantization: f.quantization_config.as_ref().map(quantization),
            mamba_ssm_dtype: f.mamba_ssm_dtype,
        };
        if !cfg
            .linear_num_value_heads
            .is_multiple_of(cfg.linear_num_key_heads)
        {
            return Err(ModelError::InvalidField {
                path: path.to_path_buf(),
                field: "linear_num_value_heads".into(),
                reason: format!(
                    "{} value heads are not a multiple of {} key heads, which the GDN kernels require",
                    cfg.linear_num_value_heads, cfg.linear_num_key_heads
                ),
            });
        }
        Ok(cfg)
    }

    /// How many layers are Gated DeltaNet layers.
    pub fn num_linear_layers(&self) -> u64 {
        self.layer_types
            .iter()
            .filter(|k| **k == LayerKind::LinearAttention)
            .count() as u64
    }

    /// How many layers are full-attention layers.
    pub fn num_attention_layers(&self) -> u64 {
        self.num_hidden_layers - self.num_linear_layers()
    }

    /// A short name for tables: the config's parent folder (`Qwen3.6-27B`).
    pub fn display_name(&self) -> String {
        self.path
            .parent()
            .and_then(Path::file_name)
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.path.display().to_string())
    }
}

/// The fields of one level of a `config.json` (the top level or its `text_config`) that the
/// models read. Every field may be absent (or null); which are required is decided once both
/// levels are merged. Fields not listed here are ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(default, expecting = "a JSON object of model fields")]
struct RawFields {
    /// The text model's fields of a multimodal config.
    text_config: Option<Box<RawFields>>,
    #[serde(deserialize_with = "string_or_ignore")]
    model_type: Option<String>,
    #[serde(deserialize_with = "count")]
    num_hidden_layers: Option<u64>,
    #[serde(deserialize_with = "count")]
    hidden_size: Option<u64>,
    #[serde(deserialize_with = "count")]
    vocab_size: Option<u64>,
    #[serde(deserialize_with = "count")]
    intermediate_size: Option<u64>,
    #[serde(deserialize_with = "count")]
    num_attention_heads: Option<u64>,
    #[serde(deserialize_with = "count")]
    num_key_value_heads: Option<u64>,
    #[serde(deserialize_with = "count")]
    head_dim: Option<u64>,
    #[serde(deserialize_with = "count")]
    linear_num_value_heads: Option<u64>,
    #[serde(deserialize_with = "count")]
    linear_num_key_heads: Option<u64>,
    #[serde(deserialize_with = "count")]
    linear_key_head_dim: Option<u64>,
    #[serde(deserialize_with = "count")]
    linear_value_head_dim: Option<u64>,
    #[serde(deserialize_with = "count")]
    linear_conv_kernel_dim: Option<u64>,
    layer_types: Option<Vec<LayerKind>>,
    #[serde(deserialize_with = "count")]
    full_attention_interval: Option<u64>,
    #[serde(deserialize_with = "count")]
    max_position_embeddings: Option<u64>,
    #[serde(deserialize_with = "count")]
    num_experts: Option<u64>,
    /// Mixtral's and gpt-oss's spelling of `num_experts`; their experts are `intermediate_size`
    /// wide (transformers' `MixtralConfig`).
    #[serde(deserialize_with = "count")]
    num_local_experts: Option<u64>,
    #[serde(deserialize_with = "count")]
    num_experts_per_tok: Option<u64>,
    #[serde(deserialize_with = "count")]
    moe_intermediate_size: Option<u64>,
    #[serde(deserialize_with = "count")]
    shared_expert_intermediate_size: Option<u64>,
    // Not one field with an alias: configs may carry both, and `torch_dtype` wins.
    #[serde(deserialize_with = "dtype")]
    torch_dtype: Option<DType>,
    #[serde(deserialize_with = "dtype")]
    dtype: Option<DType>,
    #[serde(deserialize_with = "flag")]
    tie_word_embeddings: Option<bool>,
    #[serde(deserialize_with = "flag")]
    attn_output_gate: Option<bool>,
    /// Kept as written: [`quantization`] reads it.
    quantization_config: Option<Value>,
    #[serde(deserialize_with = "dtype")]
    mamba_ssm_dtype: Option<DType>,
}

impl RawFields {
    /// These fields, each falling back to `other`'s where absent.
    fn or(self, other: RawFields) -> RawFields {
        RawFields {
            text_config: None,
            model_type: self.model_type.or(other.model_type),
            num_hidden_layers: self.num_hidden_layers.or(other.num_hidden_layers),
            hidden_size: self.hidden_size.or(other.hidden_size),
            vocab_size: self.vocab_size.or(other.vocab_size),
            intermediate_size: self.intermediate_size.or(other.intermediate_size),
            num_attention_heads: self.num_attention_heads.or(other.num_attention_heads),
            num_key_value_heads: self.num_key_value_heads.or(other.num_key_value_heads),
            head_dim: self.head_dim.or(other.head_dim),
            linear_num_value_heads: self.linear_num_value_heads.or(other.linear_num_value_heads),
            linear_num_key_heads: self.linear_num_key_heads.or(other.linear_num_key_heads),
            linear_key_head_dim: self.linear_key_head_dim.or(other.linear_key_head_dim),
            linear_value_head_dim: self.linear_value_head_dim.or(other.linear_value_head_dim),
            linear_conv_kernel_dim: self.linear_conv_kernel_dim.or(other.linear_conv_kernel_dim),
            layer_types: self.layer_types.or(other.layer_types),
            max_position_embeddings: self
                .max_position_embeddings
                .or(other.max_position_embeddings),
            full_attention_interval: self
                .full_attention_interval
                .or(other.full_attention_interval),
            num_experts: self.num_experts.or(other.num_experts),
            num_local_experts: self.num_local_experts.or(other.num_local_experts),
            num_experts_per_tok: self.num_experts_per_tok.or(other.num_experts_per_tok),
            moe_intermediate_size: self.moe_intermediate_size.or(other.moe_intermediate_size),
            shared_expert_intermediate_size: self
                .shared_expert_intermediate_size
                .or(other.shared_expert_intermediate_size),
            torch_dtype: self.torch_dtype.or(other.torch_dtype),
            dtype: self.dtype.or(other.dtype),
            tie_word_embeddings: self.tie_word_embeddings.or(other.tie_word_embeddings),
            attn_output_gate: self.attn_output_gate.or(other.attn_output_gate),
            quantization_config: self.quantization_config.or(other.quantization_config),
            mamba_ssm_dtype: self.mamba_ssm_dtype.or(other.mamba_ssm_dtype),
        }
    }
}

/// The largest `config.json` read (16 MiB; real ones are a few KiB).
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// Reads a config file as text: only a regular file (a FIFO would block, `/dev/zero` never
/// ends), and at most [`MAX_CONFIG_BYTES`].
fn read_limited(path: &Path) -> std::io::Result<String> {
    use std::io::{Error, ErrorKind, Read};
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "not a regular file; give the model's config.json",
        ));
    }
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(Error::new(
            ErrorKind::InvalidData,
            format!("larger than {MAX_CONFIG_BYTES} bytes; a config.json is a few KiB"),
        ));
    }
    Ok(text)
}

/// A count the models divide and multiply by: a positive whole number up to
/// [`crate::MAX_COUNT`], so products of a few of them and a token count stay exact.
fn count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    match Option::<Value>::deserialize(d)? {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|n| (1..=crate::MAX_COUNT).contains(n))
            .map(Some)
            .ok_or_else(|| {
                D::Error::custom(format!(
                    "expected a positive whole number up to {}, found {v}",
                    crate::MAX_COUNT
                ))
            }),
    }
}

/// A switch: `true` or `false`.
fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    match Option::<Value>::deserialize(d)? {
        None => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| D::Error::custom(format!("expected true or false, found {v}"))),
    }
}

/// A dtype name such as `"bfloat16"`.
fn dtype<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DType>, D::Error> {
    match Option::<Value>::deserialize(d)? {
        None => Ok(None),
        Some(Value::String(s)) => s.parse().map(Some).map_err(D::Error::custom),
        Some(v) => Err(D::Error::custom(format!(
            "it must be a string such as \"bfloat16\", found {v}"
        ))),
    }
}

/// A descriptive string the models do not depend on: anything else counts as absent.
fn string_or_ignore<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match Option::<Value>::deserialize(d)? {
        Some(Value::String(s)) => Some(s),
        _ => None,
    })
}

/// Names the field a deserialisation error is about, or says the file is not JSON at all.
fn field_error(path: &Path, e: serde_path_to_error::Error<serde_json::Error>) -> ModelError {
    let keys: Vec<String> = e
        .path()
        .iter()
        .filter_map(|segment| match segment {
            Segment::Map { key } => Some(key.clone()),
            _ => None,
        })
        .collect();
    let source = e.into_inner();
    if source.is_syntax() || source.is_eof() || source.is_io() {
        return ModelError::Json {
            path: path.to_path_buf(),
            source,
        };
    }
    let path = path.to_path_buf();
    match keys.split_last() {
        None => ModelError::InvalidField {
            path,
            field: "(top level)".into(),
            reason: format!("the file must hold a JSON object ({source})"),
        },
        Some((field, [])) => ModelError::InvalidField {
            path,
            field: field.clone(),
            reason: source.to_string(),
        },
        Some((field, parents)) => ModelError::InvalidField {
            path,
            field: field.clone(),
            reason: format!("{source} (in `{}`)", parents.join(".")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn qwen36() -> Value {
        json!({
            "architectures": ["Qwen3_5ForConditionalGeneration"],
            "text_config": {
                "num_hidden_layers": 64, "hidden_size": 5120, "vocab_size": 248320,
                "intermediate_size": 17408, "num_attention_heads": 24, "num_key_value_heads": 4,
                "head_dim": 256, "linear_num_value_heads": 48, "linear_num_key_heads": 16,
                "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                "linear_conv_kernel_dim": 4, "full_attention_interval": 4
            },
            "torch_dtype": "bfloat16"
        })
    }

    #[test]
    fn reads_text_config_and_top_level_dtype() {
        let c = ModelConfig::from_json(&qwen36(), Path::new("m/config.json")).unwrap();
        assert_eq!(c.num_linear_layers(), 48);
        assert_eq!(c.num_attention_layers(), 16);
        assert_eq!(c.layer_types[3], LayerKind::FullAttention);
        assert_eq!(c.layer_types[0], LayerKind::LinearAttention);
        assert_eq!(c.dtype, DType::BF16);
        assert_eq!(c.display_name(), "m");
    }

    #[test]
    fn missing_field_is_named_with_the_file() {
        let mut v = qwen36();
        v["text_config"]
            .as_object_mut()
            .unwrap()
            .remove("linear_num_value_heads");
        let e = ModelConfig::from_json(&v, Path::new("x/config.json")).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("`linear_num_value_heads`"), "{msg}");
        assert!(msg.contains("x/config.json"), "{msg}");
    }

    #[test]
    fn layer_pattern_missing_names_the_interval() {
        let mut v = qwen36();
        v["text_config"]
            .as_object_mut()
            .unwrap()
            .remove("full_attention_interval");
        let e = ModelConfig::from_json(&v, Path::new("c.json")).unwrap_err();
        assert!(e.to_string().contains("`full_attention_interval`"));
    }

    #[test]
    fn wrong_types_and_bad_layer_lists_are_refused() {
        let mut v = qwen36();
        v["text_config"]["head_dim"] = json!("256");
        let e = ModelConfig::from_json(&v, Path::new("c.json")).unwrap_err();
        assert!(e.to_string().contains("`head_dim`"), "{e}");

        let mut v = qwen36();
        v["text_config"]["layer_types"] = json!(["linear_attention", "full_attention"]);
        let e = ModelConfig::from_json(&v, Path::new("c.json")).unwrap_err();
        assert!(e.to_string().contains("lists 2 layers"), "{e}");

        let mut v = qwen36();
        v.as_object_mut().unwrap().remove("torch_dtype");
        let e = ModelConfig::from_json(&v, Path::new("c.json")).unwrap_err();
        assert!(e.to_string().contains("`torch_dtype`"), "{e}");

        let e = ModelConfig::from_json(&json!([1, 2]), Path::new("c.json")).unwrap_err();
        assert!(e.to_string().contains("JSON object"), "{e}");
    }

    #[test]
    fn moe_models_may_omit_the_dense_intermediate_size() {
        let mut v = qwen36();
        let t = v["text_config"].as_object_mut().unwrap();
        t.remove("intermediate_size");
        t.insert("num_experts".into(), json!(512));
        t.insert("num_experts_per_tok".into(), json!(10));
        t.insert("moe_intermediate_size".into(), json!(512));
        t.insert("shared_expert_intermediate_size".into(), json!(512));
        let c = ModelConfig::from_json(&v, Path::new("c.json")).unwrap();
        assert_eq!(c.intermediate_size, None);
        assert_eq!(c.moe.unwrap().num_experts, 512);

        let mut v = qwen36();
        v["text_config"]
            .as_object_mut()
            .unwrap()
            .remove("intermediate_size");
        let e = ModelConfig::from_json(&v, Path::new("c.json")).unwrap_err();
        assert!(e.to_string().contains("`intermediate_size`"));
    }

    #[test]
    fn text_config_wins_and_null_falls_back_to_the_top_level() {
        let mut v = qwen36();
        v["text_config"]["head_dim"] = Value::Null;
        v["head_dim"] = json!(128);
        v["text_config"]["hidden_size"] = json!(4096);
        v["hidden_size"] = json!(1);
        v["dtype"] = json!("float16");
        v["text_config"]["tie_word_embeddings"] = json!(true);
        let c = ModelConfig::from_json(&v, Path::new("c.json")).unwrap();
        assert_eq!((c.head_dim, c.hidden_size), (128, 4096));
        // torch_dtype wins over dtype wherever each sits.
        assert_eq!(c.dtype, DType::BF16);
        assert!(c.tie_word_embeddings);
        assert!(c.attn_output_gate);

        v.as_object_mut().unwrap().remove("torch_dtype");
        let c = ModelConfig::from_json(&v, Path::new("c.json")).unwrap();
        assert_eq!(c.dtype, DType::F16);

        let mut v = qwen36();
        v["text_config"] = Value::Null;
        let e = ModelConfig::from_json(&v, Path::new("c.json")).unwrap_err();
        assert!(e.to_string().contains("`num_hidden_layers`"), "{e}");
    }

    #[test]
    fn wrong_values_name_the_field_and_where_it_sits() {
        let mut v = qwen36();
        v["text_config"]["num_key_value_heads"] = json!(0);
        let e = ModelConfig::from_json(&v, Path::new("c.json")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "`num_key_value_heads` in c.json is invalid: expected a positive whole number up to 16777216, found 0 (in `text_config`)"
        );

        let mut v = qwen36();
        v["attn_output_gate"] = json!("yes");
        let e = ModelConfig::from_json(&v, Path::new("c.json")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "`attn_output_gate` in c.json is invalid: expected true or false, found \"yes\""
        );

        let mut v = qwen36();
        v["torch_dtype"] = json!(16);
        let e = ModelConfig::from_json(&v, Path::new("c.json")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("`torch_dtype` in c.json is invalid: it must be a string")
        );

        let mut v = qwen36();
        v["text_config"]["layer_types"] = json!(["linear_attention", "mamba"]);
        let e = ModelConfig::from_json(&v, Path::new("c.json")).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with("`layer_types` in c.json is invalid"),
            "{msg}"
        );
        assert!(
            msg.contains("`mamba`") && msg.contains("full_attention"),
            "{msg}"
        );

        let mut v = qwen36();
        v["text_config"] = json!("qwen");
        let e = ModelConfig::from_json(&v, Path::new("c.json")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("`text_config` in c.json is invalid"),
            "{e}"
        );
    }

    #[test]
    fn a_file_error_gives_the_line_of_the_field() {
        let dir = std::env::temp_dir().join(format!("vramtrace-cfg-line-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("config.json");
        let text = serde_json::to_string_pretty(&{
            let mut v = qwen36();
            v["text_config"]["head_dim"] = json!(-1);
            v
        })
        .unwrap();
        std::fs::write(&p, &text).unwrap();
        let e = ModelConfig::from_path(&p).unwrap_err().to_string();
        let line = text.lines().position(|l| l.contains("head_dim")).unwrap() + 1;
        assert!(e.starts_with("`head_dim` in "), "{e}");
        assert!(
            e.contains(&format!("found -1 at line {line} column")),
            "{e}"
        );
    }

    #[test]
    fn every_sample_config_reads() {
        let samples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../samples/models");
        let c = ModelConfig::from_path(samples.join("Qwen3.6-27B/config.json")).unwrap();
        assert_eq!(c.model_type.as_deref(), Some("qwen3_5_text"));
        assert_eq!((c.num_linear_layers(), c.num_attention_layers()), (48, 16));
        assert_eq!(c.intermediate_size, Some(17408));
        assert_eq!(c.moe, None);
        let c = ModelConfig::from_path(samples.join("Qwen3-Next-80B-A3B/config.json")).unwrap();
        assert_eq!(c.intermediate_size, None);
        assert_eq!(c.moe.as_ref().unwrap().num_experts, 512);
        assert_eq!(c.dtype, DType::BF16);
    }

    #[test]
    fn a_dense_config_has_only_attention_layers() {
        let v = json!({
            "model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 4096,
            "vocab_size": 151936, "intermediate_size": 12288, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "torch_dtype": "bfloat16"
        });
        let c = ModelConfig::from_json(&v, Path::new("c.json")).unwrap();
        assert_eq!((c.num_linear_layers(), c.num_attention_layers()), (0, 36));
        assert_eq!((c.linear_num_value_heads, c.linear_conv_kernel_dim), (0, 0));
        assert!(!c.attn_output_gate);
        // Llama-style: no head_dim, no KV heads.
        let mut v = v;
        let o = v.as_object_mut().unwrap();
        o.remove("head_dim");
        o.remove("num_key_value_heads");
        let c = ModelConfig::from_json(&v, Path::new("c.json")).unwrap();
        assert_eq!((c.head_dim, c.num_key_value_heads), (128, 32));
        // transformers 5 saves `layer_types` in a dense Qwen3's config: all full attention is
        // still dense (the H200's `transformers serve` model, docs/validation.md).
        v["layer_types"] = json!(vec!["full_attention"; 36]);
        let c = ModelConfig::from_json(&v, Path::new("c.json")).unwrap();
        assert_eq!((c.num_linear_layers(), c.linear_num_value_heads), (0, 0));
        // One linear-attention layer makes it hybrid, and the GDN fields are then required.
        let mut one = vec!["full_attention"; 36];
        one[0] = "linear_attention";
        v["layer_types"] = json!(one);
        let e = ModelConfig::from_json(&v, Path::new("c.json")).unwrap_err();
        assert!(
            e.to_string().contains("has no `num_key_value_heads`"),
            "{e}"
        );
        v.as_object_mut().unwrap().remove("layer_types");
        // One GDN field makes it hybrid, and the others are then required.
        v["linear_num_value_heads"] = json!(48);
        let e = ModelConfig::from_json(&v, Path::new("c.json")).unwrap_err();
        assert!(e.to_string().contains("`full_attention_interval`"), "{e}");
    }

    #[test]
    fn unreadable_and_malformed_files_are_sentences() {
        let e = ModelConfig::from_path("/nonexistent/config.json").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("cannot read /nonexistent/config.json")
        );
        let dir = std::env::temp_dir().join(format!("vramtrace-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("config.json");
        std::fs::write(&p, "{ not json").unwrap();
        let e = ModelConfig::from_path(&p).unwrap_err();
        assert!(e.to_string().contains("is not valid JSON"), "{e}");
    }
}
