//! Prints the whole-step model's breakdown of one step as JSON (without the layers' tensor
//! lists), for setting beside a run's measured peak until `vramtrace model` takes it over.
//!
//! ```text
//! cargo run -p vramtrace-models --example step -- CONFIG --runtime transformers \
//!     --chunk 4128 --context 8256 [--layers 8] [--batch 1] [--tp 1] [--kv-dtype bf16] \
//!     [--block-size 1] [--weights bf16] [--capacity BYTES] [--fraction F]
//! ```
//!
//! `--layers N` keeps the config's first N layers (a shortened model built from the config, as
//! `scripts/validate/whole_step_transformers.py` runs it); `--capacity` with `--fraction` checks
//! the step against `set_per_process_memory_fraction(F)`, with `--capacity` alone against a card.

use std::process::ExitCode;

use vramtrace_models::{
    DType, KnownParts, Limit, ModelConfig, Runtime, ServingShape, StepModel, StepVariants,
};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("step: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let config = args
        .next()
        .ok_or("give a config.json first, then --runtime R --chunk T --context L")?;
    let mut opt = std::collections::BTreeMap::new();
    while let Some(k) = args.next() {
        let v = args.next().ok_or(format!("{k} needs a value"))?;
        opt.insert(k.trim_start_matches("--").to_string(), v);
    }
    let num = |k: &str, default: Option<u64>| -> Result<u64, String> {
        match opt.get(k) {
            Some(v) => v
                .parse()
                .map_err(|_| format!("--{k} {v} is not a whole number")),
            None => default.ok_or(format!("give --{k}")),
        }
    };
    let mut cfg = ModelConfig::from_path(&config).map_err(|e| e.to_string())?;
    if let Some(n) = opt.get("layers") {
        let n: usize = n
            .parse()
            .map_err(|_| format!("--layers {n} is not a number"))?;
        if n == 0 || n > cfg.layer_types.len() {
            return Err(format!(
                "--layers must be 1 to {}, not {n}",
                cfg.layer_types.len()
            ));
        }
        cfg.layer_types.truncate(n);
        cfg.num_hidden_layers = n as u64;
    }
    let runtime = opt
        .get("runtime")
        .map(String::as_str)
        .unwrap_or("transformers");
    let runtime = Runtime::from_name(runtime).ok_or_else(|| {
        let names: Vec<&str> = Runtime::ALL.iter().map(|r| r.name()).collect();
        format!(
            "--runtime {runtime} is unknown; use one of {}",
            names.join(", ")
        )
    })?;
    let mut variants = StepVariants::for_runtime(runtime, &cfg);
    if let Some(w) = opt.get("weights") {
        variants.weights = w.parse()?;
    }
    let mut shape = ServingShape::prefill(&cfg, num("chunk", None)?, num("context", None)?);
    shape.batch = num("batch", Some(1))?;
    shape.tp = num("tp", Some(1))?;
    shape.block_size = num("block-size", Some(1))?;
    if let Some(d) = opt.get("kv-dtype") {
        shape.kv_dtype = d.parse::<DType>()?;
    }
    let model = StepModel::new(cfg, variants, KnownParts::default());
    let step = match opt.get("capacity") {
        Some(c) => {
            let capacity = vramtrace_models::units::parse_bytes(c).map_err(|e| e.to_string())?;
            let limit = match opt.get("fraction") {
                Some(f) => Limit::PerProcessFraction {
                    capacity,
                    fraction: f
                        .parse()
                        .map_err(|_| format!("--fraction {f} is not a number"))?,
                },
                None => Limit::Card { capacity },
            };
            model.check(&shape, &limit)
        }
        None => model.step(&shape),
    }
    .map_err(|e| e.to_string())?;
    let mut json = serde_json::to_value(&step).map_err(|e| e.to_string())?;
    // The tensor lists are long; keep each layer's kind, bytes and live tensors' names.
    let strip = |l: &mut serde_json::Value| {
        let names: Vec<serde_json::Value> = l["live"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| l["tensors"][i.as_u64()? as usize]["name"].as_str())
            .map(|n| n.into())
            .collect();
        l["live"] = names.into();
        l.as_object_mut().map(|o| o.remove("tensors"));
    };
    strip(&mut json["activations"]);
    for l in json["layers"].as_array_mut().into_iter().flatten() {
        strip(l);
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?
    );
    Ok(())
}
