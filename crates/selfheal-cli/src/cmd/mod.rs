//! One module per subcommand.

pub mod bench;
pub mod demo;
pub mod monitor;
pub mod repair;
