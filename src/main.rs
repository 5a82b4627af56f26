//! The `eventrelay` command line: parses the arguments and hands the
//! command to [`cli`], where each command family has its own file.

// The command line prints its results; nothing else in the service does.
#[allow(clippy::print_stdout, reason = "the commands' output is their result")]
mod cli;

use std::process::ExitCode;

use clap::Parser;

#[actix_web::main]
async fn main() -> ExitCode {
    let args = cli::Cli::parse();
    // `serve` logs as its configuration says, so it starts logging once the
    // configuration is read; one-off commands log with the defaults.
    if !matches!(args.command, cli::Command::Serve(_)) {
        // One-off commands keep the default filter for their whole run.
        let _filter = cli::init_logging(&eventrelay::config::LogConfig::default());
    }
    match cli::run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}
