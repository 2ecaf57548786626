//! The command-line surface: one clap `Args` struct per subcommand, each owned by its module
//! under `commands/`, which turns it into plain options before calling the library.

use clap::{Parser, Subcommand};

use crate::commands;

/// GPU memory profiler: records every device allocation the CUDA driver sees, attributes peaks
/// and out-of-memory failures to named tensors, and compares them with analytical models.
#[derive(Parser, Debug)]
#[command(name = "vramtrace", version, about, long_about = None)]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Record a model-shaped prefill until it runs out of memory, and attribute the failure.
    Demo(commands::demo::DemoArgs),
    /// Run a program with the recorder preloaded, then summarise what it allocated.
    Run(commands::run::RunArgs),
    /// Print every recorded event as one JSON object per line, in time order.
    Events(commands::events::EventsArgs),
    /// Peaks, the allocations live at each peak, and every failed allocation.
    Summary(commands::summary::SummaryArgs),
    /// Set a model's predicted tensors beside what a trace shows at a peak or a failure.
    Compare(commands::compare::CompareArgs),
    /// Predict a kernel's tensors and peak from a model's config.json.
    Model(Box<commands::model::ModelArgs>),
    /// Replay a trace against a smaller card: the first allocation that would fail, and the
    /// headroom over time.
    Replay(commands::replay::ReplayArgs),
    /// Watch a trace directory live (or replay a finished one) in the terminal.
    Live(commands::live::LiveArgs),
    /// Draw a timeline, breakdown or cliff plot as PNG or SVG.
    Plot(commands::plot::PlotArgs),
    /// Write a trace as Parquet tables, a PyTorch memory snapshot, Perfetto JSON or a flamegraph.
    Export(commands::export::ExportArgs),
    /// A Markdown (or HTML) report to paste into a bug report: what failed, where, why, what
    /// to change, then every peak, failure and process in full.
    Report(commands::report::ReportArgs),
    /// Peak and live-set differences between two traces, by label and by stack.
    Diff(commands::diff::DiffArgs),
    /// Turn a PyTorch memory snapshot pickle into a trace directory.
    Import(commands::import::ImportArgs),
    /// Ask a traced process to write its live tensors, with their stacks, into its trace now.
    Snapshot(commands::snapshot::SnapshotArgs),
    /// Record in a running CUDA program (by pid) until Ctrl-C or --duration, then detach.
    Attach(commands::attach::AttachArgs),
}

/// Runs the chosen subcommand and returns the process exit code.
pub fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Demo(a) => commands::demo::run(a),
        Command::Run(a) => commands::run::run(a),
        Command::Events(a) => commands::events::run(a),
        Command::Summary(a) => commands::summary::run(a),
        Command::Model(a) => commands::model::run(*a),
        Command::Compare(a) => commands::compare::run(a),
        Command::Replay(a) => commands::replay::run(a),
        Command::Live(a) => commands::live::run(a),
        Command::Plot(a) => commands::plot::run(a),
        Command::Export(a) => commands::export::run(a),
        Command::Report(a) => commands::report::run(a),
        Command::Import(a) => commands::import::run(a),
        Command::Diff(a) => commands::diff::run(a),
        Command::Snapshot(a) => commands::snapshot::run(a),
        Command::Attach(a) => commands::attach::run(a),
    }
}
