//! `vramtrace model`: placeholder until the models land.

/// Arguments of `vramtrace model`.
#[derive(clap::Args, Debug)]
pub struct ModelArgs {
    /// Path to the model's config.json.
    pub config: std::path::PathBuf,
}

/// Runs `vramtrace model`.
pub fn run(_args: ModelArgs) -> anyhow::Result<i32> {
    anyhow::bail!("vramtrace model is not implemented yet")
}
