//! Model configurations read from a HuggingFace `config.json`.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Map, Value};

use crate::{DType, ModelError};

/// Whether a decoder layer mixes tokens with full attention or with a Gated DeltaNet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
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
    /// `linear_num_value_heads` (GDN value heads, HV).
    pub linear_num_value_heads: u64,
    /// `linear_num_key_heads` (GDN query/key heads, Hk).
    pub linear_num_key_heads: u64,
    /// `linear_key_head_dim` (K).
    pub linear_key_head_dim: u64,
    /// `linear_value_head_dim` (V).
    pub linear_value_head_dim: u64,
    /// `linear_conv_kernel_dim` (width of the GDN short convolution).
    pub linear_conv_kernel_dim: u64,
    /// Per-layer kinds, from `layer_types` or `full_attention_interval`.
    pub layer_types: Vec<LayerKind>,
    /// The MoE fields, when `num_experts` is present.
    pub moe: Option<MoeConfig>,
    /// `torch_dtype` or `dtype`.
    pub dtype: DType,
    /// `tie_word_embeddings` (false when absent).
    pub tie_word_embeddings: bool,
    /// `attn_output_gate` (true when absent: Qwen3-Next and Qwen3.5 gate their attention output).
    pub attn_output_gate: bool,
}

impl ModelConfig {
    /// Reads and checks a `config.json`.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let value: Value = serde_json::from_str(&text).map_err(|source| ModelError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(&value, path)
    }

    /// Reads a parsed `config.json`; `path` is only used to name the file in errors.
    pub fn from_json(value: &Value, path: &Path) -> Result<Self, ModelError> {
        let top = value.as_object().ok_or_else(|| ModelError::InvalidField {
            path: path.to_path_buf(),
            field: "(top level)",
            reason: "the file must hold a JSON object".into(),
        })?;
        let text = match top.get("text_config") {
            Some(Value::Object(m)) => Some(m),
            Some(Value::Null) | None => None,
            Some(_) => {
                return Err(ModelError::InvalidField {
                    path: path.to_path_buf(),
                    field: "text_config",
                    reason: "it must be an object".into(),
                });
            }
        };
        let f = Fields { path, text, top };

        let num_hidden_layers = f.u64("num_hidden_layers")?;
        let layer_types = f.layer_types(num_hidden_layers)?;
        let moe = match f.opt_u64("num_experts")? {
            Some(num_experts) => Some(MoeConfig {
                num_experts,
                num_experts_per_tok: f.u64("num_experts_per_tok")?,
                moe_intermediate_size: f.u64("moe_intermediate_size")?,
                shared_expert_intermediate_size: f
                    .opt_u64("shared_expert_intermediate_size")?
                    .unwrap_or(0),
            }),
            None => None,
        };
        let intermediate_size = match (&moe, f.opt_u64("intermediate_size")?) {
            (_, Some(v)) => Some(v),
            (Some(_), None) => None,
            (None, None) => {
                return Err(ModelError::MissingField {
                    path: path.to_path_buf(),
                    field: "intermediate_size",
                });
            }
        };
        let dtype_field = ["torch_dtype", "dtype"]
            .into_iter()
            .find_map(|k| f.get(k).map(|v| (k, v)));
        let dtype = match dtype_field {
            Some((k, Value::String(s))) => {
                s.parse::<DType>()
                    .map_err(|reason| ModelError::InvalidField {
                        path: path.to_path_buf(),
                        field: k,
                        reason,
                    })?
            }
            Some((k, _)) => {
                return Err(ModelError::InvalidField {
                    path: path.to_path_buf(),
                    field: k,
                    reason: "it must be a string such as \"bfloat16\"".into(),
                });
            }
            None => {
                return Err(ModelError::MissingField {
                    path: path.to_path_buf(),
                    field: "torch_dtype",
                });
            }
        };
        let cfg = ModelConfig {
            path: path.to_path_buf(),
            model_type: f
                .get("model_type")
                .and_then(Value::as_str)
                .map(String::from),
            num_hidden_layers,
            hidden_size: f.u64("hidden_size")?,
            vocab_size: f.u64("vocab_size")?,
            intermediate_size,
            num_attention_heads: f.u64("num_attention_heads")?,
            num_key_value_heads: f.u64("num_key_value_heads")?,
            head_dim: f.u64("head_dim")?,
            linear_num_value_heads: f.u64("linear_num_value_heads")?,
            linear_num_key_heads: f.u64("linear_num_key_heads")?,
            linear_key_head_dim: f.u64("linear_key_head_dim")?,
            linear_value_head_dim: f.u64("linear_value_head_dim")?,
            linear_conv_kernel_dim: f.u64("linear_conv_kernel_dim")?,
            layer_types,
            moe,
            dtype,
            tie_word_embeddings: f.opt_bool("tie_word_embeddings")?.unwrap_or(false),
            attn_output_gate: f.opt_bool("attn_output_gate")?.unwrap_or(true),
        };
        if !cfg
            .linear_num_value_heads
            .is_multiple_of(cfg.linear_num_key_heads)
        {
            return Err(ModelError::InvalidField {
                path: path.to_path_buf(),
                field: "linear_num_value_heads",
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

struct Fields<'a> {
    path: &'a Path,
    text: Option<&'a Map<String, Value>>,
    top: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.text
            .and_then(|t| t.get(key))
            .filter(|v| !v.is_null())
            .or_else(|| self.top.get(key).filter(|v| !v.is_null()))
    }

    fn opt_u64(&self, key: &'static str) -> Result<Option<u64>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                v.as_u64()
                    .filter(|n| *n > 0)
                    .map(Some)
                    .ok_or_else(|| ModelError::InvalidField {
                        path: self.path.to_path_buf(),
                        field: key,
                        reason: format!("expected a positive whole number, found {v}"),
                    })
            }
        }
    }

    fn u64(&self, key: &'static str) -> Result<u64, ModelError> {
        self.opt_u64(key)?.ok_or_else(|| ModelError::MissingField {
            path: self.path.to_path_buf(),
            field: key,
        })
    }

    fn opt_bool(&self, key: &'static str) -> Result<Option<bool>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| ModelError::InvalidField {
                    path: self.path.to_path_buf(),
                    field: key,
                    reason: format!("expected true or false, found {v}"),
                }),
        }
    }

    /// `layer_types` when present; otherwise `full_attention_interval`, where layer `i` is full
    /// attention when `(i + 1) % interval == 0` (transformers' `Qwen3NextConfig.__post_init__`).
    fn layer_types(&self, layers: u64) -> Result<Vec<LayerKind>, ModelError> {
        if let Some(v) = self.get("layer_types") {
            let invalid = |reason: String| ModelError::InvalidField {
                path: self.path.to_path_buf(),
                field: "layer_types",
                reason,
            };
            let list = v
                .as_array()
                .ok_or_else(|| invalid("expected a list of layer kinds".into()))?;
            let kinds = list
                .iter()
                .map(|k| match k.as_str() {
                    Some("full_attention") => Ok(LayerKind::FullAttention),
                    Some("linear_attention") => Ok(LayerKind::LinearAttention),
                    _ => Err(invalid(format!(
                        "{k} is neither \"full_attention\" nor \"linear_attention\""
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()?;
            if kinds.len() as u64 != layers {
                return Err(invalid(format!(
                    "it lists {} layers but num_hidden_layers is {layers}",
                    kinds.len()
                )));
            }
            return Ok(kinds);
        }
        let interval =
            self.opt_u64("full_attention_interval")?
                .ok_or_else(|| ModelError::MissingField {
                    path: self.path.to_path_buf(),
                    field: "full_attention_interval",
                })?;
        Ok((0..layers)
            .map(|i| {
                if (i + 1) % interval == 0 {
                    LayerKind::FullAttention
                } else {
                    LayerKind::LinearAttention
                }
            })
            .collect())
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
