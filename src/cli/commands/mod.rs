//! One module per subcommand: its clap arguments and its action.

pub mod attach;
pub mod compare;
pub mod demo;
pub mod diff;
pub mod events;
pub mod export;
pub mod import;
pub mod live;
pub mod model;
pub mod model_engine;
pub mod model_llama;
pub mod model_step;
pub mod model_vllm;
pub mod plot;
pub mod replay;
pub mod report;
pub mod run;
pub mod snapshot;
pub mod summary;
pub mod versions;
