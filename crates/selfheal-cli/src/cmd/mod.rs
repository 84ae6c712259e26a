//! One module per subcommand.

pub mod bench;
pub mod demo;
pub mod mcp;
pub mod monitor;
pub mod repair;
pub mod serve;
pub mod trace;
