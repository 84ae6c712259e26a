//! `selfheal` — the command-line face of the selfheal control plane.
//!
//! The binary is argument parsing plus glue; the work lives in the library crates.

mod cmd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// mimalloc instead of the system allocator: the gateway parses and encodes JSON on every request,
/// and glibc's malloc/free were a third of its CPU time under load (measured with `perf`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Self-healing for tool-using LLM agents.
#[derive(Parser, Debug)]
#[command(name = "selfheal", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the seeded fault-injection benchmark: five strategies, 100 tasks, Wilson intervals.
    Bench(cmd::bench::BenchArgs),
    /// Replay the three stuck agents of seed 000 without and with the tool-health monitor.
    Demo(cmd::demo::DemoArgs),
    /// Run the tool-health monitor as a sidecar: JSON Lines tool calls on stdin, verdicts on
    /// stdout.
    Monitor(cmd::monitor::MonitorArgs),
    /// Repair almost-JSON from stdin (prose, code fences, trailing commas, truncation...) and
    /// optionally check it against a JSON Schema.
    Repair(cmd::repair::RepairArgs),
    /// Serve the OpenAI-compatible gateway that heals any agent pointed at it.
    Serve(cmd::serve::ServeArgs),
    /// Run an MCP server behind a self-healing proxy: `selfheal mcp -- COMMAND [ARGS]`.
    Mcp(cmd::mcp::McpArgs),
    /// Read back the decisions the gateway recorded.
    #[command(subcommand)]
    Trace(cmd::trace::TraceCommand),
}

/// A reader that closes the pipe early (`selfheal bench | head`) makes `print!` panic with
/// "failed printing to stdout: Broken pipe". That is not an error of ours: end quietly with the
/// status a shell gives a process killed by SIGPIPE (128 + 13), as C tools do.
fn quiet_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.contains("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

fn main() -> ExitCode {
    quiet_broken_pipe();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => cmd::bench::run(args),
        Command::Demo(args) => cmd::demo::run(args),
        Command::Monitor(args) => cmd::monitor::run(args),
        Command::Repair(args) => cmd::repair::run(args),
        Command::Serve(args) => cmd::serve::run(args),
        Command::Mcp(args) => cmd::mcp::run(args),
        Command::Trace(command) => cmd::trace::run(command),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}
