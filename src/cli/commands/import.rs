//! `vramtrace import`: a PyTorch memory snapshot pickle as a trace directory.

use std::path::PathBuf;

/// Arguments of `vramtrace import`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Reads the pickle `torch.cuda.memory._snapshot()` returns (as saved by\n`torch.cuda.memory._dump_snapshot` or pickle.dump) without running anything in it: segments\nbecome driver allocations, blocks tensors with their Python frames, `oom` entries failed\nallocations. Then: vramtrace summary DIR, vramtrace report DIR, vramtrace compare DIR ..."
)]
pub struct ImportArgs {
    /// The snapshot pickle.
    pub snapshot: PathBuf,
    /// The trace directory to write (created if needed).
    #[arg(short, long)]
    pub out: PathBuf,
    /// The process id to give the imported process (a snapshot does not record one).
    #[arg(long, default_value_t = 1)]
    pub pid: u32,
}

/// Runs `vramtrace import`.
pub fn run(args: ImportArgs) -> anyhow::Result<i32> {
    let (path, n) = vramtrace::import::import(&args.snapshot, &args.out, args.pid)?;
    eprintln!(
        "vramtrace: imported {}: {} segment(s), {} tensor allocation(s), {} free(s), {} out-of-memory entr{} on {} device(s) into {}",
        args.snapshot.display(),
        n.segments,
        n.tensors,
        n.frees,
        n.ooms,
        if n.ooms == 1 { "y" } else { "ies" },
        n.devices,
        path.display()
    );
    Ok(0)
}
