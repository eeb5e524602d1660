//! memtrace's entry point: parse the command line, run, map errors to an exit
//! code with the whole error chain printed.

use std::process::ExitCode;

use clap::Parser as _;
use memtrace::{app, cli::Cli};

fn main() -> ExitCode {
    match app::run(Cli::parse()) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("memtrace: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
