//! The `vramtrace` command line: parse, hand off to one action per subcommand, exit with its code.

use clap::Parser;

fn main() {
    let cli = vramtrace::cli::Cli::parse();
    match vramtrace::cli::dispatch(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("vramtrace: error: {e:#}");
            std::process::exit(2);
        }
    }
}
