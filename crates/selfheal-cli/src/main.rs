//! `selfheal` — the command-line face of the selfheal control plane.
//!
//! The binary is argument parsing plus glue; the work lives in the library crates.

mod cmd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// mimalloc instead of the system allocator: the gateway parses and encodes JSON on every request,
/// and glibc's malloc/free were a third of its CPU time under load (measured with `perf`). The
/// `mimalloc` feature, on by default; off only to profile allocations (heaptrack).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Self-healing for tool-using LLM agents: a seeded fault-injection benchmark, a tool-health
/// monitor, JSON repair, an OpenAI-compatible gateway and an MCP proxy that heal any agent, and
/// the trace of what they decided.
#[derive(Parser, Debug)]
#[command(name = "selfheal", version, long_about = None, after_help = AFTER_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: boxing the largest variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Run the seeded fault-injection benchmark: eight strategies, 100 tasks, Wilson intervals.
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
    #[cfg(feature = "gateway")]
    Serve(cmd::serve::ServeArgs),
    /// Run an MCP server behind a self-healing proxy: `selfheal mcp -- COMMAND [ARGS]`.
    #[cfg(feature = "mcp")]
    Mcp(cmd::mcp::McpArgs),
    /// Read back the decisions the gateway and the MCP proxy recorded.
    #[cfg(any(feature = "gateway", feature = "mcp"))]
    #[command(
        subcommand,
        after_help = "EXAMPLES\n  selfheal trace list\n  selfheal trace show RUN\n  \
                      selfheal trace replay RUN --policy new.toml"
    )]
    Trace(cmd::trace::TraceCommand),
}

/// Commands of the full binary, with the Cargo feature each needs; a build without that feature
/// says so instead of "unrecognized subcommand".
const FEATURE_COMMANDS: [(&str, &str, bool); 3] = [
    ("serve", "gateway", cfg!(feature = "gateway")),
    ("mcp", "mcp", cfg!(feature = "mcp")),
    (
        "trace",
        "gateway or mcp",
        cfg!(any(feature = "gateway", feature = "mcp")),
    ),
];

const AFTER_HELP: &str = if cfg!(all(feature = "gateway", feature = "mcp", feature = "live")) {
    concat!(
        "EXAMPLES\n",
        "  selfheal bench                                       the fault-injection benchmark, offline\n",
        "  selfheal serve --upstream http://127.0.0.1:8080/v1   the gateway in front of a model\n",
        "  selfheal mcp -- npx -y @modelcontextprotocol/server-filesystem /srv/data\n",
        "                                                       the proxy in front of an MCP server\n\n",
        "`selfheal <command> --help` documents each command."
    )
} else {
    "EXAMPLES\n  selfheal bench      the fault-injection benchmark, offline\n\n\
     `selfheal <command> --help` documents each command.\n\n\
     This binary was built without some features (--no-default-features): `serve`, `mcp`, `trace` \
     or `bench --live` may be missing. The full binary: cargo install --path crates/selfheal-cli --locked"
};

/// The error for a command this build left out, if `arg` names one.
fn missing_command(arg: &str) -> Option<String> {
    FEATURE_COMMANDS
        .iter()
        .find(|(name, _, built)| *name == arg && !built)
        .map(|(name, feature, _)| {
            format!(
                "`selfheal {name}` is not in this build: it was built without the `{feature}` \
                 feature (e.g. with --no-default-features). Build the full binary with \
                 `cargo install --path crates/selfheal-cli --locked`."
            )
        })
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
    if let Some(msg) = std::env::args().nth(1).as_deref().and_then(missing_command) {
        eprintln!("error: {msg}");
        return ExitCode::from(2);
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => cmd::bench::run(args),
        Command::Demo(args) => cmd::demo::run(args),
        Command::Monitor(args) => cmd::monitor::run(args),
        Command::Repair(args) => cmd::repair::run(args),
        #[cfg(feature = "gateway")]
        Command::Serve(args) => cmd::serve::run(args),
        #[cfg(feature = "mcp")]
        Command::Mcp(args) => cmd::mcp::run(args),
        #[cfg(any(feature = "gateway", feature = "mcp"))]
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
