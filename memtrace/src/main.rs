//! memtrace's entry point: parse the command line, run, map errors to an exit
//! code with the whole error chain printed.

use std::process::ExitCode;

use clap::Parser as _;
use memtrace::{app, cli::Cli};

fn main() -> ExitCode {
    match app::run(Cli::parse()) {
        Ok(code) => code,
        // `memtrace report FILE | head`: the reader left; not an error.
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("memtrace: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
