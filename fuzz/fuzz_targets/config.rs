//! Bytes as a `config.json`: parsed ([`ModelConfig::from_json`]) and, when accepted, every
//! variant predicted for a 4128-token prefill with its peak, KV cache, GDN state and weights.
//! Sizes must be exact or an error: no panic, no wrapped arithmetic (debug assertions are on).
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use vramtrace_models::{
    DType, ModelConfig, Variant, WeightFormat, Workload, WorkloadOptions, gdn_state_per_seq,
    kv_cache_per_token, naive_sum, peak, weight_bytes,
};

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let Ok(cfg) = ModelConfig::from_json(&value, Path::new("config.json")) else {
        return;
    };
    for tp in [1, 2] {
        let _ = kv_cache_per_token(&cfg, tp, DType::BF16);
        let _ = gdn_state_per_seq(&cfg, tp, DType::BF16, DType::F32, 2);
        for f in [WeightFormat::Bf16, WeightFormat::Fp8Block128, WeightFormat::Int4 { group: 128 }] {
            let _ = weight_bytes(&cfg, f, tp);
        }
        let opts = WorkloadOptions {
            seqlens: vec![4128, 1],
            tp,
            dtype: cfg.dtype,
            max_seqlen_k: None,
            num_sms: 132,
            l2norm_in_kernel: None,
        };
        let Ok(w) = Workload::from_config(&cfg, &opts) else {
            continue;
        };
        for v in Variant::ALL {
            if let Ok(ts) = v.tensors(&w) {
                let p = peak(&ts);
                assert!(p.bytes <= naive_sum(&ts));
            }
        }
    }
});
