//! One module per subcommand: its clap arguments and its action.

pub mod compare;
pub mod demo;
pub mod events;
pub mod live;
pub mod export;
pub mod model;
pub mod plot;
pub mod replay;
pub mod run;
pub mod summary;
