//! One module per subcommand.

pub mod repair;
