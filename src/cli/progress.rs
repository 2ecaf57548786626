//! Progress of a long export on stderr: a spinner with the count of items read, drawn only
//! when stderr is a terminal (never into a log or a pipe).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use vramtrace::export::{Progress, ProgressSink};

struct Spinner(ProgressBar);

impl ProgressSink for Spinner {
    fn inc(&self, n: u64) {
        self.0.inc(n);
    }

    fn pass(&self, what: &str) {
        self.0.set_message(what.to_string());
        self.0.set_position(0);
    }

    fn finish(&self) {
        self.0.finish_and_clear();
    }
}

/// A spinner on stderr named `what`, or nothing when stderr is not a terminal.
pub fn stderr(what: &str) -> Progress {
    if !std::io::stderr().is_terminal() {
        return Progress::hidden();
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} {msg}: {human_pos} items ({per_sec}) {elapsed}")
    {
        bar.set_style(style);
    }
    bar.set_message(what.to_string());
    Progress::to(Box::new(Spinner(bar)))
}
