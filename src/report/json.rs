//! `vramtrace report --json`: the same content as the Markdown's first screen and its tables,
//! as one JSON object. The keys a tool may rely on: `verdict.class` (one of
//! [`crate::report::triage::VerdictClass::key`]), `categories` (`{category, bytes, evidence}` at
//! the first failure, else the highest peak) and `model.failure_fits` (absent without a failure
//! or a model) and `growth` (`verdict`, `rate_bytes_per_hour`, `lines`: see
//! [`crate::growth::Growth`]).

use serde_json::{Value, json};

use crate::report::Report;

/// The report as one JSON object.
pub fn render(r: &Report) -> Value {
    let failure = r.first_failure().map(|f| {
        let p = &r.summary.processes[f.process];
        json!({
            "pid": p.pid,
            "ppid": p.ppid,
            "command": p.command,
            "device": f.device,
            "t_s": f.failure.t_s,
            "api": f.failure.api,
            "bytes": f.failure.size,
            "error": f.failure.error,
            "free_bytes": f.failure.free_bytes,
            "total_bytes": f.failure.total_bytes,
            "label": f.failure.label,
            "frames": f.frames,
        })
    });
    let mut out = json!({
        "title": r.title,
        "failures": r.failures.len(),
        "failure": failure,
        "versions": r.versions.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect::<serde_json::Map<_, _>>(),
    });
    let o = out.as_object_mut().expect("an object");
    if let Some(g) = &r.summary.growth
        && let Ok(v) = serde_json::to_value(g)
    {
        o.insert("growth".into(), v);
    }
    match &r.llama_cpp {
        Some(Ok(v)) => {
            if let Ok(v) = serde_json::to_value(v) {
                o.insert("llama_cpp".into(), v);
            }
        }
        Some(Err(e)) => {
            o.insert("llama_cpp".into(), json!({ "error": e }));
        }
        None => {}
    }
    match &r.triage {
        Some(t) => {
            if let Ok(Value::Object(m)) = serde_json::to_value(t) {
                o.extend(m);
            }
        }
        None => {
            o.insert(
                "error".into(),
                Value::String(
                    r.triage_error
                        .clone()
                        .unwrap_or_else(|| "no triage".to_string()),
                ),
            );
        }
    }
    out
}
