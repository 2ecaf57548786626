//! Parsers of the values the command line takes that name something in a trace or a model (a
//! moment, a token range), here so that the binary and the fuzzers parse them the same way.

use crate::error::{Error, Result};
use crate::observe::At;

/// The latest second a window may name: about 292 years, the span of `u64` nanoseconds, so a
/// window's ends always convert to trace times exactly.
pub const MAX_WINDOW_S: f64 = 1.8e10;

fn unparsable(what: String, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Unparsable {
        what,
        source: Box::new(e),
    }
}

/// Parses `--at`: `peak`, `oom`, `oom:N` or a window `T0..T1` of seconds into the trace. A
/// window's ends must be finite, not negative and in order; anything else is an error that says
/// what to write.
pub fn parse_at(s: &str) -> Result<At> {
    if s == "peak" {
        return Ok(At::Peak);
    }
    if s == "oom" {
        return Ok(At::Failure(0));
    }
    if let Some(n) = s.strip_prefix("oom:") {
        return Ok(At::Failure(n.parse().map_err(|e| {
            unparsable(format!("--at {s}: N must be a whole number"), e)
        })?));
    }
    if let Some((a, b)) = s.split_once("..") {
        let secs = |x: &str| -> Result<f64> {
            let v: f64 = x.trim().parse().map_err(|e| {
                unparsable(format!("--at {s}: {x:?} is not a number of seconds"), e)
            })?;
            if !v.is_finite() || !(0.0..=MAX_WINDOW_S).contains(&v) {
                return Err(Error::Invalid(format!(
                    "--at {s}: {x:?} is not a time in the trace; write seconds from 0 to {MAX_WINDOW_S}, e.g. --at 1.5..2"
                )));
            }
            Ok(v)
        };
        let (a, b) = (secs(a)?, secs(b)?);
        if b < a {
            return Err(Error::Invalid(format!(
                "--at {s}: the window ends before it starts"
            )));
        }
        return Ok(At::Window(a, b));
    }
    Err(Error::Invalid(format!(
        "--at takes peak, oom, oom:N or T0..T1 (seconds), not {s:?}"
    )))
}

/// Parses `--sweep T0..T1`: whole token counts from 1 up to
/// [`vramtrace_models::MAX_TOKENS`], in order.
pub fn parse_range(s: &str) -> Result<(u64, u64)> {
    let (a, b) = s.split_once("..").ok_or_else(|| {
        Error::Invalid(format!(
            "--sweep {s:?} is not a range; write it as T0..T1, e.g. 1024..65536"
        ))
    })?;
    let a: u64 = a
        .trim()
        .parse()
        .map_err(|e| unparsable(format!("{a:?} is not a token count"), e))?;
    let b: u64 = b
        .trim()
        .parse()
        .map_err(|e| unparsable(format!("{b:?} is not a token count"), e))?;
    if a == 0 || b < a {
        return Err(Error::Invalid(format!(
            "--sweep {s:?} must go from at least 1 token up to a larger count"
        )));
    }
    if b > vramtrace_models::MAX_TOKENS {
        return Err(Error::Invalid(format!(
            "--sweep {s:?} goes past {} tokens (2^40), the most the models accept",
            vramtrace_models::MAX_TOKENS
        )));
    }
    Ok((a, b))
}
