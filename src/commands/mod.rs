//! One module per subcommand: its clap arguments and its action.

pub mod model;
